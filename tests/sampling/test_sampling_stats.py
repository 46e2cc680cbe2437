"""Sampling statistics against brute-force distributions computed from the model's full forward."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.stats import chisquare

PROMPT = [3, 14, 15, 92 % 96, 65]
N = 4096


@pytest.fixture(scope="module")
def next_token_logits(tiny_model):
    hidden, _ = tiny_model(jnp.asarray([PROMPT]), jnp.arange(len(PROMPT))[None])
    return np.asarray(tiny_model.logits(hidden))[0, -1].astype(np.float64)


def softmax(x):
    e = np.exp(x - x.max())
    return e / e.sum()


def hf_support(logits, temperature, top_k, top_p):
    """Brute force of Hugging Face's order: temperature, then top-k, then top-p on the renormalised rest."""
    probs = softmax(logits / temperature)
    order = np.argsort(-probs, kind="stable")
    keep = order[:top_k] if top_k > 0 else order
    p = probs[keep] / probs[keep].sum()
    n = max(1, int(np.sum(np.cumsum(p) - p < top_p)))
    support = keep[:n]
    out = np.zeros_like(probs)
    out[support] = probs[support] / probs[support].sum()
    return out


def draw(tiny_sampler, seed, **knobs):
    sampler, state = tiny_sampler
    out = sampler(state, [PROMPT] * N, max_new_tokens=1, key=jax.random.key(seed), **knobs)
    assert (out.num_generated == 1).all()
    return out.tokens[np.arange(N), len(PROMPT)]


def assert_matches(tokens, probs):
    counts = np.bincount(tokens, minlength=probs.size)
    assert counts[probs == 0].sum() == 0, f"tokens outside the support: {np.nonzero(counts * (probs == 0))[0]}"
    expected = probs * len(tokens)
    big = expected >= 5  # pool rare tokens so the chi-square approximation holds
    obs = np.append(counts[big], counts[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    obs, exp = (obs, exp) if exp[-1] > 0 else (obs[:-1], exp[:-1])
    if len(obs) == 1:  # a single possible token: every draw is it (checked above)
        return
    assert chisquare(obs, exp).pvalue > 1e-3


@pytest.mark.slow
@pytest.mark.parametrize("temperature", [0.4, 1.0, 1.8])
def test_frequencies_match_tempered_softmax(tiny_sampler, next_token_logits, temperature):
    tokens = draw(tiny_sampler, 1, temperature=temperature)
    assert_matches(tokens, softmax(next_token_logits / temperature))


def test_a_wrong_temperature_is_detected(tiny_sampler, next_token_logits):
    """The check above has power: samples at T=1 do not pass for T=0.7."""
    tokens = draw(tiny_sampler, 2, temperature=1.0)
    with pytest.raises(AssertionError):
        assert_matches(tokens, softmax(next_token_logits / 0.7))


@pytest.mark.parametrize("top_k,top_p", [(5, 1.0), (0, 0.6), (12, 0.8), (1, 1.0)])
def test_top_k_top_p_support_and_frequencies(tiny_sampler, next_token_logits, top_k, top_p):
    tokens = draw(tiny_sampler, 3, temperature=1.3, top_k=top_k, top_p=top_p)
    assert_matches(tokens, hf_support(next_token_logits, 1.3, top_k, top_p))


def test_temperatures_act_per_row(tiny_sampler, next_token_logits):
    temps = np.array([0.5, 1.5, 0.0, 1.0], np.float32)[np.arange(N) % 4]
    tokens = draw(tiny_sampler, 4, temperature=temps)
    assert (tokens[temps == 0.0] == next_token_logits.argmax()).all()
    for t in (0.5, 1.5, 1.0):
        assert_matches(tokens[temps == t], softmax(next_token_logits / t))
