"""E3 core (ALGORITHMS.md §1): allocation and ranks against literal brute-force references, budget
bounds, the temperature update and its annealed target, and the controller closing the loop on a
toy policy with exact and with sampled entropy."""

import math
from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm.explore.budget import allocate, budget_bounds, difficulty_ranks
from jaxrl_llm.explore.temperature import (annealed_target, entropy_constant, next_temperature,
                                           row_temperatures)

allocate_jit = jax.jit(allocate, static_argnames="total")
ranks_jit = jax.jit(difficulty_ranks)


def brute_allocate(rho, n_min, n_max, total):
    """The spec read literally, in exact rationals: clip-and-redistribute, floor, remainder hardest first."""
    batch = len(rho)
    if sum(rho) == 0:
        return [total // batch + (i < total % batch) for i in range(batch)]
    weights = [Fraction(float(r)) for r in rho]
    clipped = set()
    while True:
        free = [i for i in range(batch) if i not in clipped]
        left = total - batch * n_min - (n_max - n_min) * len(clipped)
        free_weight = sum(weights[i] for i in free)
        share = {i: n_min + (left * weights[i] / free_weight if free_weight else 0) for i in free}
        over = {i for i in free if share[i] > n_max}
        if not over:
            break
        clipped |= over
    counts = [n_max if i in clipped else math.floor(share[i]) for i in range(batch)]
    remainder = total - sum(counts)
    order = sorted(range(batch), key=lambda i: (-rho[i], i))
    while remainder > 0:
        for i in order:
            if remainder and counts[i] < n_max:
                counts[i] += 1
                remainder -= 1
    return counts


def random_rho(rng, batch, dyadic):
    kind = rng.randint(6)
    if kind == 0:
        rho = np.full(batch, rng.randint(65) / 64)  # all equal, all zero included
    elif kind == 1:
        rho = np.zeros(batch)
    elif kind == 2:
        rho = rng.choice([0.0, 0.25, 0.5, 1.0], size=batch)  # many ties and zeros
    elif kind == 3:  # a few hard prompts among zeros: clipping with nothing left to share by weight
        rho = np.where(rng.rand(batch) < 0.3, 1.0, 0.0)
    else:
        rho = rng.randint(65, size=batch) / 64 if dyadic else rng.rand(batch)
    return rho.astype(np.float32)


def random_case(rng, dyadic=True):
    """Few (B, total) shapes, so that a vmapped allocate compiles once per shape; bounds vary freely."""
    batch, n = int(rng.choice([1, 3, 5, 16])), int(rng.choice([2, 8]))
    n_low, n_high = rng.randint(1, n + 1), rng.randint(n, 2 * n + 5)
    n_min, n_max = budget_bounds(rng.randint(7), n, rng.randint(0, 5), n_low, n_high)
    total = n * batch
    if batch == 5 and n == 8 and rng.rand() < 0.5:  # a total that is not a multiple of B
        total = int(np.clip(rng.choice([37, 43]), batch * n_min, batch * n_max))
    return random_rho(rng, batch, dyadic), n_min, n_max, total


def allocate_cases(cases, chunk=32):
    """allocate on every case: one vmapped call per (B, total) and chunk of cases, padded to `chunk`."""
    out = [None] * len(cases)
    for batch, total in {(len(c[0]), c[3]) for c in cases}:
        idx = [i for i, c in enumerate(cases) if (len(c[0]), c[3]) == (batch, total)]
        for start in range(0, len(idx), chunk):
            part = idx[start:start + chunk]
            padded = part + [part[0]] * (chunk - len(part))
            rho, n_min, n_max = (jnp.asarray(np.stack([cases[i][j] for i in padded])) for j in range(3))
            got = np.asarray(_vmapped(total)(rho, n_min, n_max))
            for row, i in enumerate(part):
                out[i] = got[row]
    return out


_VMAPPED = {}


def _vmapped(total):
    if total not in _VMAPPED:
        _VMAPPED[total] = jax.jit(jax.vmap(lambda rho, lo, hi: allocate(rho, lo, hi, total=total)))
    return _VMAPPED[total]


def check_properties(counts, rho, n_min, n_max, total):
    assert counts.dtype == np.int32 and counts.sum() == total
    assert counts.min() >= n_min and counts.max() <= n_max
    harder = rho[:, None] > rho[None, :]
    assert not np.any(harder & (counts[:, None] < counts[None, :])), (rho, counts)


@pytest.mark.slow
def test_allocate_matches_brute_force():
    rng = np.random.RandomState(0)
    cases = [random_case(rng) for _ in range(200)]
    for (rho, n_min, n_max, total), got in zip(cases, allocate_cases(cases)):
        want = brute_allocate(rho.tolist(), n_min, n_max, total)
        np.testing.assert_array_equal(got, want, err_msg=f"rho={rho} n_min={n_min} n_max={n_max} N={total}")
        check_properties(got, rho, n_min, n_max, total)


def test_allocate_properties_continuous_rho():
    rng = np.random.RandomState(1)
    cases = [random_case(rng, dyadic=False) for _ in range(100)]
    for (rho, n_min, n_max, total), got in zip(cases, allocate_cases(cases)):
        check_properties(got, rho, n_min, n_max, total)


@pytest.mark.parametrize("rho", [np.full(7, 0.5), np.full(7, 1.0), np.zeros(7)])
def test_allocate_uniform_gives_n_each(rho):
    np.testing.assert_array_equal(allocate_jit(jnp.asarray(rho, jnp.float32), 4, 12, total=56), np.full(7, 8))


def test_allocate_by_hand_and_errors():
    # N - B n_min = 12 by rho 1:3 -> 3 and 9, so 7 and 13; 13 > 12 clips and the excess 1 goes to the easy one
    np.testing.assert_array_equal(allocate_jit(jnp.asarray([0.25, 0.75]), 4, 12, total=20), [8, 12])
    # the hardest prompt clips at 12 and the zeros share the rest in rounds: 24 = 6 + 6 + 12
    np.testing.assert_array_equal(allocate_jit(jnp.asarray([0.0, 0.0, 1.0]), 4, 12, total=24), [6, 6, 12])
    # concrete bounds are checked on the host (eagerly, before anything is traced)
    with pytest.raises(ValueError, match="B\\*n_min <= total"):
        allocate(jnp.zeros(4), 6, 12, total=20)
    with pytest.raises(ValueError, match="total <= B\\*n_max"):
        allocate(jnp.zeros(4), 4, 6, total=25)


def test_allocate_compiles_once():
    traces = []

    def counted(rho, n_min, n_max):
        traces.append(1)
        return allocate(rho, n_min, n_max, total=64)

    f = jax.jit(counted)
    rng = np.random.RandomState(2)
    for epoch in range(5):
        n_min, n_max = budget_bounds(epoch, 8, 2, 4, 12)
        rho = random_rho(rng, 8, dyadic=True)
        np.testing.assert_array_equal(f(jnp.asarray(rho), n_min, n_max), brute_allocate(rho.tolist(), n_min, n_max, 64))
    assert len(traces) == 1 and f._cache_size() == 1


def brute_ranks(reward_sum, count, seed=None):
    """Average 0-based position in the easiest-first order (exact means), over P - 1; a lone prompt 0.5."""
    num = len(count)
    means = [Fraction(float(s)) / int(c) if c > 0 else (None if seed is None else 1 - Fraction(float(seed[i])))
             for i, (s, c) in enumerate(zip(reward_sum, count))]
    key = [(0, -m) if m is not None else (1, 0) for m in means]  # unseen without a seed sort last
    order = sorted(range(num), key=lambda i: key[i])
    ranks = np.zeros(num)
    for i in range(num):
        positions = [p for p, j in enumerate(order) if key[j] == key[i]]
        ranks[i] = 0.5 if num == 1 else sum(positions) / len(positions) / (num - 1)
    return ranks


@pytest.mark.parametrize("use_seed", [False, True])
def test_difficulty_ranks_match_brute_force(use_seed):
    rng = np.random.RandomState(3)
    for _ in range(30):
        num = int(rng.choice([1, 2, 5, 9, 33]))  # few shapes, few compilations
        count = rng.randint(0, 9, size=num) * rng.randint(0, 2, size=num)  # about half unseen
        reward_sum = np.array([rng.choice([0.0, 0.25, 0.5, 1.0], size=c).sum() for c in count], np.float32)
        seed = (rng.randint(9, size=num) / 8).astype(np.float32) if use_seed else None
        got = ranks_jit(jnp.asarray(reward_sum), jnp.asarray(count), None if seed is None else jnp.asarray(seed))
        assert got.dtype == jnp.float32
        np.testing.assert_allclose(np.asarray(got), brute_ranks(reward_sum, count, seed), rtol=0, atol=1e-6)


def test_difficulty_ranks_ties_and_unseen():
    ranks = ranks_jit(jnp.asarray([3.0, 1.0, 0.0, 2.0, 0.0]), jnp.asarray([4, 4, 0, 4, 0]))
    np.testing.assert_allclose(ranks, [0.0, 0.5, 0.875, 0.25, 0.875])
    np.testing.assert_allclose(ranks_jit(jnp.zeros(6), jnp.zeros(6, jnp.int32)), np.full(6, 0.5))
    seeded = ranks_jit(jnp.asarray([3.0, 0.0]), jnp.asarray([4, 0]), jnp.asarray([0.0, 0.1]))
    np.testing.assert_allclose(seeded, [1.0, 0.0])  # a seed of 0.1 reads as mean 0.9 > 0.75


def test_budget_bounds_schedule():
    got = [budget_bounds(e, 8, 2, 4, 12) for e in range(7)]
    assert got == [(8, 8), (6, 10), (4, 12)] + [(4, 12)] * 4
    rng = np.random.RandomState(4)
    for _ in range(50):  # closed form equals the per-epoch recurrence
        n = rng.randint(1, 20)
        delta, n_low, n_high = rng.randint(0, 5), rng.randint(1, n + 1), rng.randint(n, 40)
        lo = hi = n
        for epoch in range(8):
            assert budget_bounds(epoch, n, delta, n_low, n_high) == (lo, hi)
            lo, hi = max(lo - delta, n_low), min(hi + delta, n_high)
    with pytest.raises(ValueError):
        budget_bounds(0, 3, 2, 4, 12)


def test_next_temperature_formula_and_clamp():
    rng = np.random.RandomState(5)
    t, k = rng.uniform(0.3, 2.0, 64).astype(np.float32), rng.uniform(5, 15, 64).astype(np.float32)
    h = rng.uniform(0.1, 4.0, 64).astype(np.float32)
    target = (h * rng.uniform(0.5, 2.0, 64)).astype(np.float32)
    want = t.astype(np.float64) * (1 + t.astype(np.float64) * np.log(target.astype(np.float64) / h) / k)
    np.testing.assert_allclose(next_temperature(t, target, h, k, 0.0, 100.0), want, rtol=1e-6)
    assert float(next_temperature(1.0, 3.0, 1.0, 1.0, 0.3, 2.0)) == np.float32(2.0)
    assert float(next_temperature(1.0, 0.01, 1.0, 1.0, 0.3, 2.0)) == np.float32(0.3)
    assert float(next_temperature(0.7, 2.0, 2.0, 5.0, 0.3, 2.0)) == np.float32(0.7)
    assert float(next_temperature(1.0, 2.0, 0.0, 12.0, 0.3, 2.0)) == np.float32(2.0)  # collapsed: raise T
    assert float(next_temperature(0.7, 0.0, 0.0, 5.0, 0.3, 2.0)) == np.float32(0.7)
    np.testing.assert_allclose(entropy_constant(50), math.log(50) + math.log(math.log(50)), rtol=1e-6)


def test_annealed_target():
    target = jax.jit(annealed_target, static_argnums=(2, 3, 4))
    values = np.array([float(target(2.0, s, 100, 0.4, 0.9)) for s in range(1, 101)])
    assert np.all(values[:60] == 2.0)  # steps 1..60 flat
    assert values[-1] == np.float32(2.0) * np.float32(0.9)  # step 100: exactly the factor
    assert np.all(np.diff(values[59:]) <= 0) and values[60] < 2.0
    np.testing.assert_allclose(values[79], 2.0 * (1 + 0.9) / 2, rtol=1e-6)  # step 80: cosine midpoint
    np.testing.assert_allclose(values[69], 2.0 * (0.9 + 0.1 * 0.5 * (1 + math.cos(math.pi / 4))), rtol=1e-6)
    assert float(annealed_target(2.0, 100, 100, 0.0, 0.9)) == 2.0  # ratio 0 disables annealing


def test_row_temperatures():
    rho = jnp.asarray([0.0, 0.25, 0.5, 1.0])
    np.testing.assert_array_equal(row_temperatures(0.8, rho, 0.0, 0.3, 2.0), np.full(4, np.float32(0.8)))
    np.testing.assert_allclose(row_temperatures(1.0, rho, 0.2, 0.3, 2.0), [0.9, 0.95, 1.0, 1.1], rtol=1e-6)
    np.testing.assert_allclose(row_temperatures(1.9, rho, 0.4, 0.3, 2.0), [1.52, 1.71, 1.9, 2.0], rtol=1e-6)


def toy_policy():
    """Fixed logits [300, 50] whose entropy at T = 1 is moderate (about 1.6 of ln 50 = 3.9 nats)."""
    return jnp.asarray(np.random.RandomState(6).randn(300, 50).astype(np.float32) * 3.0)


def exact_entropy(logits, t):
    logp = jax.nn.log_softmax(logits / t, axis=-1)
    return -jnp.mean(jnp.sum(jnp.exp(logp) * logp, axis=-1))


def test_controller_reaches_target_with_exact_entropy():
    logits = toy_policy()
    target, k, t = exact_entropy(logits, 0.6), entropy_constant(50), jnp.float32(1.0)
    for _ in range(30):
        t = next_temperature(t, target, exact_entropy(logits, t), k, 0.3, 2.0)
    assert abs(float(exact_entropy(logits, t) / target) - 1) < 0.05
    assert abs(float(t) - 0.6) < 0.02


def test_controller_reaches_target_with_sampled_entropy():
    logits = toy_policy()
    target, k, t = exact_entropy(logits, 0.6), entropy_constant(50), jnp.float32(1.0)

    @jax.jit
    def sampled_entropy(t, key):  # mean of -log p(y) over 8 tokens drawn per position: unbiased for H
        logp = jax.nn.log_softmax(logits / t, axis=-1)
        y = jax.random.categorical(key, logp, shape=(8, logits.shape[0]))
        return -jnp.mean(jnp.take_along_axis(logp, y.T, axis=-1))

    root, history = jax.random.key(7), []
    for step in range(60):
        t = next_temperature(t, target, sampled_entropy(t, jax.random.fold_in(root, step)), k, 0.3, 2.0)
        history.append(float(t))
    assert abs(np.mean(history[-20:]) - 0.6) < 0.05 and max(abs(np.array(history[-20:]) - 0.6)) < 0.1
