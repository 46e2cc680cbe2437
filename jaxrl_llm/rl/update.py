"""The jitted, sharded policy update: one optimizer step over a (mini)batch of rollout rows.

`make_update(...)` builds one `jax.jit` with explicit in/out shardings and donated parameters and
optimizer state. Inside, micro-batches are a `lax.scan` that sums gradients (losses are normalised
batch-wide, so accumulation is exact); a non-finite loss or gradient leaves the state unchanged
and is reported. Loss coefficients and the learning rate are traced values, never constants.

Batches are rl/batch.py pytrees in two layouts (rl/layout.py, rl/forward.py): `rows` (RowBatch),
[N, L] prompt + response per row, and `shared` (SharedBatch), each context once per micro-batch
with rows carrying only their own tokens.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxrl_llm.model import lora
from jaxrl_llm.parallel import hosts
from jaxrl_llm.parallel.rules import row_sharding, spec_for
from jaxrl_llm.rl.forward import merged_model, rows_logp, shared_logp
from jaxrl_llm.rl.batch import RowBatch, SharedBatch
from jaxrl_llm.rl.losses import aggregate, clipped_token_loss, hindsight_token_loss, kl_penalty


@dataclasses.dataclass(frozen=True)
class UpdateSpec:
    """What changes the program (static)."""

    mode: str = "rl"  # rl: clipped policy gradient; sft: negative log-likelihood of masked tokens
    loss_agg: str = "token-mean"
    kl_estimator: str = "k3"
    use_kl: bool = False
    micro_batches: int = 1  # rows layout: slices per batch (the shared layout arrives cut)
    compute_dtype: str = "float32"
    layout: str = "rows"  # rows | shared (rl/layout.py)
    logit_chunk: int = 32  # shared layout: positions per chunk of the head and log-softmax


def lr_schedule(lr: float, *, warmup_steps: int = 0, schedule: str = "constant", total_steps: int = 1):
    """Learning rate of update number `count` (0-based). Warmup is linear from lr / warmup_steps, so
    the first update already learns (a schedule from 0 would waste it); cosine decays to 0 at
    `total_steps` after the warmup."""
    warm = max(int(warmup_steps), 0)
    decay = max(int(total_steps) - warm, 1)

    def rate(count):
        count = jnp.asarray(count, jnp.float32)
        factor = jnp.minimum(1.0, (count + 1.0) / warm) if warm else jnp.float32(1.0)
        if schedule == "cosine":
            progress = jnp.clip((count - warm) / decay, 0.0, 1.0)
            factor = factor * 0.5 * (1.0 + jnp.cos(jnp.pi * progress))
        elif schedule != "constant":
            raise ValueError(f"unknown schedule {schedule!r}; choose from ('constant', 'cosine')")
        return lr * factor

    return rate


def make_optimizer(lr: float, *, warmup_steps: int = 0, schedule: str = "constant", total_steps: int = 1,
                   weight_decay: float = 0.0, b1: float = 0.9, b2: float = 0.999, max_grad_norm: float = 1.0):
    sched = lr_schedule(lr, warmup_steps=warmup_steps, schedule=schedule, total_steps=total_steps)
    return optax.chain(optax.clip_by_global_norm(max_grad_norm),
                       optax.inject_hyperparams(optax.adamw)(learning_rate=sched, b1=b1, b2=b2,
                                                             weight_decay=weight_decay))


def current_lr(opt_state) -> jax.Array:
    """The learning rate held by an `optax.inject_hyperparams` state inside `opt_state` (NaN if none).
    inject_hyperparams stores the rate an update used in the state that update returns."""
    for node in jax.tree.leaves(opt_state, is_leaf=lambda x: hasattr(x, "hyperparams")):
        if hasattr(node, "hyperparams"):
            return node.hyperparams["learning_rate"]
    return jnp.float32(jnp.nan)


def _split_micro(x, m: int):
    """[N, ...] -> [m, N/m, ...] taking rows i, i+m, ...: every slice spans all data shards."""
    return x.reshape(x.shape[0] // m, m, *x.shape[1:]).swapaxes(0, 1)


def _logp_mask_old(graphdef, spec: UpdateSpec, params, mb, lora_key=None):
    """(log-prob, loss mask, old log-prob) at the positions of the tokens they score, [rows, length].
    `lora_key`: LoRA dropout's key (the policy's training forward; the reference's passes none)."""
    model = merged_model(graphdef, params, spec.compute_dtype)
    if spec.layout == "shared":
        return (shared_logp(model, mb, chunk=spec.logit_chunk, lora_key=lora_key), mb.loss_mask & mb.valid[:, None],
                mb.old_logp)
    return (rows_logp(model, mb.tokens, mb.temperature, lora_key), mb.loss_mask[:, 1:] & mb.valid[:, None],
            mb.old_logp[:, 1:])


