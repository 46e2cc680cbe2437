"""The step's rows across sampler calls: outputs of different length buckets joined and patched
keep every row's tokens, log-probs and masks, and the update rows built from them equal the rows
of one call; the row plan's pieces line up with them."""

import jax
import numpy as np
import pytest

from jaxrl_llm.explore.rows import RowPlan, Rollouts
from jaxrl_llm.sampling.sampler import SampleOutput


def _call(sampler, state, prompts, max_new, seed):
    return sampler(state, prompts, max_new_tokens=max_new, temperature=1.0, key=jax.random.key(seed))


def _row(out: SampleOutput, i: int) -> dict:
    """Row i's facts, independent of its buffer width."""
    span = slice(0, int(out.context_len[i] + out.num_generated[i]))
    return {"tokens": out.tokens[i, span].tolist(), "logp": out.logprobs[i, span].tolist(),
            "ent": out.entropy[i, span].tolist(), "ctx": int(out.context_len[i]), "n": int(out.num_generated[i]),
            "mask": out.response_mask[i, span].tolist()}


@pytest.mark.slow
def test_outputs_of_different_buckets_concatenate_and_replace(tiny_sampler):
    sampler, state = tiny_sampler
    short = _call(sampler, state, [[5, 6, 7], [8, 9]], 4, 0)  # buffer 16 + 16
    long = _call(sampler, state, [[3] * 20, [4, 5]], 24, 1)  # buffer 32 + 32
    assert short.tokens.shape[1] < long.tokens.shape[1]
    both = SampleOutput.concat([short, long])
    assert both.tokens.shape == (4, long.tokens.shape[1])
    want = [_row(short, 0), _row(short, 1), _row(long, 0), _row(long, 1)]
    assert [_row(both, i) for i in range(4)] == want
    assert not both.response_mask[:, short.tokens.shape[1]:][:2].any()  # widened slots carry nothing
    assert (both.tokens[:2, short.tokens.shape[1]:] == short.pad_id).all()

    patched = short.replace_rows([1], long.take([0]))
    assert [_row(patched, i) for i in range(2)] == [_row(short, 0), _row(long, 0)]
    assert [_row(both.take(np.array([3, 0])), i) for i in range(2)] == [want[3], want[0]]


@pytest.mark.slow
def test_row_plan_and_rollouts_cut_join_and_patch(tiny_sampler):
    sampler, state = tiny_sampler
    plan = RowPlan.groups([2, 3], 0.7, jax.random.key(0))
    assert plan.group.tolist() == [0, 0, 1, 1, 1] and plan.group_sizes.tolist() == [2, 3]
    keys = jax.random.key_data(jax.vmap(jax.random.fold_in, in_axes=(None, 0))(jax.random.key(0), np.arange(5)))
    np.testing.assert_array_equal(plan.row_keys, np.asarray(keys))  # row r: fold_in(key, r)
    out = sampler(state, [[5, 6]] * 2 + [[7, 8, 9]] * 3, max_new_tokens=3, temperature=plan.temperature,
                  row_keys=jax.random.wrap_key_data(plan.row_keys))
    r = Rollouts(plan, out, np.arange(5, dtype=np.float32), tuple("abcde"))
    extra = Rollouts(plan.take([4]), out.take([4]), np.array([9.0], np.float32), ("z",))
    joined = Rollouts.concat([r, extra])
    assert joined.rows == 6 and joined.texts[-1] == "z" and joined.plan.group.tolist() == [0, 0, 1, 1, 1, 1]
    swapped = r.replace_rows([0], extra)
    assert swapped.rewards.tolist() == [9, 1, 2, 3, 4] and swapped.texts[0] == "z"
    assert swapped.plan.group.tolist() == [1, 0, 1, 1, 1] and swapped.advantages is None
    assert _row(swapped.out, 0) == _row(out, 4)


def test_responses_move_under_other_prompts(tiny_sampler):
    """HeRL trains a revision as a response to the original prompt: the row's own tokens, log-probs,
    entropies and masks move intact behind the new prompt."""
    sampler, state = tiny_sampler
    out = sampler(state, [[5, 6, 7, 8, 9, 10], [11, 12]], max_new_tokens=5, temperature=1.0,
                  key=jax.random.key(4), prefixes=[[20, 21], []])
    moved = out.with_prompts([[1, 2], [3, 4, 5, 6, 7, 8, 9, 10, 11, 12]])
    assert moved.prompt_len.tolist() == [2, 10] and (moved.prefix_len == out.prefix_len).all()
    for i in range(2):
        a, b = out.prompt_len[i], moved.prompt_len[i]
        own = out.prefix_len[i] + out.num_generated[i]
        np.testing.assert_array_equal(moved.tokens[i, b:b + own], out.tokens[i, a:a + own])
        np.testing.assert_array_equal(moved.logprobs[i, b:b + own], out.logprobs[i, a:a + own])
        assert moved.response_mask[i].sum() == out.num_generated[i] and moved.prefix_mask[i].sum() == out.prefix_len[i]
        np.testing.assert_array_equal(moved.logprobs[i][moved.response_mask[i]], out.logprobs[i][out.response_mask[i]])
    assert moved.generated(0) == out.generated(0) and moved.tokens[1, :10].tolist() == list(range(3, 13))
