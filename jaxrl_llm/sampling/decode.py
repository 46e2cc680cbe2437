"""The pieces both decode drivers share: prefill, the cache's levels, and one decode step of a batch of rows.

Two drivers run them: sampler.py's one-call program (every row of a call decodes together until the last has
finished) and slots.py's host-driven slots (finished rows leave, waiting rows take their place). A row's token t
is drawn with the key `fold_in(row_key, t)` (t counts the row's own generated tokens), so a row samples the same
tokens whichever batch, slot or step it decodes in.

Shapes in names: B rows, L the token buffer (context + new tokens, a bucket), S cache slots (a level <= L),
V vocabulary, U distinct contexts, P their prefill length.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm.model.transformer import KVCache, Transformer
from jaxrl_llm.sampling.processors import choose_tokens

FINISH_STOP = 0  # a stop token was generated (it is kept in the response)
FINISH_LENGTH = 1  # the row's max_new_tokens (or the cache) ran out


class RowState(NamedTuple):
    """What decoding carries per row."""

    tokens: jax.Array  # [B, L] int32: context, generated tokens, pad
    logp: jax.Array  # [B, L] float32: tempered log-probs at generated positions
    ent: jax.Array  # [B, L] float32: tempered entropies at generated positions
    cache: KVCache  # [B, ..., S]: slot = position
    logits: jax.Array  # [B, V] float32: the next token's logits
    pos: jax.Array  # [B] int32: where the next token goes (a finished row: its last token's slot)
    count: jax.Array  # [B] int32: tokens generated
    done: jax.Array  # [B] bool
    reason: jax.Array  # [B] int32: FINISH_STOP / FINISH_LENGTH


class RowSettings(NamedTuple):
    """Each row's sampling settings (traced: new values never recompile)."""

    max_new: jax.Array  # [B] int32
    temperature: jax.Array  # [B] float32 (<= 0: greedy)
    top_p: jax.Array  # [B] float32
    top_k: jax.Array  # [B] int32
    keys: jax.Array  # [B, ...] raw key data of each row's key


def cache_dtype(dtype, platform: str | None = None):
    """The KV cache's dtype for weights of `dtype` on `platform` (default: jax's default backend): theirs, but
    float32 on CPU. XLA:CPU has no native bf16 batched dot or scatter: a bf16 cache is converted to float32 at
    every layer of every decode step. A float32 cache holds the same bf16-rounded keys and values (the model
    rounds them before they are written, and rounds attention's probabilities to the compute dtype), so the
    sampler computes the trainer's numbers either way; it costs twice the cache memory, which a CPU has."""
    platform = platform or jax.default_backend()
    return jnp.dtype(jnp.float32) if platform == "cpu" else jnp.dtype(dtype)


def distinct_contexts(contexts, share: bool) -> tuple[list[int], list[tuple[int, ...]]]:
    """(each row's index into the contexts to prefill, those contexts): every distinct context once, in order of
    first appearance, or (share False) every row its own."""
    if not share:
        return list(range(len(contexts))), list(contexts)
    index: dict[tuple[int, ...], int] = {}
    source = [index.setdefault(c, len(index)) for c in contexts]
    return source, list(index)