def _loss_terms(graphdef, spec: UpdateSpec, params, ref_params, mb, coefs, norms, lora_key=None):
    logp, mask, old = _logp_mask_old(graphdef, spec, params, mb, lora_key)
    maskf = mask.astype(jnp.float32)
    if spec.mode == "sft":
        loss_tok = -logp
        low = high = dual = jnp.zeros_like(mask)
        gap = jnp.zeros(())
    else:
        loss_tok, low, high, dual = clipped_token_loss(logp, old, mb.advantages, eps_low=coefs["eps_low"],
                                                       eps_high=coefs["eps_high"], dual_clip=coefs["dual_clip"])
        # HeRL revision rows: the hindsight weight instead of the clipped ratio (a per-row flag, one program)
        revision = mb.hindsight[:, None]
        hindsight = hindsight_token_loss(logp, old, mb.advantages, coefs.get("hindsight_gamma", 1.0))
        loss_tok = jnp.where(revision, hindsight, loss_tok)
        low, high, dual = (x & ~revision for x in (low, high, dual))
        gap = jnp.sum(jnp.abs(jax.lax.stop_gradient(logp) - old) * maskf)
    kl = jnp.zeros(())
    if spec.use_kl:
        ref_logp = jax.lax.stop_gradient(_logp_mask_old(graphdef, spec, ref_params, mb)[0])
        kl_tok = kl_penalty(logp, ref_logp, spec.kl_estimator)
        loss_tok = loss_tok + coefs["kl_coef"] * kl_tok
        kl = jnp.sum(jax.lax.stop_gradient(kl_tok) * maskf)
    loss = aggregate(loss_tok, mask, mode=spec.loss_agg if spec.mode == "rl" else "token-mean", **norms)
    sums = {"clip_low": jnp.sum(low * maskf), "clip_high": jnp.sum(high * maskf), "dual_clip": jnp.sum(dual * maskf),
            "kl": kl, "logp_gap": gap, "nll": -jnp.sum(jax.lax.stop_gradient(logp) * maskf)}
    return loss, sums


def update_fn(graphdef, spec: UpdateSpec, optimizer, params, opt_state, batch, coefs, ref_params=None):
    """One optimizer step (pure). Returns (params, opt_state, metrics).

    `rows` layout: batch arrays [N, ...], cut here into spec.micro_batches slices. `shared` layout
    (rl/layout.py): arrays already [M, ...] per micro-batch. When `params` holds LoRA adapters (model/lora.py),
    only they get gradients and optimizer state, the base passes through unchanged, and `ref_params` holds the
    reference's adapters only (the reference is the same base with them)."""
    if spec.layout == "shared":
        mask = batch.loss_mask & batch.valid[..., None]
        micro = batch
    else:
        mask = batch.loss_mask[:, 1:] & batch.valid[:, None]
        micro = jax.tree.map(lambda x: _split_micro(x, spec.micro_batches), batch)
    tokens_total = jnp.sum(mask.astype(jnp.float32))
    norms = {"total_tokens": tokens_total,
             "total_seqs": jnp.sum((jnp.sum(mask, axis=-1) > 0).astype(jnp.float32)),
             "norm_len": coefs["norm_len"]}
    train, base = lora.trainable(params), lora.frozen(params)
    ref = None if ref_params is None else lora.combine(ref_params, base)
    grad_fn = jax.value_and_grad(
        lambda p, mb, key: _loss_terms(graphdef, spec, lora.combine(p, base), ref, mb, coefs, norms, key),
        has_aux=True)
    # LoRA dropout's key for this call (coefs["dropout_key"], raw uint32 key data: train/step.py draws one per
    # update call), folded with the micro-batch's index; unused (and compiled away) without dropout
    dropout_key = coefs.get("dropout_key")

    def accumulate(carry, xs):
        grads, loss, sums = carry
        mb, index = xs
        key = None if dropout_key is None else jax.random.fold_in(dropout_key, index)
        (mb_loss, mb_sums), g = grad_fn(train, mb, key)
        grads = jax.tree.map(lambda a, b: a + b.astype(jnp.float32), grads, g)
        return (grads, loss + mb_loss, jax.tree.map(jnp.add, sums, mb_sums)), None

    zeros = jax.tree.map(lambda x: jnp.zeros(x.shape, jnp.float32), train)
    zero_sums = {k: jnp.zeros(()) for k in ("clip_low", "clip_high", "dual_clip", "kl", "logp_gap", "nll")}
    count = jax.tree.leaves(micro)[0].shape[0]
    (grads, loss, sums), _ = jax.lax.scan(accumulate, (zeros, jnp.zeros(()), zero_sums),
                                          (micro, jnp.arange(count, dtype=jnp.uint32)))
    grad_norm = optax.tree.norm(grads)
    finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
    updates, new_opt = optimizer.update(grads, opt_state, train)
    new_train = optax.apply_updates(train, updates)
    keep = lambda new, old: jax.tree.map(lambda a, b: jnp.where(finite, a, b), new, old)  # noqa: E731
    denom = jnp.maximum(tokens_total, 1.0)
    metrics = {"loss": loss, "grad_norm": grad_norm, "skipped_nonfinite": 1 - finite.astype(jnp.int32),
               "lr": current_lr(new_opt), "update_tokens": tokens_total,
               **{k: v / denom for k, v in sums.items()}}
    return lora.combine(keep(new_train, train), base), keep(new_opt, opt_state), metrics


