"""Token choice on a production-sized vocabulary: each row's support is its own, whatever rows surround it.

The oracle is float64 top-p on the same float32 log-probs the sampler uses."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm.sampling.processors import _filter_top_k_top_p, choose_tokens, support_logprobs, tempered_logprobs

V = 49152


def long_tail_logits(rows, seed=0):
    """A few high logits and a long, slowly decaying tail (0.5% of the mass): its last ~4000 tokens hold less
    than the 3e-8 a float32 number just below 1.0 can resolve, so a running sum from the top reaches 1.0
    (or rounds past top_p) before it ends."""
    rng = np.random.default_rng(seed)
    head = np.array([20.0, 19.5, 19.0, 18.5])
    return np.stack([np.r_[head, rng.normal(0.0, 3.0, V - head.size)] for _ in range(rows)]).astype(np.float32)


@pytest.mark.slow
def test_unfiltered_rows_keep_the_full_vocabulary_beside_a_filtering_row():
    temps = np.array([1.0, 1.0, 0.7, 1.3, 1.0, 0.9, 1.1, 1.0], np.float32)
    logits = jnp.asarray(long_tail_logits(temps.size))
    keys = jax.random.split(jax.random.key(5), temps.size)
    no_k = jnp.zeros(temps.size, jnp.int32)
    mixed_p = jnp.asarray(np.r_[0.9, np.ones(temps.size - 1)], jnp.float32)
    plain_p = jnp.ones(temps.size, jnp.float32)

    logp = tempered_logprobs(logits, jnp.asarray(temps))
    support = np.asarray(jax.jit(_filter_top_k_top_p)(logp, no_k, mixed_p))
    masked = np.isneginf(support[1:]).sum(axis=-1)
    assert (masked == 0).all(), f"unfiltered rows lost tail tokens to the batch's filter: {masked}"
    assert np.isneginf(support[0]).sum() > V // 2  # the filtering row does filter
    drawn_from = np.asarray(jax.jit(support_logprobs)(logp, no_k, mixed_p))
    np.testing.assert_array_equal(drawn_from[1:], np.asarray(logp)[1:])
    np.testing.assert_array_equal(drawn_from[0], support[0])

    mixed = jax.jit(choose_tokens)(logits, jnp.asarray(temps), mixed_p, no_k, keys)
    alone = jax.jit(choose_tokens)(logits, jnp.asarray(temps), plain_p, no_k, keys)
    for got, want in zip(mixed, alone):  # token, log-prob, entropy: bit-identical for unfiltered rows
        np.testing.assert_array_equal(np.asarray(got)[1:], np.asarray(want)[1:])


def oracle_kept_range(logp_V, top_k, top_p, rtol):
    """Float64 top-k then top-p on the renormalised top-k mass: how many sorted tokens to keep, as the
    range [lo, hi] spanned when the threshold on the mass left from a token onward moves by rtol (float32
    sums cannot place a cut closer than that, and the brute force has no claim finer)."""
    p = np.exp(np.sort(logp_V.astype(np.float64))[::-1])
    p = p[:top_k] if top_k > 0 else p
    mass_from = np.cumsum(p[::-1])[::-1] / p.sum()  # summed smallest first: exact to float64 rounding
    tail = 1.0 - np.float64(np.float32(top_p))
    lo = max(1, int(np.sum(mass_from > tail * (1 + rtol))))
    hi = max(1, int(np.sum(mass_from > tail * (1 - rtol))))
    return lo, hi


@pytest.mark.parametrize("top_k", [0, 30000])
def test_top_p_cut_on_a_long_tail_matches_float64(top_k):
    top_p = np.array([0.5, 0.9, 0.99, 0.9999, 0.999999, 0.9999999, 1.0, 0.99999], np.float32)
    logits = jnp.asarray(long_tail_logits(top_p.size, seed=1))
    logp = np.asarray(tempered_logprobs(logits, jnp.ones(top_p.size)))
    k = jnp.full(top_p.size, top_k, jnp.int32)
    support = np.asarray(jax.jit(_filter_top_k_top_p)(jnp.asarray(logp), k, jnp.asarray(top_p)))
    for row in range(top_p.size):
        kept = ~np.isneginf(support[row])
        cut = logp[row][kept].min()
        np.testing.assert_array_equal(kept, logp[row] >= cut)  # a prefix of the sorted order, ties kept
        lo, hi = oracle_kept_range(logp[row], top_k, top_p[row], rtol=1e-5)
        sorted_V = np.sort(logp[row])[::-1]
        assert sorted_V[hi - 1] <= cut <= sorted_V[lo - 1], \
            f"top_p={top_p[row]}: kept {kept.sum()} tokens, float64 keeps {lo}..{hi}"
