"""Shared prefill (each distinct context encoded once per call) against the unshared path as oracle."""

import jax
import numpy as np
import pytest

from jaxrl_llm.sampling.sampler import FINISH_STOP, Sampler
from jaxrl_llm.utils import compile_counter

STOP = (5, 17, 40, 77)


@pytest.fixture(scope="module")
def unshared(tiny_model):
    return Sampler.for_model(tiny_model, pad_id=0, stop_ids=(), share_prefill=False)[0]


def distinct_contexts(sampler, prompts, **kwargs) -> int:
    """Rows of the prefill the program would run (the unique-context bucket)."""
    args, _ = sampler._inputs(prompts, **kwargs)
    return args[-3].shape[0]


def assert_same(got, ref):
    np.testing.assert_array_equal(got.tokens, ref.tokens)
    np.testing.assert_array_equal(got.num_generated, ref.num_generated)
    np.testing.assert_array_equal(got.finish_reason, ref.finish_reason)
    np.testing.assert_array_equal(got.prompt_len, ref.prompt_len)
    np.testing.assert_array_equal(got.prefix_len, ref.prefix_len)
    np.testing.assert_allclose(got.logprobs, ref.logprobs, atol=1e-5, rtol=0)
    np.testing.assert_allclose(got.entropy, ref.entropy, atol=1e-5, rtol=0)


def group_batch(sizes, seed=0, shuffle=False):
    """len(sizes) distinct prompts of 3-16 tokens, prompt g repeated sizes[g] times, with per-row knobs."""
    rng = np.random.RandomState(seed)
    distinct = [list(rng.randint(1, 96, size=rng.randint(3, 17))) for _ in sizes]
    prompts = [p for p, k in zip(distinct, sizes) for _ in range(k)]
    n = len(prompts)
    order = rng.permutation(n) if shuffle else np.arange(n)
    prompts = [prompts[i] for i in order]
    kwargs = dict(max_new_tokens=rng.randint(4, 17, size=n), temperature=rng.choice([0.0, 0.7, 1.0], size=n),
                  top_p=np.where(rng.rand(n) < 0.4, 0.8, 1.0).astype(np.float32), stop_ids=STOP)
    return prompts, kwargs


@pytest.mark.slow
@pytest.mark.parametrize("shuffle", [False, True])
def test_shared_equals_unshared_for_groups(tiny_sampler, unshared, shuffle):
    sampler, state = tiny_sampler
    prompts, kwargs = group_batch([8] * 8, seed=1, shuffle=shuffle)
    assert distinct_contexts(sampler, prompts, **kwargs) == 8
    assert distinct_contexts(unshared, prompts, **kwargs) == 64
    got = sampler(state, prompts, key=jax.random.key(3), **kwargs)
    ref = unshared(state, prompts, key=jax.random.key(3), **kwargs)
    assert_same(got, ref)
    # the comparison has power: rows of one group diverge, some stop, some run out of budget
    assert (ref.finish_reason == FINISH_STOP).sum() >= 4 and (ref.finish_reason != FINISH_STOP).sum() >= 4
    first = prompts[0]
    group = [i for i, p in enumerate(prompts) if p == first]
    assert len({tuple(ref.generated(i)) for i in group}) > 1


@pytest.mark.slow
def test_shared_equals_unshared_with_prefixes(tiny_sampler, unshared):
    sampler, state = tiny_sampler
    a, b = [3, 9, 27, 81, 50], list(range(10, 22))
    rows = [(a, ()), (a, ()), (a, (6, 7)), (a, (6, 7)), (a, (6, 8)), (b, ()), (b, (6, 7)), (b, ()),
            (a + [6, 7], ()),  # the same tokens as a + prefix (6, 7): the same context, another prompt_len
            (a, (6, 8, 9)), (b, ()), (a, ())]
    prompts, prefixes = [r[0] for r in rows], [list(r[1]) for r in rows]
    kwargs = dict(prefixes=prefixes, max_new_tokens=12, temperature=np.tile([0.0, 0.7, 1.0], 4),
                  top_p=0.9, stop_ids=STOP)
    assert distinct_contexts(sampler, prompts, **kwargs) == 8  # 6 distinct contexts, bucketed
    got = sampler(state, prompts, key=jax.random.key(4), **kwargs)
    ref = unshared(state, prompts, key=jax.random.key(4), **kwargs)
    assert_same(got, ref)
    assert got.prompt_len[8] == 7 and got.prefix_len[8] == 0 and got.prefix_len[2] == 2
    # a greedy row continues the same context whatever its prompt / prefix split
    greedy = sampler(state, [a, a + [6, 7]], prefixes=[[6, 7], []], max_new_tokens=12, temperature=0.0)
    assert greedy.generated(0) == greedy.generated(1)


