"""Attention over keys that carry positions: the dense reference, and a blockwise form whose memory is linear
in length.

Both take queries grouped by kv head, q [B, K, Q, E] (Q = T x G query rows: G query heads share each kv head),
keys [B, K, E, S], values [B, K, S, E], the queries' positions [B, Q] and the keys' [B, S]. A query at position
p attends to the keys at positions <= p (and > p - window in sliding-window layers); a key slot to ignore
carries a position past every query. A query row with no allowed key (only padding does that) gets zeros from
the blockwise form where the dense one averages every value; nothing reads those rows.

`dense` materialises the [B, K, Q, S] float32 scores: quadratic in length. `blockwise` walks the keys in blocks
with an online softmax (a running max and sum per query row), and its backward pass recomputes each block's
probabilities from the saved log-sum-exp instead of keeping them (FlashAttention's recurrence, written in
plain JAX so that every platform runs it): what it holds is O(Q x block) per kv head, never O(Q x S). It is
tested against `dense` in values and gradients (tests/model/test_attention.py).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

_NEG_INF = -1e30


def allowed(qpos_BQ, kpos_BS, window: int | None):
    """[B, Q, S]: which keys each query row may attend to."""
    ok = kpos_BS[:, None, :] <= qpos_BQ[:, :, None]
    if window:
        ok &= kpos_BS[:, None, :] > qpos_BQ[:, :, None] - window
    return ok


def dense(q_BKQE, keys_BKES, values_BKSE, qpos_BQ, kpos_BS, window: int | None):
    """The reference: softmax over every key at once. Probabilities are rounded to the queries' dtype (the
    compute dtype) and the output is in it, whatever the cache's dtype (a float32 cache on CPU holds the same
    bf16-rounded keys and values: sampling/decode.py cache_dtype)."""
    scores, _ = _scores(q_BKQE, keys_BKES, qpos_BQ, kpos_BS, window)
    probs = jax.nn.softmax(scores, axis=-1).astype(q_BKQE.dtype)
    out = jnp.einsum("bkqs,bkse->bkqe", probs, values_BKSE, preferred_element_type=jnp.float32)
    return out.astype(q_BKQE.dtype)


def blockwise(q_BKQE, keys_BKES, values_BKSE, qpos_BQ, kpos_BS, window: int | None, block: int):
    """Online-softmax attention over key blocks of up to `block` slots; same result as `dense` up to float32
    rounding, memory linear in S. The block is halved (not below 64) until it divides S, so bucketed lengths
    (1,280 = 5 x 256) waste nothing; otherwise the keys are padded with slots no query may see."""
    s = keys_BKES.shape[-1]
    while s % block and block > 64 and block % 2 == 0:
        block //= 2
    pad = -s % block
    if pad:
        past = jnp.iinfo(kpos_BS.dtype).max
        keys_BKES = jnp.pad(keys_BKES, ((0, 0), (0, 0), (0, 0), (0, pad)))
        values_BKSE = jnp.pad(values_BKSE, ((0, 0), (0, 0), (0, pad), (0, 0)))
        kpos_BS = jnp.pad(kpos_BS, ((0, 0), (0, pad)), constant_values=past)
    return _flash(q_BKQE, keys_BKES, values_BKSE, qpos_BQ, kpos_BS, window, block)


def _blocks(keys_BKES, values_BKSE, kpos_BS, block: int):
    """The keys, values and positions as a leading axis of S / block blocks (what lax.scan walks)."""
    b, k, e, s = keys_BKES.shape
    n = s // block
    kb = keys_BKES.reshape(b, k, e, n, block).transpose(3, 0, 1, 2, 4)
    vb = values_BKSE.reshape(b, k, n, block, e).transpose(2, 0, 1, 3, 4)
    pb = kpos_BS.reshape(b, n, block).transpose(1, 0, 2)
    return kb, vb, pb


def _scores(q_BKQE, k_BKEC, qpos_BQ, kpos_BC, window):
    """Scaled float32 scores of the keys given (one block, or all of them for `dense`), masked, and the mask
    [B, 1, Q, C]."""
    s = jnp.einsum("bkqe,bkec->bkqc", q_BKQE, k_BKEC, preferred_element_type=jnp.float32)
    ok = allowed(qpos_BQ, kpos_BC, window)[:, None]
    return jnp.where(ok, s * (q_BKQE.shape[-1] ** -0.5), _NEG_INF), ok


def _forward(q, keys, values, qpos, kpos, window, block):
    b, k, nq, e = q.shape

    def step(carry, blk):
        m, l, acc = carry
        kb, vb, pb = blk
        s, ok = _scores(q, kb, qpos, pb, window)
        m_new = jnp.maximum(m, s.max(-1))
        p = jnp.where(ok, jnp.exp(s - m_new[..., None]), 0.0)
        corr = jnp.exp(m - m_new)
        l = l * corr + p.sum(-1)
        acc = acc * corr[..., None] + jnp.einsum("bkqc,bkce->bkqe", p.astype(q.dtype), vb,
                                                 preferred_element_type=jnp.float32)
        return (m_new, l, acc), None

    init = (jnp.full((b, k, nq), _NEG_INF, jnp.float32), jnp.zeros((b, k, nq), jnp.float32),
            jnp.zeros((b, k, nq, e), jnp.float32))
    (m, l, acc), _ = jax.lax.scan(step, init, _blocks(keys, values, kpos, block))
    seen = l > 0
    out = jnp.where(seen[..., None], acc / jnp.where(seen, l, 1.0)[..., None], 0.0).astype(q.dtype)
    lse = jnp.where(seen, m + jnp.log(jnp.where(seen, l, 1.0)), jnp.inf)  # exp(s - inf) = 0: no key, no gradient
    return out, lse


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6))
def _flash(q, keys, values, qpos, kpos, window, block):
    return _forward(q, keys, values, qpos, kpos, window, block)[0]


def _flash_fwd(q, keys, values, qpos, kpos, window, block):
    out, lse = _forward(q, keys, values, qpos, kpos, window, block)
    return out, (q, keys, values, qpos, kpos, out, lse)


def _flash_bwd(window, block, res, d_out):
    q, keys, values, qpos, kpos, out, lse = res
    scale = q.shape[-1] ** -0.5
    d_out = d_out.astype(jnp.float32)
    delta = jnp.sum(d_out * out.astype(jnp.float32), axis=-1)  # [B, K, Q]: rowsum(dO * O)

    def step(dq, blk):
        kb, vb, pb = blk
        s, ok = _scores(q, kb, qpos, pb, window)
        p = jnp.where(ok, jnp.exp(s - lse[..., None]), 0.0)  # this block's probabilities, recomputed
        dv = jnp.einsum("bkqc,bkqe->bkce", p, d_out)
        dp = jnp.einsum("bkqe,bkce->bkqc", d_out, vb.astype(jnp.float32))
        ds = p * (dp - delta[..., None]) * scale
        dq = dq + jnp.einsum("bkqc,bkec->bkqe", ds, kb.astype(jnp.float32))
        dk = jnp.einsum("bkqc,bkqe->bkec", ds, q.astype(jnp.float32))
        return dq, (dk, dv)

    dq, (dk, dv) = jax.lax.scan(step, jnp.zeros(q.shape, jnp.float32), _blocks(keys, values, kpos, block))
    n, b, k, e, c = dk.shape
    d_keys = dk.transpose(1, 2, 3, 0, 4).reshape(b, k, e, n * c).astype(keys.dtype)
    d_values = dv.transpose(1, 2, 0, 3, 4).reshape(b, k, n * c, e).astype(values.dtype)
    zero = lambda x: np.zeros(x.shape, jax.dtypes.float0)  # noqa: E731 - integer positions have no gradient
    return dq.astype(q.dtype), d_keys, d_values, zero(qpos), zero(kpos)


_flash.defvjp(_flash_fwd, _flash_bwd)