def _coef_dtype(value):
    """A coefficient's dtype in the program: float32, except key data (unsigned integers) kept as it is."""
    return np.uint32 if np.issubdtype(np.asarray(value).dtype, np.unsignedinteger) else np.float32


def optimizer_shardings(optimizer, params, mesh: Mesh):
    """Shardings of `optimizer`'s state for `params` (arrays or ShapeDtypeStructs with shardings; only the
    adapters when it holds LoRA adapters): every subtree shaped like them (Adam's moments) sharded like them,
    scalars (step counts, hyperparameters) replicated over the mesh."""
    params = lora.trainable(params)
    param_def = jax.tree.structure(params)
    param_sh = shardings_of(params)
    replicated = NamedSharding(mesh, P())
    like_params = lambda node: jax.tree.structure(node) == param_def  # noqa: E731
    return jax.tree.map(lambda node: param_sh if like_params(node) else replicated,
                        jax.eval_shape(optimizer.init, params), is_leaf=like_params)


def abstract_optimizer_state(optimizer, params, mesh: Mesh):
    """The optimizer state's shapes and shardings (nothing allocated): enough to build an update."""
    shapes = jax.eval_shape(optimizer.init, lora.trainable(params))
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), shapes,
                        optimizer_shardings(optimizer, params, mesh))


def init_optimizer(optimizer, params, mesh: Mesh):
    """Optimizer state created in place, laid out by `optimizer_shardings`. (Without out_shardings,
    init returned the moments on one device and they were copied whole to every device.)"""
    return jax.jit(optimizer.init, out_shardings=optimizer_shardings(optimizer, params, mesh))(lora.trainable(params))


def shardings_of(tree):
    return jax.tree.map(lambda x: x.sharding, tree)


def batch_shardings(mesh: Mesh, spec: UpdateSpec, batch):
    """Rows over the mesh's batch axes (where they divide), every other axis whole; in the shared
    layout the leading axis is the micro-batch, and rows and contexts are the second. The result is
    the batch's pytree with a NamedSharding per field."""
    lead = (None,) if spec.layout == "shared" else ()
    return jax.tree.map(
        lambda v: NamedSharding(mesh, spec_for(v.shape, lead + ("batch",) + (None,) * (v.ndim - 1 - len(lead)), mesh)),
        batch)


def _shape_key(batch) -> tuple:
    return tuple((tuple(x.shape), str(x.dtype)) for x in jax.tree.leaves(batch))


