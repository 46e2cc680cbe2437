"""Per-row token choice from float32 logits: temperature, top-k, top-p as traced [B] arrays.

Conventions (shared with the trainer, ALGORITHMS.md §0):
- log-prob and entropy are of the tempered full-vocabulary distribution softmax(z / T_row),
  whatever top-k / top-p did to the support the token was drawn from;
- temperature <= 0 is greedy; such rows report log-prob and entropy at T = 1;
- top_k <= 0 and top_p >= 1 switch those filters off for the row.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

_NEG_INF = -jnp.inf


def tempered_logprobs(logits_BV, temperature_B):
    t = jnp.where(temperature_B > 0, temperature_B, 1.0).astype(jnp.float32)
    return jax.nn.log_softmax(logits_BV.astype(jnp.float32) / t[:, None], axis=-1)


def entropy_from_logprobs(logp_BV):
    return -jnp.sum(jnp.exp(logp_BV) * logp_BV, axis=-1)


def _filter_top_k_top_p(logp_BV, top_k_B, top_p_B):
    """Mask (to -inf) tokens outside each row's support: top-k first, then top-p on the
    renormalised top-k mass (the order Hugging Face applies them). Ties at the cut are kept."""
    vocab = logp_BV.shape[-1]
    sorted_BV = -jnp.sort(-logp_BV, axis=-1)  # descending
    k = jnp.where(top_k_B > 0, jnp.minimum(top_k_B, vocab), vocab)
    in_k = jnp.arange(vocab)[None, :] < k[:, None]
    probs = jnp.where(in_k, jnp.exp(sorted_BV), 0.0)
    # "mass before token i < top_p" is tested as "mass from token i on > (1 - top_p) * total", the mass
    # summed smallest first: a float32 running sum from the top cannot resolve the last 6e-8 below 1.0 and
    # its rounding reaches 1.0 (or top_p) early, cutting thousands of tail tokens of a 49k vocabulary
    mass_from_BV = jax.lax.cumsum(probs, axis=1, reverse=True)
    tail_B = (1.0 - top_p_B) * mass_from_BV[:, 0]
    in_p = (top_p_B[:, None] >= 1.0) | (mass_from_BV > tail_B[:, None])
    n_keep = jnp.maximum(jnp.sum(in_k & in_p, axis=-1), 1)
    cut_B = jnp.take_along_axis(sorted_BV, (n_keep - 1)[:, None], axis=-1)[:, 0]
    return jnp.where(logp_BV >= cut_B[:, None], logp_BV, _NEG_INF)


def support_logprobs(logp_BV, top_k_B, top_p_B):
    """The log-probs each row draws from: filtered where the row asks for it, untouched otherwise, so a
    row samples the same tokens whatever rows share its batch."""
    unfiltered_B = (top_k_B <= 0) & (top_p_B >= 1.0)
    # batches where no row filters (the default) skip the sort
    filtered = jax.lax.cond(jnp.all(unfiltered_B), lambda lp, *_: lp, _filter_top_k_top_p, logp_BV, top_k_B, top_p_B)
    return jnp.where(unfiltered_B[:, None], logp_BV, filtered)


def argmax_last(x_BV):
    """First index of the maximum along the last axis. Two plain reductions: XLA:CPU runs them
    vectorised, while jnp.argmax's variadic (value, index) reduce is several times slower."""
    best = jnp.max(x_BV, axis=-1, keepdims=True)
    iota = jax.lax.broadcasted_iota(jnp.int32, x_BV.shape, x_BV.ndim - 1)
    return jnp.min(jnp.where(x_BV == best, iota, x_BV.shape[-1]), axis=-1)


def choose_tokens(logits_BV, temperature_B, top_p_B, top_k_B, keys_B):
    """Returns (token [B] int32, tempered log-prob [B] f32, tempered entropy [B] f32)."""
    logp = tempered_logprobs(logits_BV, temperature_B)
    support = support_logprobs(logp, top_k_B, top_p_B)
    greedy = argmax_last(logits_BV)

    def draw(support):
        gumbel = jax.vmap(lambda k: jax.random.gumbel(k, (logits_BV.shape[-1],), jnp.float32))(keys_B)
        return jnp.where(temperature_B > 0, argmax_last(support + gumbel), greedy)

    # all-greedy batches (evaluation) skip drawing noise for the whole vocabulary
    token = jax.lax.cond(jnp.any(temperature_B > 0), draw, lambda _: greedy, support).astype(jnp.int32)
    token_logp = jnp.take_along_axis(logp, token[:, None], axis=-1)[:, 0]
    return token, token_logp, entropy_from_logprobs(logp)