def prefill_table(contexts, rows: int, prefill_len: int, pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Host inputs of `prefill` for these contexts: tokens [rows, P] and lengths [rows], padding rows (one pad
    token) after them."""
    tokens = np.full((rows, prefill_len), pad_id, np.int32)
    lengths = np.ones((rows,), np.int32)
    for j, c in enumerate(contexts):
        tokens[j, :len(c)] = c
        lengths[j] = len(c)
    return tokens, lengths


def prefill(model: Transformer, tokens_UP, context_len_U):
    """Encode U contexts of (bucketed) length P. Returns their cache [U, ..., P] (slots = positions
    0..P-1) and float32 logits [U, V] at each context's last position."""
    n, length = tokens_UP.shape
    # keys and values are rounded to the weights' dtype (bf16 weights cast for sampling in the compute dtype give
    # bf16 keys) as the trainer's forward rounds them, and kept in the cache_dtype
    cache = KVCache.zeros(model.cfg, n, length, dtype=cache_dtype(model.embed[...].dtype))
    positions = jnp.broadcast_to(jnp.arange(length), (n, length))
    hidden, cache = model(tokens_UP, positions, cache)
    return cache, model.logits(hidden[jnp.arange(n), context_len_U - 1])


def decode_levels(prefill_len: int, slots: int, first_level: int) -> list[int]:
    """Cache lengths decode grows through: prefill + first_level, + 2 x first_level, ..., slots."""
    levels, n = [], first_level
    while first_level > 0 and prefill_len + n < slots:
        levels.append(prefill_len + n)
        n *= 2
    return levels + [slots]


def pad_cache(cache: KVCache, slots: int) -> KVCache:
    """The same cache with zero slots appended up to `slots`."""
    extra = slots - cache.slots
    return KVCache([jnp.pad(k, ((0, 0), (0, 0), (0, 0), (0, extra))) for k in cache.keys],
                   [jnp.pad(v, ((0, 0), (0, 0), (0, extra), (0, 0))) for v in cache.values])


def resize_cache(cache: KVCache, slots: int) -> KVCache:
    """The cache's first `slots` slots, zero-padded where it holds fewer."""
    if slots >= cache.slots:
        return pad_cache(cache, slots)
    return KVCache([k[..., :slots] for k in cache.keys], [v[:, :, :slots] for v in cache.values])


def expand_cache(cache: KVCache, row_source_B, slots: int) -> KVCache:
    """Row b of the result is row `row_source_B[b]` of `cache`, slots padded with zeros up to `slots`."""
    def take(x, slot_axis):
        x = x[row_source_B]
        pad = [(0, 0)] * x.ndim
        pad[slot_axis] = (0, slots - x.shape[slot_axis])
        return jnp.pad(x, pad)

    return KVCache([take(k, 3) for k in cache.keys], [take(v, 2) for v in cache.values])


def live_end(rows: RowState):
    """The highest slot a live row writes next (0 when none is live): it must lie inside the cache."""
    return jnp.max(jnp.where(rows.done, 0, rows.pos))


def decode_step(model: Transformer, settings: RowSettings, stop_ids_K, rows: RowState) -> RowState:
    """One token for every live row: choose it from the row's logits, record it, run it through the model into
    the cache. Finished rows keep what they hold (their model input is written at slot 0 and never read)."""
    batch, buffer = rows.tokens.shape
    idx = jnp.arange(batch)
    keys = jax.vmap(jax.random.fold_in)(jax.random.wrap_key_data(settings.keys), rows.count)
    tok, lp, ent = choose_tokens(rows.logits, settings.temperature, settings.top_p, settings.top_k, keys)
    active = ~rows.done
    tokens = rows.tokens.at[idx, rows.pos].set(jnp.where(active, tok, rows.tokens[idx, rows.pos]))
    logp = rows.logp.at[idx, rows.pos].set(jnp.where(active, lp, rows.logp[idx, rows.pos]))
    ents = rows.ent.at[idx, rows.pos].set(jnp.where(active, ent, rows.ent[idx, rows.pos]))
    count = rows.count + active
    stopped = jnp.any(tok[:, None] == stop_ids_K[None, :], axis=-1)
    out_of_room = (count >= settings.max_new) | (rows.pos + 1 >= buffer)
    finishing = active & (stopped | out_of_room)
    reason = jnp.where(finishing, jnp.where(stopped, FINISH_STOP, FINISH_LENGTH), rows.reason)
    done = rows.done | finishing
    hidden, cache = model(tok[:, None], jnp.where(done, 0, rows.pos)[:, None], rows.cache)
    pos = jnp.where(done, rows.pos, rows.pos + 1)
    return RowState(tokens, logp, ents, cache, model.logits(hidden[:, 0]), pos, count, done, reason)
