"""bfloat16 sampling on CPU (issue 28's bf16 path): XLA:CPU runs bf16 dots natively only when they accumulate into
a float32 result, and has no native bf16 batched dot or scatter, so the model asks every dot for a float32 result
(model/transformer.py `dot`, `logits`) and the sampler keeps a float32 KV cache of the bf16-rounded keys and values
(sampling/decode.py `cache_dtype`). Checked here: the compiled decode step converts no weight and no cache to
float32 (before: every MLP weight and every cache, at every step), and the float32 cache samples what a bf16 cache
samples (the same numbers: greedy tokens equal, log-probs to bf16 rounding)."""

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxrl_llm.model.transformer import KVCache, init_model
from jaxrl_llm.rl.forward import cast_floats
from jaxrl_llm.sampling import decode
from jaxrl_llm.sampling.sampler import Sampler
from tests.helpers import TINY


@pytest.mark.parametrize("tied", [False, True])
def test_the_bf16_decode_step_converts_no_weight_or_cache_to_float32(tied):
    cfg = dataclasses.replace(TINY, tie_embeddings=tied)
    graphdef, state = nnx.split(init_model(cfg, seed=0))
    state = cast_floats(state, jnp.bfloat16)
    assert decode.cache_dtype(jnp.bfloat16, "cpu") == jnp.float32
    assert decode.cache_dtype(jnp.bfloat16, "gpu") == jnp.bfloat16 == decode.cache_dtype(jnp.bfloat16, "tpu")
    cache = KVCache.zeros(cfg, 4, 64, dtype=decode.cache_dtype(jnp.bfloat16, "cpu"))

    def step(state, tok, cache):
        model = nnx.merge(graphdef, state)
        hidden, cache = model(tok, jnp.full((4, 1), 5), cache)
        return model.logits(hidden[:, 0]), cache

    hlo = jax.jit(step).lower(state, jnp.ones((4, 1), jnp.int32), cache).compile().as_text()
    big = {tuple(x.shape) for x in jax.tree.leaves(state) if x.ndim > 1} | {x.shape for x in cache.keys + cache.values}
    # materialised float32 copies: instructions named *convert* outside the fused computations (inside a fusion a
    # convert is computed element by element as the fusion reads, e.g. the embedding rows a gather takes)
    blocks = [b for b in hlo.split("\n\n") if not re.match(r"%(fused|wrapped)\w*computation", b.lstrip())]
    shapes = {tuple(int(d) for d in m[1].split(",")) for b in blocks
              for m in re.finditer(r"%\w*convert[\w.]* = f32\[([\d,]+)\]", b)}
    assert not shapes & big, sorted(shapes & big)
    assert re.search(r"%\w*convert[\w.]* = ", hlo)  # the pattern finds converts (of activations) where they are


def test_a_float32_cache_samples_what_a_bf16_cache_samples(tiny_model, monkeypatch):
    graphdef, state = nnx.split(tiny_model)
    state = cast_floats(state, jnp.bfloat16)
    rng = np.random.RandomState(0)
    prompts = [list(rng.randint(1, 96, size=k)) for k in (3, 9, 17, 30)]
    outs = []
    for dtype in (jnp.float32, jnp.bfloat16):
        monkeypatch.setattr(decode, "cache_dtype", lambda d, platform=None, dtype=dtype: jnp.dtype(dtype))
        sampler = Sampler(graphdef, pad_id=0, stop_ids=())
        outs.append([sampler(state, prompts, max_new_tokens=24, temperature=t, key=jax.random.key(1))
                     for t in (0.0, 1.0)])
    for a, b in zip(*outs):
        np.testing.assert_array_equal(a.tokens, b.tokens)
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=2e-2, rtol=0)
