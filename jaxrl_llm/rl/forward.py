"""The update's log-prob forwards, in two batch layouts (rl/layout.py builds them).

`rows`: every row is prompt + response [N, L]; the whole row goes through the model and the head.
This is the plain reference form (and SFT's).

`shared`: each group's context (prompt, or prompt + a replayed prefix) is encoded once; rows carry
only their own tokens. The contexts run through the model returning their keys and values; each
row takes its context's (a gather, so gradients from all its rows flow back into the one context)
and runs its tokens at positions ctx_len + i, attending to the context's keys (its padding slots
masked by position) and to its own causal suffix, with the positions, RoPE and masks of the plain
forward over context + row. The first token's
log-prob comes from the context's last hidden state. The head and log-softmax run only on the
rows' positions, in checkpointed chunks, so [rows, length, vocab] float32 logits never exist whole.

Shapes: G contexts, Lc context slots, R rows, Ls row tokens, D width, V vocabulary.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jaxrl_llm.model.transformer import KVCache, Transformer
from jaxrl_llm.rl.batch import SharedBatch
from jaxrl_llm.rl.losses import token_logprobs


def cast_floats(tree, dtype):
    return jax.tree.map(lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, tree)


def merged_model(graphdef, params, compute_dtype: str) -> Transformer:
    return nnx.merge(graphdef, cast_floats(params, jnp.dtype(compute_dtype)))


def rows_logp(model: Transformer, tokens_NL, temperature_N, lora_key=None):
    """Tempered log-prob [N, L-1] of tokens[:, 1:] given the tokens before them. `lora_key`: LoRA dropout's
    key in a training forward (None: no dropout)."""
    inputs = tokens_NL[:, :-1]
    positions = jnp.broadcast_to(jnp.arange(inputs.shape[1]), inputs.shape)
    hidden, _ = model(inputs, positions, lora_key=lora_key)
    return token_logprobs(model.logits(hidden), tokens_NL[:, 1:], temperature_N)


def chunked_logp(hidden_RLD, head_DV, targets_RL, temperature_R, chunk: int):
    """token_logprobs(hidden @ head) computed `chunk` positions at a time; each chunk's logits are
    recomputed in the backward pass instead of stored. Rows no longer than one chunk take the plain
    path (nothing to gain from recomputing)."""
    r, length, d = hidden_RLD.shape
    if length <= chunk:
        return token_logprobs(jnp.matmul(hidden_RLD, head_DV, preferred_element_type=jnp.float32), targets_RL,
                              temperature_R)
    if length % chunk:
        raise ValueError(f"logit chunk {chunk} does not divide the row length {length}")
    n = length // chunk

    @jax.checkpoint
    def one(h_RCD, t_RC, head):
        logits = jnp.matmul(h_RCD, head, preferred_element_type=jnp.float32)
        return token_logprobs(logits, t_RC, temperature_R)

    h = hidden_RLD.reshape(r, n, chunk, d).swapaxes(0, 1)
    t = targets_RL.reshape(r, n, chunk).swapaxes(0, 1)
    out = jax.lax.map(lambda xs: one(xs[0], xs[1], head_DV), (h, t))  # [n, R, chunk]
    return out.swapaxes(0, 1).reshape(r, length)


def shared_logp(model: Transformer, mb: SharedBatch, *, chunk: int = 32, lora_key=None):
    """Tempered log-prob [R, Ls] of each row's tokens (position ctx_len + i for token i) given its
    context and the row's tokens before it.

    mb: one micro-batch of a SharedBatch: ctx_tokens [G, Lc], ctx_len [G], tokens [R, Ls], row_ctx [R]
    (index into the contexts), temperature [R]. `lora_key`: LoRA dropout's key in a training forward (None:
    no dropout; the contexts and the rows draw their masks from keys folded with 0 and 1)."""
    ctx_key, row_key = (None, None) if lora_key is None else (jax.random.fold_in(lora_key, 0),
                                                                jax.random.fold_in(lora_key, 1))
    ctx_tokens, ctx_len, tokens, row_ctx = mb.ctx_tokens, mb.ctx_len, mb.tokens, mb.row_ctx
    g, lc = ctx_tokens.shape
    r, ls = tokens.shape
    slots = jnp.arange(lc)
    ctx_hidden, ctx_kv = model(ctx_tokens, jnp.broadcast_to(slots, (g, lc)), return_kv=True, lora_key=ctx_key)
    row_len = ctx_len[row_ctx]  # [R]
    first_hidden = ctx_hidden[row_ctx, row_len - 1]  # [R, D]: predicts each row's first token
    if ls > 1:
        # the context's padding slots get a position no query reaches
        prefix_pos = jnp.where(slots[None, :] < row_len[:, None], slots[None, :], jnp.iinfo(jnp.int32).max)
        prefix = (KVCache([k[row_ctx] for k in ctx_kv.keys], [v[row_ctx] for v in ctx_kv.values]), prefix_pos)
        positions = row_len[:, None] + jnp.arange(ls - 1)[None, :]
        row_hidden, _ = model(tokens[:, :-1], positions, prefix=prefix, lora_key=row_key)
        hidden = jnp.concatenate([first_hidden[:, None], row_hidden], axis=1)
    else:
        hidden = first_hidden[:, None]
    return chunked_logp(hidden, model.head(), tokens, mb.temperature, chunk)