def test_group_sizes_compile_nothing_new(tiny_sampler):
    sampler, state = tiny_sampler
    # warm-up: 64 rows, 8 distinct contexts (bucket 8), contexts <= 16 tokens, budgets <= 16
    prompts, kwargs = group_batch([8] * 8, seed=2)
    sampler(state, prompts, key=jax.random.key(0), **kwargs)
    before = compile_counter.compilations()
    for trial, sizes in enumerate([[4, 12, 8, 8, 6, 10, 8, 8], [2, 14, 8, 8, 8, 8, 1, 15],
                                   [16, 8, 8, 8, 8, 8, 8], [10, 10, 10, 10, 10, 10, 4]]):
        prompts, kwargs = group_batch(sizes, seed=10 + trial, shuffle=trial % 2 == 1)
        assert len(prompts) == 64
        out = sampler(state, prompts, key=jax.random.key(trial), **kwargs)
        assert out.tokens.shape[0] == 64
    assert compile_counter.compilations() == before


def test_shared_prefill_does_fewer_flops(tiny_sampler, unshared):
    """64 rows sharing 8 contexts of 64 tokens: the prefill runs on 8 rows, not 64."""
    sampler, state = tiny_sampler
    rng = np.random.RandomState(5)
    contexts = [list(rng.randint(1, 96, size=64)) for _ in range(8)]
    prompts = [c for c in contexts for _ in range(8)]
    flops = {}
    for name, s in (("shared", sampler), ("unshared", unshared)):
        args, _ = s._inputs(prompts, max_new_tokens=16)
        assert args[-3].shape == ((8, 64) if name == "shared" else (64, 64))  # the prefill's tokens [U, P]
        flops[name] = s.lower(state, prompts, max_new_tokens=16).cost_analysis()["flops"]
    # the prefill of 8 x 64 tokens is an eighth of 64 x 64; one decode step (counted once) is shared by both
    assert flops["shared"] < 0.25 * flops["unshared"], flops


@pytest.mark.slow
@pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 (fake) devices; set in conftest")
@pytest.mark.parametrize("mesh_shape", [{"data": 8}, {"data": 2, "fsdp": 2, "tensor": 2}])
def test_sharded_shared_prefill_equals_single_device(tiny_sampler, mesh_shape):
    """16 rows over 4 contexts: the unique-context arrays are split over the batch axes when 4 divides
    among them, replicated otherwise; the cache gather crosses shards either way."""
    from jaxrl_llm.parallel.mesh import make_mesh
    from jaxrl_llm.parallel.rules import shard_state

    sampler, state = tiny_sampler
    prompts, kwargs = group_batch([5, 3, 4, 4], seed=7, shuffle=True)
    ref = sampler(state, prompts, key=jax.random.key(6), **kwargs)
    mesh = make_mesh(mesh_shape)
    mesh_sampler = Sampler(sampler.graphdef, pad_id=0, stop_ids=(), mesh=mesh)
    assert distinct_contexts(mesh_sampler, prompts, **kwargs) == 4
    got = mesh_sampler(shard_state(state, mesh), prompts, key=jax.random.key(6), **kwargs)
    for i in range(len(prompts)):
        assert got.generated(i) == ref.generated(i)
    np.testing.assert_allclose(got.logprobs, ref.logprobs, rtol=1e-5, atol=1e-5)