def make_update(graphdef, spec: UpdateSpec, optimizer, params, opt_state, mesh: Mesh):
    """The jitted update; params/opt_state must already be placed (or be ShapeDtypeStructs with their
    shardings: `abstract_optimizer_state`). One program per batch shape
    (the layouts bucket their shapes, so a run builds a handful).

    The returned `run(params, opt_state, batch, coefs, ref_params=None)` takes the KL reference per
    call (laid out like the parameters; with LoRA adapters, the reference's adapters only), so the trainer can
    fix it when RL starts, after any SFT.
    """
    kind = SharedBatch if spec.layout == "shared" else RowBatch
    replicated = NamedSharding(mesh, P())
    param_sh, opt_sh, ref_sh = shardings_of(params), shardings_of(opt_state), shardings_of(lora.trainable(params))
    programs = {}
    compiled = {}  # batch shapes -> program compiled ahead of time (jit's own cache does not see those)

    def program(batch_sh):
        sig = tuple(s.spec for s in jax.tree.leaves(batch_sh))
        if sig not in programs:
            in_sh = (param_sh, opt_sh, batch_sh, replicated) + ((ref_sh,) if spec.use_kl else ())
            programs[sig] = jax.jit(
                lambda p, o, b, c, *ref: update_fn(graphdef, spec, optimizer, p, o, b, c, ref[0] if ref else None),
                in_shardings=in_sh, out_shardings=(param_sh, opt_sh, replicated), donate_argnums=(0, 1))
        return programs[sig]

    def run(params, opt_state, batch, coefs, ref_params=None):
        if spec.use_kl and ref_params is None:
            raise ValueError("this update has a KL term (kl_coef > 0): pass ref_params")
        if not isinstance(batch, kind):
            raise TypeError(f"the {spec.layout!r} update takes a {kind.__name__}, got {type(batch).__name__}")
        batch_sh = batch_shardings(mesh, spec, batch)
        batch = hosts.put_tree(batch, batch_sh)
        coefs = {k: jnp.asarray(v, _coef_dtype(v)) for k, v in coefs.items()}
        ahead = compiled.get(_shape_key(batch))  # compiled ahead of time (`compile`) for this shape
        return (ahead or program(batch_sh))(params, opt_state, batch, coefs, *((ref_params,) if spec.use_kl else ()))

    def lower(params, opt_state, batch, coefs) -> jax.stages.Lowered:
        """The program `run` compiles for batches shaped like `batch` (numpy or ShapeDtypeStructs; params /
        opt_state may be abstract, with their shardings), lowered with abstract arguments: nothing allocated."""
        batch_sh = batch_shardings(mesh, spec, batch)
        spec_of = lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s)  # noqa: E731
        abstract = lambda tree, sh: jax.tree.map(spec_of, tree, sh)  # noqa: E731
        c = {k: jax.ShapeDtypeStruct(np.shape(v), _coef_dtype(v), sharding=replicated) for k, v in coefs.items()}
        args = (abstract(params, param_sh), abstract(opt_state, opt_sh), abstract(batch, batch_sh), c)
        return program(batch_sh).lower(*args, *((abstract(lora.trainable(params), ref_sh),) if spec.use_kl else ()))

    def compile(lowered: jax.stages.Lowered, batch, ahead: jax.stages.Compiled | None = None) -> jax.stages.Compiled:
        """`lowered` (from `lower` for batches like `batch`) compiled ahead of time, or `ahead` (the same program,
        by its text, compiled before): later calls of that shape run it instead of compiling the program again."""
        ahead = compiled[_shape_key(batch)] = ahead or lowered.compile()
        return ahead

    run.lower, run.compile = lower, compile
    return run


def make_logprobs(graphdef, compute_dtype: str, params, mesh: Mesh, rows: int):
    """Jitted tempered log-probs [rows, L] of a batch's tokens under `params` (rows layout, the update's
    dtype and positions), 0 at position 0. Used to recompute old log-probs with the trainer's forward
    (`algo.recompute_old_logp`)."""
    tok_sh, row_sh = row_sharding(mesh, rows, 2), row_sharding(mesh, rows, 1)

    def logprobs(p, tokens, temperature):
        model = merged_model(graphdef, p, compute_dtype)
        return jnp.pad(rows_logp(model, tokens, temperature), ((0, 0), (1, 0)))

    fn = jax.jit(logprobs, in_shardings=(shardings_of(params), tok_sh, row_sh), out_shardings=tok_sh)
    return lambda p, tokens, temperature: fn(p, hosts.put(tokens, tok_sh), hosts.put(temperature, row_sh))
