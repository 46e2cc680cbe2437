"""Slot decoding (sampling/slots.py: finished rows leave, waiting rows refill their slots, live rows are compacted)
against the one-call sampler, the oracle: every token, count and finish reason equal; log-probs to 1e-5."""

import jax
import numpy as np
import pytest

from jaxrl_llm.sampling.sampler import FINISH_STOP, Sampler
from jaxrl_llm.utils import compile_counter


def _rows(seed=3, n=13):
    rng = np.random.RandomState(seed)
    prompts = [list(rng.randint(1, 96, size=k)) for k in rng.randint(2, 30, size=n)]
    budgets = rng.randint(1, 110, size=n)  # spread: some end in the first level, some run to the buffer
    budgets[2] = 0  # a row with nothing to generate
    return prompts, budgets


def _equal(a, b):
    for f in ("tokens", "num_generated", "finish_reason", "prompt_len", "prefix_len"):
        np.testing.assert_array_equal(getattr(a, f), getattr(b, f), err_msg=f)
    for f in ("logprobs", "entropy"):
        np.testing.assert_allclose(getattr(a, f), getattr(b, f), atol=1e-5, rtol=0, err_msg=f)


@pytest.mark.parametrize("slots,temperature", [(4, 1.0), (16, 0.0)])
def test_slots_sample_exactly_what_one_call_samples(tiny_model, temperature, slots):
    """13 rows of spread budgets and context lengths, a stop token and a row with a zero budget, through 4 slots
    (refilled 3 times over, then compacted to 2 and 1; seeded) and through 16 (no refill: only compaction;
    greedy), with the cache growing through levels: equal to the one-call sampler row for row."""
    prompts, budgets = _rows()
    one, state = Sampler.for_model(tiny_model, pad_id=0, stop_ids=(), decode_level=16)
    slot, _ = Sampler.for_model(tiny_model, pad_id=0, stop_ids=(), decode_level=16, decode_slots=slots)
    kw = dict(max_new_tokens=budgets, temperature=temperature, key=jax.random.key(7), stop_ids=[11, 40],
              top_p=np.where(np.arange(13) % 3 == 0, 0.9, 1.0))
    a, b = slot(state, prompts, **kw), one(state, prompts, **kw)
    _equal(a, b)
    assert (a.finish_reason == FINISH_STOP).any() and (a.num_generated == budgets).any()
    assert a.num_generated[2] == 0 and a.num_generated.max() > 64
    stats = slot.slot_stats
    assert stats.live_steps == a.num_generated.sum()
    if slots == 4:
        assert stats.admits >= 4 and stats.regroups >= 2
    # the slots computed fewer row-steps than one call's rows x its longest row
    assert stats.slot_steps < 16 * a.num_generated.max()


def test_slots_with_shared_contexts_prefixes_and_row_keys(tiny_model):
    """GRPO-shaped calls (each prompt 4 times, given prefixes, the caller's row keys, per-row temperatures):
    equal to the one-call sampler; and the slot path compiles nothing new on a second call of other values."""
    rng = np.random.RandomState(5)
    base = [list(rng.randint(1, 96, size=k)) for k in (5, 12, 20)]
    prompts = [p for p in base for _ in range(4)]
    prefixes = [list(rng.randint(1, 96, size=k)) for k in rng.randint(0, 6, size=12)]
    keys = jax.random.split(jax.random.key(2), 12)
    temps = rng.uniform(0.3, 1.5, size=12).astype(np.float32)
    one, state = Sampler.for_model(tiny_model, pad_id=0, stop_ids=(7,), decode_level=0)  # one cache level
    slot, _ = Sampler.for_model(tiny_model, pad_id=0, stop_ids=(7,), decode_level=0, decode_slots=4)
    kw = dict(max_new_tokens=rng.randint(5, 60, size=12), temperature=temps, row_keys=keys, prefixes=prefixes)
    _equal(slot(state, prompts, **kw), one(state, prompts, **kw))
    slot(state, prompts, **{**kw, "temperature": temps[::-1].copy()})  # warm every program this shape visits
    one(state, prompts, **{**kw, "temperature": temps[::-1].copy()})
    compile_counter.install()
    before = compile_counter.compilations()
    _equal(slot(state, prompts, **{**kw, "temperature": temps[::-1].copy()}),
           one(state, prompts, **{**kw, "temperature": temps[::-1].copy()}))
    assert compile_counter.compilations() == before


def test_slots_on_a_mesh_equal_one_device(tiny_model):
    """Slots split over 8 fake devices (data 2 x fsdp 2 x tensor 2; 10 rows through 4 slots, one cache level)
    sample what one device samples."""
    from jaxrl_llm.parallel.mesh import make_mesh

    prompts, budgets = _rows(seed=8, n=10)
    one, state = Sampler.for_model(tiny_model, pad_id=0, stop_ids=(), decode_level=0, decode_slots=4)
    kw = dict(max_new_tokens=budgets, temperature=1.0, key=jax.random.key(4))
    want = one(state, prompts, **kw)
    mesh = make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
    sharded, _ = Sampler.for_model(tiny_model, pad_id=0, stop_ids=(), decode_level=0, decode_slots=4, mesh=mesh)
    _equal(sharded(state, prompts, **kw), want)
