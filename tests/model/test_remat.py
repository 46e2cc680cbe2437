"""model.remat: the same gradients, and activations actually recomputed (not stored) on this backend too."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from tests.helpers import TINY
from jaxrl_llm.model.remat import remat
from jaxrl_llm.model.transformer import init_model


def _compiled(fn, *args):
    return jax.jit(fn).lower(*args).compile()


def test_remat_gives_the_plain_gradients_and_stores_only_the_layers_inputs():
    layers, n, d, f = 12, 512, 64, 256
    keys = jax.random.split(jax.random.key(0), layers)
    ws = [tuple(jax.random.normal(jax.random.fold_in(k, i), s) * 0.05 for i, s in enumerate([(d, f), (d, f), (f, d)]))
          for k in keys]
    x = jax.random.normal(jax.random.key(1), (n, d))

    def layer(w, h):
        return h + (jax.nn.silu(h @ w[0]) * (h @ w[1])) @ w[2]

    def loss(ws, h, step):
        for w in ws:
            h = step(w, h)
        return jnp.mean(h ** 2)

    grad = {name: jax.grad(lambda ws, h, step=step: loss(ws, h, step), argnums=(0, 1))
            for name, step in (("plain", layer), ("remat", remat(layer)), ("checkpoint", jax.checkpoint(layer)))}
    compiled = {name: _compiled(g, ws, x) for name, g in grad.items()}
    plain, ours = compiled["plain"](ws, x), compiled["remat"](ws, x)
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), plain, ours)
    # stored per layer without remat: the [n, f] gate, up and their product (about 3 x 512 KiB); with it, the
    # [n, d] input (128 KiB) and one layer's recomputation at a time
    temp = {name: c.memory_analysis().temp_size_in_bytes for name, c in compiled.items()}
    assert temp["remat"] < 0.3 * temp["plain"], temp
    assert temp["remat"] < temp["checkpoint"], temp  # what jax.checkpoint leaves to the backend's passes


def test_model_remat_changes_no_gradient_and_shrinks_the_backward_pass():
    cfg = dataclasses.replace(TINY, num_layers=8, intermediate_size=256)
    model = init_model(cfg, seed=0)
    graphdef, state = nnx.split(model)
    remat_model = nnx.merge(graphdef, state)
    remat_model.remat = True
    remat_graphdef = nnx.split(remat_model)[0]
    tokens = jax.random.randint(jax.random.key(2), (8, 64), 0, cfg.vocab_size)
    positions = jnp.broadcast_to(jnp.arange(64), tokens.shape)

    def loss(graphdef):
        def f(state):
            m = nnx.merge(graphdef, state)
            hidden, _ = m(tokens[:, :-1], positions[:, :-1])
            logp = jax.nn.log_softmax(m.logits(hidden))
            return -jnp.mean(jnp.take_along_axis(logp, tokens[:, 1:, None], -1))
        return jax.grad(f)

    plain, ours = _compiled(loss(graphdef), state), _compiled(loss(remat_graphdef), state)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=1e-7),
                 plain(state), ours(state))
    temp = [c.memory_analysis().temp_size_in_bytes for c in (plain, ours)]
    assert temp[1] < 0.6 * temp[0], temp
