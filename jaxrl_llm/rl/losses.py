"""Per-token policy loss (PPO clip with clip-higher and dual clip; HeRL's hindsight weight on revision
rows), KL penalty and aggregation.

Every reduction returns a *sum* over the rows it is given divided by a batch-wide normaliser that
the caller passes in, so summing the losses of micro-batches reproduces the full-batch loss
exactly (gradient accumulation changes nothing).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxrl_llm.config.choices import KL_ESTIMATORS, LOSS_AGGREGATIONS as AGGREGATIONS  # noqa: F401


def token_logprobs(logits_NLV, targets_NL, temperature_N):
    """log softmax(z / T_row)[target] in float32 (T <= 0 rows use T = 1, as the sampler does)."""
    t = jnp.where(temperature_N > 0, temperature_N, 1.0).astype(jnp.float32)
    z = logits_NLV.astype(jnp.float32) / t[:, None, None]
    z_target = jnp.take_along_axis(z, targets_NL[..., None], axis=-1)[..., 0]
    return z_target - jax.nn.logsumexp(z, axis=-1)


def kl_penalty(logp_NL, ref_logp_NL, estimator: str):
    """Per-token KL(pi || ref) estimate on tokens sampled from pi, used as a loss term.

    k2 = (logp - ref)^2 / 2: its gradient (logp - ref) * grad logp is the true KL's gradient on-policy.
    k3 = exp(ref - logp) - (ref - logp) - 1: unbiased for the KL's value, non-negative, low variance.
    """
    if estimator == "k2":
        return 0.5 * jnp.square(logp_NL - ref_logp_NL)
    if estimator == "k3":
        d = ref_logp_NL - logp_NL
        return jnp.exp(d) - d - 1.0
    raise ValueError(f"unknown KL estimator {estimator!r}; choose from {KL_ESTIMATORS}")


def clipped_token_loss(logp_NL, old_logp_NL, adv_N, *, eps_low, eps_high, dual_clip):
    """Returns (loss [N, L], clipped-low [N, L], clipped-high [N, L], dual-clipped [N, L])."""
    ratio = jnp.exp(logp_NL - old_logp_NL)
    a = adv_N[:, None]
    unclipped = -a * ratio
    clipped = -a * jnp.clip(ratio, 1.0 - eps_low, 1.0 + eps_high)
    loss = jnp.maximum(unclipped, clipped)
    dual = (a < 0) & (loss > -a * dual_clip)
    loss = jnp.where(a < 0, jnp.minimum(loss, -a * dual_clip), loss)
    low = (a < 0) & (ratio < 1.0 - eps_low)
    high = (a > 0) & (ratio > 1.0 + eps_high)
    return loss, low, high, dual


def hindsight_token_loss(logp_NL, old_logp_NL, adv_N, gamma):
    """HeRL's loss on revision tokens (ALGORITHMS.md §2): -A w with w = rho / (rho + gamma),
    rho = exp(logp - old_logp), no clipping: the weight saturates instead of being cut off."""
    rho = jnp.exp(logp_NL - old_logp_NL)
    return -adv_N[:, None] * rho / (rho + gamma)


def aggregate(loss_NL, mask_NL, *, mode: str, total_tokens, total_seqs, norm_len):
    """Sum of this slice's share of the batch loss; `total_*` and `norm_len` are batch-wide."""
    m = mask_NL.astype(jnp.float32)
    if mode == "token-mean":
        return jnp.sum(loss_NL * m) / jnp.maximum(total_tokens, 1.0)
    if mode == "seq-mean-token-mean":
        per_seq = jnp.sum(loss_NL * m, axis=1) / jnp.maximum(jnp.sum(m, axis=1), 1.0)
        return jnp.sum(per_seq) / jnp.maximum(total_seqs, 1.0)
    if mode == "seq-mean-token-sum-norm":
        return jnp.sum(loss_NL * m) / norm_len / jnp.maximum(total_seqs, 1.0)
    raise ValueError(f"unknown loss_agg {mode!r}; choose from {AGGREGATIONS}")
