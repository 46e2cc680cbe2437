"""The update with LoRA adapters (model/lora.py): only the adapters move, by the chain rule of the merged model's
weight gradient (dL/dA = s dL/dW B^T, dL/dB = s A^T dL/dW, s = alpha / rank); the base passes through bit for bit;
the optimizer state is the adapters' alone; the same update on an 8-device mesh equals one device. The sampler's
log-probs of base + adapters against the update's: tests/rl/test_rl_core.py."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from tests.helpers import TINY, update_batch, with_random_adapters
from jaxrl_llm.model import lora
from jaxrl_llm.model.transformer import init_model
from jaxrl_llm.parallel.mesh import make_mesh
from jaxrl_llm.parallel.rules import shard_state
from jaxrl_llm.rl.update import UpdateSpec, abstract_optimizer_state, init_optimizer, make_optimizer, make_update

SPEC = lora.LoraSpec(rank=4, alpha=8.0, targets=tuple(lora.TARGETS))
COEFS = {"eps_low": 0.2, "eps_high": 0.28, "dual_clip": 3.0, "kl_coef": 0.0, "norm_len": 16.0,
         "hindsight_gamma": 1.0}
LR = 0.5
SGD = optax.inject_hyperparams(optax.sgd)


def adapted_model(seed=3):
    """The tiny model with sharp logits and adapters whose B is random (a fresh B = 0 gives dL/dA = 0)."""
    model = init_model(TINY, seed=seed)
    nnx.update(model, jax.tree.map(lambda x: x * 8.0 if x.ndim > 1 else x, nnx.state(model)))
    return with_random_adapters(model, SPEC.rank, SPEC.alpha, scale=0.05)


def _batch(seed=0):
    return update_batch(TINY.vocab_size, seed=seed)


def _step(model, mesh_shape, devices, spec=UpdateSpec(micro_batches=2)):
    mesh = make_mesh(mesh_shape, devices=devices)
    graphdef, state = nnx.split(model)
    params = shard_state(jax.tree.map(jnp.copy, state), mesh)
    opt = SGD(learning_rate=LR)
    update = make_update(graphdef, spec, opt, params, init_optimizer(opt, params, mesh), mesh)
    params, opt_state, metrics = update(params, init_optimizer(opt, params, mesh), _batch(), COEFS)
    return jax.device_get(params), jax.device_get(metrics)


_ONE = {}


def _one_device():
    if not _ONE:
        _ONE["step"] = _step(adapted_model(), {"data": 1}, jax.devices()[:1])
    return _ONE["step"]


def test_only_adapters_move_and_by_the_chain_rule_of_the_merged_weights():
    model = adapted_model()
    before = jax.device_get(nnx.state(model))
    after, metrics = _one_device()
    for x, y in zip(jax.tree.leaves(lora.frozen(before)), jax.tree.leaves(lora.frozen(after))):
        np.testing.assert_array_equal(x, y)  # the base passes through untouched

    # the oracle: one SGD step of the plain model whose weights are the merged ones gives dL/dW
    merged = init_model(TINY, seed=3)
    weights = nnx.to_pure_dict(lora.frozen(nnx.state(model)))
    for (i, sub, name), w in lora.merged_weights(model).items():
        weights["layers"][i][sub][name] = jnp.asarray(w)
    nnx.replace_by_pure_dict(state := nnx.state(merged), weights)
    nnx.update(merged, state)
    plain, plain_metrics = _step(merged, {"data": 1}, jax.devices()[:1])
    assert float(plain_metrics["loss"]) == pytest.approx(float(metrics["loss"]), rel=1e-5)
    plain_before = nnx.to_pure_dict(nnx.state(merged))
    plain_after = nnx.to_pure_dict(plain)
    ours_before, ours_after = nnx.to_pure_dict(before), nnx.to_pure_dict(after)
    s = SPEC.scale
    for i in range(TINY.num_layers):
        for target in SPEC.targets:
            sub, name, in_axes, _ = lora.TARGETS[target]
            n_in = len(in_axes)
            g_w = (np.asarray(plain_before["layers"][i][sub][name], np.float64)
                   - np.asarray(plain_after["layers"][i][sub][name], np.float64)) / LR
            ours = ours_before["layers"][i][sub]
            a, b = (np.asarray(ours[f"{name}_lora_{x}"], np.float64) for x in "ab")
            w_in = g_w.reshape(int(np.prod(g_w.shape[:n_in])), -1)  # [in, out]
            want_a = s * (w_in @ b.reshape(SPEC.rank, -1).T).reshape(a.shape)
            want_b = s * (a.reshape(-1, SPEC.rank).T @ w_in).reshape(b.shape)
            got = ours_after["layers"][i][sub]
            got_a = (a - np.asarray(got[f"{name}_lora_a"], np.float64)) / LR
            got_b = (b - np.asarray(got[f"{name}_lora_b"], np.float64)) / LR
            for got_g, want in ((got_a, want_a), (got_b, want_b)):
                assert np.abs(want).max() > 1e-4, (target, i)
                np.testing.assert_allclose(got_g, want, atol=2e-3 * np.abs(want).max(), err_msg=f"{target} {i}")


def test_optimizer_state_holds_the_adapters_alone():
    model = adapted_model()
    mesh = make_mesh({"data": 1}, devices=jax.devices()[:1])
    params = nnx.state(model)
    state = abstract_optimizer_state(make_optimizer(1e-3), params, mesh)
    adapter_shapes = sorted(x.shape for x in jax.tree.leaves(lora.trainable(params)))
    moments = sorted(x.shape for x in jax.tree.leaves(state) if x.ndim)
    assert moments == sorted(adapter_shapes * 2)  # Adam's two moments, nothing of the base


@pytest.mark.slow
@pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 fake devices")
def test_adapter_update_on_eight_devices_equals_one():
    ref, ref_metrics = _one_device()
    got, metrics = _step(adapted_model(), {"data": 2, "fsdp": 2, "tensor": 2}, None)
    assert float(metrics["loss"]) == pytest.approx(float(ref_metrics["loss"]), rel=1e-5)
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, atol=1e-6), jax.tree.leaves(ref), jax.tree.leaves(got))



def _dropout_step(rate, key, batch):
    """One SGD update of the adapted model with LoRA dropout `rate` and coefs' dropout key `key` (None: none):
    (the adapters after it, its metrics)."""
    model = adapted_model()
    for _, _, module, _ in lora.adapted(model):
        module.lora_dropout = rate
    mesh = make_mesh({"data": 1}, devices=jax.devices()[:1])
    graphdef, state = nnx.split(model)
    params = shard_state(jax.tree.map(jnp.copy, state), mesh)
    opt = SGD(learning_rate=LR)
    update = make_update(graphdef, UpdateSpec(micro_batches=2), opt, params, init_optimizer(opt, params, mesh), mesh)
    coefs = COEFS if key is None else {**COEFS, "dropout_key": np.asarray(jax.random.key_data(jax.random.key(key)))}
    params, _, metrics = update(params, init_optimizer(opt, params, mesh), batch, coefs)
    return [np.asarray(x) for x in jax.tree.leaves(jax.device_get(lora.trainable(params)))], jax.device_get(metrics)


def test_dropout_is_keyed_by_the_call_and_absent_at_rate_zero():
    """Rate 0 with a key is the update without one, bit for bit; at rate 0.5 the adapters' update depends on the
    call's key (the same key twice: the same numbers). The batch's old log-probs are the undropped model's own
    (on-policy), so the log-prob gap the update reports is dropout's alone: 0 without it, not at rate 0.5."""
    from jaxrl_llm.rl.forward import rows_logp

    graphdef, state = nnx.split(adapted_model())
    batch = _batch()
    own = jax.jit(lambda s: rows_logp(nnx.merge(graphdef, s), batch.tokens, batch.temperature))(state)
    old = np.concatenate([np.zeros((batch.tokens.shape[0], 1), np.float32), np.asarray(own)], axis=1)
    batch = dataclasses.replace(batch, old_logp=np.where(batch.loss_mask, old, 0).astype(np.float32))
    plain, plain_m = _dropout_step(0.0, None, batch)
    zero, _ = _dropout_step(0.0, 5, batch)
    for x, y in zip(plain, zero):
        np.testing.assert_array_equal(x, y)
    assert float(plain_m["logp_gap"]) < 1e-6
    a, a_m = _dropout_step(0.5, 5, batch)
    again, _ = _dropout_step(0.5, 5, batch)
    b, _ = _dropout_step(0.5, 6, batch)
    for x, y in zip(a, again):
        np.testing.assert_array_equal(x, y)
    assert max(np.abs(x - y).max() for x, y in zip(a, b)) > 1e-4  # another key, another mask
    assert max(np.abs(x - y).max() for x, y in zip(a, plain)) > 1e-4
    assert float(a_m["logp_gap"]) > 1e-3, a_m["logp_gap"]
