"""Blockwise (online-softmax) attention against the dense reference: values and gradients, causal, sliding
windows, shared-prefix contexts, padded key slots and key counts that are not a multiple of the block; its
memory linear in length (XLA's own analysis of the compiled programs)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm.model.attention import blockwise, dense


def _inputs(seed, b=2, k=2, g=3, t=37, e=16, prefix=0, dtype=jnp.float32):
    """Queries of t tokens (g heads per kv head) after an optional prefix of `prefix` keys; row 1 is right-padded
    (its last 5 tokens are padding at positions past every query) and its prefix holds 4 ignored slots."""
    ks = jax.random.split(jax.random.key(seed), 4)
    s = prefix + t
    q = jax.random.normal(ks[0], (b, k, t * g, e), dtype)
    keys = jax.random.normal(ks[1], (b, k, e, s), dtype)
    values = jax.random.normal(ks[2], (b, k, s, e), dtype)
    pos = np.tile(np.arange(prefix, prefix + t), (b, 1))
    ppos = np.tile(np.arange(prefix), (b, 1))
    if b > 1:
        if prefix >= 4:
            ppos[1, -4:] = 10_000  # ignored prefix slots
        pos[1, -5:] = 10_000 + np.arange(5)  # padding tokens
    kpos = jnp.asarray(np.concatenate([ppos, pos], axis=1), jnp.int32)
    qpos = jnp.asarray(np.repeat(pos, g, axis=1), jnp.int32)  # the t tokens' g heads, flattened t-major
    # the flattened query rows are (token, head) pairs in token order: repeat positions per head
    return q, keys, values, qpos, kpos


def _valid(qpos):
    return np.asarray(qpos < 10_000)[:, None, :, None]  # [B, 1, Q, 1]: rows of real tokens


@pytest.mark.parametrize("window", [None, 7])
@pytest.mark.parametrize("prefix", [0, 11])
@pytest.mark.parametrize("block", [8, 16, 64])
def test_blockwise_values_and_gradients_equal_dense(window, prefix, block):
    q, keys, values, qpos, kpos = _inputs(0, prefix=prefix)
    valid = _valid(qpos)
    want = dense(q, keys, values, qpos, kpos, window)
    got = jax.jit(blockwise, static_argnums=(5, 6))(q, keys, values, qpos, kpos, window, block)
    np.testing.assert_allclose(np.where(valid, got, 0), np.where(valid, want, 0), rtol=2e-5, atol=2e-6)

    cot = jax.random.normal(jax.random.key(1), want.shape) * valid  # padded rows' outputs are never read

    def loss(fn, *args):
        return jnp.sum(fn(*args) * cot)

    gd = jax.grad(lambda a, b_, c: loss(lambda *x: dense(*x, qpos, kpos, window), a, b_, c), (0, 1, 2))(q, keys, values)
    gb = jax.jit(jax.grad(lambda a, b_, c: loss(lambda *x: blockwise(*x, qpos, kpos, window, block), a, b_, c),
                          (0, 1, 2)))(q, keys, values)
    for name, x, y in zip(("q", "keys", "values"), gb, gd):
        assert np.abs(np.asarray(y)).max() > 1e-2, name  # the gradient is not trivially zero
        np.testing.assert_allclose(x, y, rtol=2e-5, atol=2e-5, err_msg=name)


def test_blockwise_in_bfloat16_follows_float32():
    q, keys, values, qpos, kpos = _inputs(2, dtype=jnp.bfloat16, prefix=5)
    valid = _valid(qpos)
    want = dense(*(x.astype(jnp.float32) for x in (q, keys, values)), qpos, kpos, None)
    got = blockwise(q, keys, values, qpos, kpos, None, 16)
    assert got.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.where(valid, got.astype(np.float32), 0), np.where(valid, want, 0), atol=3e-2)


def test_memory_is_linear_in_length():
    """Temporaries of value-and-gradient at 4x the length: about 4x for blockwise, 12x or more for dense (quadratic scores dominate) (XLA's
    memory analysis of the compiled CPU programs)."""

    def temp_bytes(fn, t):
        q, keys, values, qpos, kpos = _inputs(0, b=1, k=1, g=2, t=t, e=32)

        def loss(q, keys, values):
            return jnp.sum(fn(q, keys, values, qpos, kpos, None))

        compiled = jax.jit(jax.value_and_grad(loss, (0, 1, 2))).lower(q, keys, values).compile()
        return compiled.memory_analysis().temp_size_in_bytes

    block = lambda *a: blockwise(*a, 128)  # noqa: E731
    small, large = temp_bytes(block, 1024), temp_bytes(block, 4096)
    d_small, d_large = temp_bytes(dense, 1024), temp_bytes(dense, 4096)
    assert large <= 4.5 * small, (small, large)
    assert d_large >= 10 * d_small, (d_small, d_large)
    assert large * 8 < d_large, (large, d_large)


@pytest.mark.slow
def test_the_models_update_path_with_blocks_equals_dense():
    """The transformer with blockwise attention against itself with dense attention: logits and parameter
    gradients over a shared-prefix context (prefix keys with 3 ignored slots, right-padded rows) and through
    a KV cache (prefill), a sliding window in one layer; transformers is the dense path's oracle
    (tests/model/test_model_oracle.py also checks the blockwise logits against it)."""
    from flax import nnx

    from jaxrl_llm.model.config import ModelConfig
    from jaxrl_llm.model.transformer import KVCache, init_model

    cfg = ModelConfig(vocab_size=61, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                      head_dim=8, max_position_embeddings=256, sliding_window=9, sliding_layers=(1,))
    model = init_model(cfg, seed=1)
    nnx.update(model, jax.tree.map(lambda x: x * 4.0 if x.ndim > 1 else x, nnx.state(model)))
    rng = np.random.RandomState(0)
    p, t = 21, 30
    ptoks = jnp.asarray(rng.randint(0, 61, (2, p)))
    ppos = np.tile(np.arange(p), (2, 1))
    ppos[1, -3:] = 10_000  # ignored prefix slots
    toks = jnp.asarray(rng.randint(0, 61, (2, t)))
    pos = jnp.asarray(np.tile(np.arange(p, p + t), (2, 1)))
    graphdef, state = nnx.split(model)

    def logits(state, block):
        m = nnx.merge(graphdef, state)
        m.attention_block = block
        _, ctx = m(ptoks, jnp.asarray(ppos), return_kv=True)
        hidden, _ = m(toks, pos, prefix=(ctx, jnp.asarray(ppos)))
        return m.logits(hidden)

    def loss(state, block):
        return jnp.sum(jax.nn.log_softmax(logits(state, block))[..., 3])

    logits_j = jax.jit(logits, static_argnums=1)
    grad_j = jax.jit(jax.grad(loss), static_argnums=1)
    want, got = logits_j(state, 0), logits_j(state, 8)
    assert np.abs(np.asarray(want)).max() > 1.0
    np.testing.assert_allclose(got, want, atol=2e-5, rtol=0)
    gd, gb = grad_j(state, 0), grad_j(state, 8)
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, atol=2e-5, rtol=1e-4), gb, gd)

    def prefill(block):  # the sampler's prefill: t tokens written into a cache of 64 slots, attended over all
        m = nnx.merge(graphdef, state)
        m.attention_block = block
        hidden, cache = m(toks, jnp.asarray(np.tile(np.arange(t), (2, 1))), KVCache.zeros(cfg, 2, 64))
        return m.logits(hidden), cache

    prefill_j = jax.jit(prefill, static_argnums=0)
    (lw, cw), (lb, cb) = prefill_j(0), prefill_j(16)
    np.testing.assert_allclose(lb, lw, atol=2e-5, rtol=0)
    np.testing.assert_array_equal(cb.keys[0], cw.keys[0])  # layer 0's keys come before any attention
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, atol=2e-5, rtol=0), cb, cw)
