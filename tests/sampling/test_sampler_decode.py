"""KV-cache decoding against full recomputation, padding independence, prefix continuation, buckets."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tests.helpers import forward_logits
from flax import nnx

from jaxrl_llm.sampling.processors import tempered_logprobs
from jaxrl_llm.sampling.sampler import FINISH_LENGTH, FINISH_STOP
from jaxrl_llm.utils import compile_counter


def full_logits(model, tokens, width=64):
    """Logits of a plain causal forward over `tokens` (padded at the end to one width: one program, and the
    padding comes after every position read)."""
    graphdef, state = nnx.split(model)
    ids = np.zeros((1, width), np.int32)
    ids[0, :len(tokens)] = tokens
    return np.asarray(forward_logits(graphdef, state, jnp.asarray(ids)))[0, :len(tokens)]


@pytest.mark.slow
@pytest.mark.parametrize("temperature,stop", [(0.0, ()), (0.8, ()), (1.7, ()), (1.0, (5, 17, 40, 77))])
def test_cached_decoding_equals_full_recomputation(tiny_model, tiny_sampler, temperature, stop):
    sampler, state = tiny_sampler
    prompts = [[3, 9, 27, 81 % 96, 50], [1, 2], list(range(10, 33)), [4] * 6, [8, 8], [60, 61, 62]]
    out = sampler(state, prompts, max_new_tokens=24, temperature=temperature, key=jax.random.key(7), stop_ids=stop)
    if stop:  # rows that stop early keep the log-prob and entropy of their stop token
        assert (out.finish_reason == FINISH_STOP).sum() >= 2 and (out.num_generated < 24).sum() >= 2
    for i, prompt in enumerate(prompts):
        gen = out.generated(i)
        assert len(gen) == 24 and out.finish_reason[i] == FINISH_LENGTH or gen[-1] in stop
        seq = prompt + gen
        logits = full_logits(tiny_model, seq)[len(prompt) - 1:-1]  # predicts each generated token
        ref_logp = np.asarray(tempered_logprobs(jnp.asarray(logits), jnp.full((len(gen),), temperature)))
        got_logp = out.logprobs[i][out.response_mask[i]]
        np.testing.assert_allclose(got_logp, ref_logp[np.arange(len(gen)), gen], atol=2e-5, rtol=0)
        ref_entropy = -(np.exp(ref_logp) * ref_logp).sum(-1)
        np.testing.assert_allclose(out.entropy[i][out.response_mask[i]], ref_entropy, atol=2e-5, rtol=0)
        if temperature == 0.0:
            assert gen == logits.argmax(-1).tolist()


@pytest.mark.slow
def test_padded_row_samples_what_it_would_alone(tiny_sampler):
    sampler, state = tiny_sampler
    prompts = [[5, 6, 7], list(range(40, 70)), [8] * 9]
    keys = jax.random.split(jax.random.key(11), 3)
    temps = np.array([1.0, 0.6, 1.4], np.float32)
    together = sampler(state, prompts, max_new_tokens=20, temperature=temps, top_p=0.95, row_keys=keys)
    for i in range(3):
        alone = sampler(state, [prompts[i]], max_new_tokens=20, temperature=temps[i], top_p=0.95,
                        row_keys=keys[i:i + 1])
        assert alone.generated(0) == together.generated(i)
        np.testing.assert_allclose(alone.logprobs[0][alone.response_mask[0]],
                                   together.logprobs[i][together.response_mask[i]], atol=1e-5)


def test_same_key_same_samples_other_key_other_samples(tiny_sampler):
    sampler, state = tiny_sampler
    a = sampler(state, [[1, 2, 3]] * 4, max_new_tokens=16, key=jax.random.key(0))
    b = sampler(state, [[1, 2, 3]] * 4, max_new_tokens=16, key=jax.random.key(0))
    c = sampler(state, [[1, 2, 3]] * 4, max_new_tokens=16, key=jax.random.key(1))
    assert np.array_equal(a.tokens, b.tokens)
    assert not np.array_equal(a.tokens, c.tokens)
    assert len({tuple(a.generated(i)) for i in range(4)}) > 1  # rows draw independent noise


@pytest.mark.slow
def test_prefix_continuation_marks_prefix_and_continues_greedy(tiny_sampler):
    sampler, state = tiny_sampler
    prompt = [4, 8, 15, 16, 23, 42 % 96]
    full = sampler(state, [prompt], max_new_tokens=20, temperature=0.0).generated(0)
    out = sampler(state, [prompt], prefixes=[full[:7]], max_new_tokens=13, temperature=0.0)
    assert out.generated(0) == full[7:]
    assert out.prompt_len[0] == 6 and out.prefix_len[0] == 7
    assert out.prefix_mask[0].sum() == 7 and out.tokens[0][out.prefix_mask[0]].tolist() == full[:7]
    assert not (out.prefix_mask & out.response_mask).any()
    assert (out.logprobs[0][~out.response_mask[0]] == 0).all()


def test_stop_tokens_and_per_row_budgets(tiny_sampler):
    sampler, state = tiny_sampler
    greedy = sampler(state, [[7, 7, 7]], max_new_tokens=12, temperature=0.0).generated(0)
    stop = greedy[4]
    first = greedy.index(stop)
    out = sampler(state, [[7, 7, 7], [7, 7, 7]], max_new_tokens=np.array([12, 2]), temperature=0.0,
                  stop_ids=[stop])
    assert out.generated(0) == greedy[:first + 1] and out.finish_reason[0] == FINISH_STOP
    assert out.generated(1) == greedy[:min(2, first + 1)]


@pytest.mark.slow
def test_varied_knobs_and_lengths_compile_nothing_new(tiny_sampler):
    sampler, state = tiny_sampler
    # warm-up: batch bucket 4, distinct contexts bucket 4, context 16, new 32
    sampler(state, [[1] * 9, [2] * 9, [3] * 9], max_new_tokens=20)
    # inside those buckets: batch 3-4 (distinct), contexts 1-16 tokens, budgets 17-32 (a row may stop earlier)
    before = compile_counter.compilations()
    rng = np.random.RandomState(0)
    for trial in range(6):
        n = int(rng.randint(3, 5))
        prompts = [list(rng.randint(1, 96, size=rng.randint(1, 17))) for _ in range(n)]
        sampler(state, prompts, max_new_tokens=rng.randint(17, 33, size=n), temperature=rng.uniform(0, 2, size=n),
                top_p=rng.uniform(0.1, 1.0, size=n), top_k=rng.randint(0, 20, size=n),
                key=jax.random.key(trial), stop_ids=[int(rng.randint(96))])
    assert compile_counter.compilations() == before


def test_bucket_count_is_bounded(tiny_sampler):
    sampler, _ = tiny_sampler
    shapes = {sampler.shapes(n, c, m) for n in range(1, 17) for c in range(1, 65) for m in (8, 64, 128)}
    assert len(shapes) == 5 * 3 * 3  # batch {1,2,4,8,16} x context {16,32,64} x new {16,64,128}


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_growing_cache_samples_exactly_what_the_whole_buffer_does(tiny_model, temperature):
    """Decode over cache levels (prefill + 16, + 32, + 64, then the buffer) against decode over the whole buffer
    from the first step: every token, count and finish reason equal, for rows of different context lengths,
    budgets (one ends inside the first level, one runs to the last) and a stop token. Log-probs and entropies
    agree to float32 rounding (1e-5): XLA sums a softmax over fewer slots in another order (measured: 2e-6)."""
    from jaxrl_llm.sampling.sampler import Sampler, decode_levels

    rng = np.random.RandomState(3)
    prompts = [list(rng.randint(1, 96, size=n)) for n in (3, 17, 30, 9)]
    budgets = np.array([100, 12, 70, 45])
    grow, state = Sampler.for_model(tiny_model, pad_id=0, stop_ids=(), decode_level=16)
    whole, _ = Sampler.for_model(tiny_model, pad_id=0, stop_ids=(), decode_level=0)
    b, prefill, slots = grow.shapes(len(prompts), 30, int(budgets.max()))
    assert decode_levels(prefill, slots, 16) == [prefill + 16, prefill + 32, prefill + 64, slots]
    kw = dict(max_new_tokens=budgets, temperature=temperature, key=jax.random.key(7), stop_ids=[11])
    a, c = grow(state, prompts, **kw), whole(state, prompts, **kw)
    assert a.num_generated.max() > 64 and a.num_generated.min() < 16
    for f in ("tokens", "num_generated", "finish_reason"):
        np.testing.assert_array_equal(getattr(a, f), getattr(c, f), err_msg=f)
    for f in ("logprobs", "entropy"):
        np.testing.assert_allclose(getattr(a, f), getattr(c, f), atol=1e-5, rtol=0, err_msg=f)
