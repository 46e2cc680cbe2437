"""RL core (ALGORITHMS.md §0): advantages against brute force, the loss against a hand computation,
gradient accumulation, and the sharded update on 1 and 8 fake devices."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from jaxrl_llm.parallel.mesh import make_mesh
from jaxrl_llm.parallel.rules import shard_state
from jaxrl_llm.rl.advantages import group_advantages
from jaxrl_llm.rl.batch import RowBatch
from jaxrl_llm.rl.losses import aggregate, clipped_token_loss, hindsight_token_loss, token_logprobs
from jaxrl_llm.rl.update import UpdateSpec, init_optimizer, make_optimizer, make_update
from jaxrl_llm.sampling.sampler import Sampler
from tests.helpers import update_batch, with_random_adapters


def brute_advantages(rewards, groups, valid, estimator):
    out = np.zeros(len(rewards))
    for g in set(groups[valid].tolist()):
        idx = [i for i in range(len(rewards)) if groups[i] == g and valid[i]]
        r = rewards[idx]
        for j, i in enumerate(idx):
            if estimator == "grpo":
                out[i] = 0.0 if len(r) == 1 else (r[j] - r.mean()) / (r.std(ddof=1) + 1e-6)
            elif estimator == "drgrpo":
                out[i] = r[j] - r.mean()
            else:
                out[i] = 0.0 if len(r) == 1 else r[j] - np.delete(r, j).mean()
    return out


@pytest.mark.parametrize("estimator", ["grpo", "drgrpo", "rloo"])
def test_advantages_match_brute_force(estimator):
    rng = np.random.RandomState(0)
    sizes = [1, 2, 3, 5, 8, 4]  # variable group sizes in one static batch
    groups = np.concatenate([np.full(s, g) for g, s in enumerate(sizes)])
    perm = rng.permutation(len(groups))
    groups = groups[perm]
    rewards = rng.choice([0.0, 0.25, 1.0], size=len(groups))
    valid = np.ones(len(groups), bool)
    valid[[3, 7]] = False  # padding rows
    got = group_advantages(jnp.asarray(rewards), jnp.asarray(groups), jnp.asarray(valid), estimator=estimator)
    np.testing.assert_allclose(np.asarray(got), brute_advantages(rewards, groups, valid, estimator), atol=1e-5)


def test_clipped_loss_by_hand():
    # one token per case: (logp - old, advantage) -> expected loss
    cases = [
        (np.log(1.1), 1.0, -1.1),            # inside the clip range: -A * ratio
        (np.log(1.5), 1.0, -1.28),           # clip-higher caps the gain at 1 + 0.28
        (np.log(0.5), 1.0, -0.5),            # A > 0, low ratio: the unclipped term is larger
        (np.log(0.5), -1.0, 0.8),            # A < 0, ratio below 1 - 0.2: clipped at 0.8
        (np.log(5.0), -1.0, 3.0),            # A < 0, huge ratio: dual clip caps at -A * 3
        (np.log(2.0), -2.0, 4.0),            # A < 0, ratio 2 (below 3): -A * ratio
    ]
    d = jnp.asarray([[c[0]] for c in cases], jnp.float32)
    adv = jnp.asarray([c[1] for c in cases], jnp.float32)
    loss, low, high, dual = clipped_token_loss(d, jnp.zeros_like(d), adv, eps_low=0.2, eps_high=0.28, dual_clip=3.0)
    np.testing.assert_allclose(np.asarray(loss)[:, 0], [c[2] for c in cases], atol=1e-6)
    assert np.asarray(high)[:, 0].tolist() == [False, True, False, False, False, False]
    assert np.asarray(low)[:, 0].tolist() == [False, False, False, True, False, False]
    assert np.asarray(dual)[:, 0].tolist() == [False, False, False, False, True, False]


def test_aggregations_by_hand():
    loss = jnp.asarray([[1.0, 2.0, 3.0, 0.0], [4.0, 0.0, 0.0, 0.0]])
    mask = jnp.asarray([[1, 1, 1, 0], [1, 0, 0, 0]], bool)
    kw = dict(total_tokens=4.0, total_seqs=2.0, norm_len=8.0)
    assert float(aggregate(loss, mask, mode="token-mean", **kw)) == pytest.approx(10 / 4)
    assert float(aggregate(loss, mask, mode="seq-mean-token-mean", **kw)) == pytest.approx((2 + 4) / 2)
    assert float(aggregate(loss, mask, mode="seq-mean-token-sum-norm", **kw)) == pytest.approx(10 / 8 / 2)


def _batch(cfg, rows=16, length=24, seed=0):
    return update_batch(cfg.vocab_size, rows, length, seed)


# hindsight_gamma at its default (1.0): the hindsight test's coefficients then have the same structure,
# so its update is the same program as the other two-micro-batch ones (each distinct update program
# costs ~4 s of XLA compilation; identical ones come from the compile cache)
COEFS = {"eps_low": 0.2, "eps_high": 0.28, "dual_clip": 3.0, "kl_coef": 0.0, "norm_len": 16.0,
         "hindsight_gamma": 1.0}
SGD = optax.inject_hyperparams(optax.sgd)  # the rate is optimizer state: every rate shares one program
_RUNS = {}


def _run_update(model, mesh_shape, spec, steps=2, devices=None):
    """(parameters, metrics per step) of `steps` SGD updates; a run asked for again comes from memory."""
    key = (tuple(mesh_shape.items()), spec, steps, None if devices is None else len(devices))
    if key not in _RUNS:
        _RUNS[key] = _run_update_once(model, mesh_shape, spec, steps, devices)
    return _RUNS[key]


def _run_update_once(model, mesh_shape, spec, steps, devices):
    mesh = make_mesh(mesh_shape, devices=devices)
    graphdef, state = nnx.split(model)
    params = shard_state(jax.tree.map(jnp.copy, state), mesh)  # the update donates its input
    # plain SGD: parameters move linearly in the gradients, so comparing them compares gradients
    opt = SGD(learning_rate=0.5)
    opt_state = init_optimizer(opt, params, mesh)
    update = make_update(graphdef, spec, opt, params, opt_state, mesh)
    out = []
    for s in range(steps):
        params, opt_state, metrics = update(params, opt_state, _batch(model.cfg, seed=s), COEFS)
        out.append({k: float(v) for k, v in jax.device_get(metrics).items()})
    return jax.device_get(nnx.to_pure_dict(params)), out


@pytest.mark.slow
@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_micro_batches_equal_one_batch(tiny_model, agg):
    one = _run_update(tiny_model, {"data": 1}, UpdateSpec(loss_agg=agg, micro_batches=1), devices=jax.devices()[:1])
    four = _run_update(tiny_model, {"data": 1}, UpdateSpec(loss_agg=agg, micro_batches=4), devices=jax.devices()[:1])
    for a, b in zip(one[1], four[1]):
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-5)
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, atol=1e-6), one[0], four[0])


@pytest.mark.slow
@pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 fake devices")
@pytest.mark.parametrize("mesh_shape,block", [({"data": 1, "fsdp": 8}, 512), ({"data": 2, "fsdp": 2, "tensor": 2}, 512),
                                              ({"data": 2, "fsdp": 2, "tensor": 2}, 8)],
                         ids=["fsdp", "data-fsdp-tensor", "data-fsdp-tensor-blockwise"])
def test_sharded_update_equals_single_device(tiny_model, mesh_shape, block):
    """block 8: blockwise attention (model/attention.py) on both sides, its key blocks under the mesh."""
    spec = UpdateSpec(micro_batches=2)
    tiny_model.attention_block = block
    try:
        ref_params, ref_metrics = _run_update(tiny_model, {"data": 1}, spec, devices=jax.devices()[:1])
        params, metrics = _run_update(tiny_model, mesh_shape, spec)
    finally:
        tiny_model.attention_block = 512
    for a, b in zip(ref_metrics, metrics):
        for k in ("loss", "grad_norm", "clip_low", "clip_high", "logp_gap"):
            assert a[k] == pytest.approx(b[k], rel=1e-4, abs=1e-6), k
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, atol=1e-5), ref_params, params)
    assert any(abs(a - b).max() > 1e-4 for a, b in
               zip(jax.tree.leaves(ref_params), jax.tree.leaves(nnx.to_pure_dict(nnx.state(tiny_model)))))


def test_nonfinite_loss_skips_the_update(tiny_model):
    mesh = make_mesh({"data": 1}, devices=jax.devices()[:1])
    graphdef, state = nnx.split(tiny_model)
    params = shard_state(jax.tree.map(jnp.copy, state), mesh)
    opt = SGD(learning_rate=0.5)  # a NaN gradient would make every parameter NaN
    opt_state = init_optimizer(opt, params, mesh)
    update = make_update(graphdef, UpdateSpec(), opt, params, opt_state, mesh)
    before = jax.device_get(nnx.to_pure_dict(params))
    batch = _batch(tiny_model.cfg)
    batch.advantages[0] = np.nan
    params, opt_state, metrics = update(params, opt_state, batch, COEFS)
    assert int(metrics["skipped_nonfinite"]) == 1
    jax.tree.map(np.testing.assert_array_equal, before, jax.device_get(nnx.to_pure_dict(params)))


def test_kl_is_zero_against_itself_and_k3_by_hand():
    from jaxrl_llm.rl.losses import kl_penalty
    logp = jnp.asarray([[-1.0, -2.0]])
    ref = jnp.asarray([[-1.5, -2.0]])
    d = -0.5
    np.testing.assert_allclose(np.asarray(kl_penalty(logp, ref, "k3"))[0], [np.exp(d) - d - 1, 0.0], atol=1e-7)
    np.testing.assert_allclose(np.asarray(kl_penalty(logp, ref, "k2"))[0], [0.125, 0.0], atol=1e-7)


def test_k1_as_a_loss_is_refused_with_the_reason():
    from jaxrl_llm.config import ConfigError, load_config
    with pytest.raises(ConfigError, match=r"'algo.kl_estimator' is 'k1': .*zero in expectation on-policy.*use k2"):
        load_config(None, ["algo.kl_estimator=k1", "algo.kl_coef=0.1"])


@pytest.mark.slow
@pytest.mark.parametrize("estimator", ["k2", "k3"])
def test_kl_term_alone_pulls_the_policy_toward_the_reference(tiny_model, estimator):
    """Zero advantages, a reference that differs from the policy: one update with the KL term moves the
    policy's log-probs toward the reference's; without the term (kl_coef 0) nothing moves."""
    from jaxrl_llm.rl.update import make_logprobs
    mesh = make_mesh({"data": 1}, devices=jax.devices()[:1])
    graphdef, state = nnx.split(tiny_model)
    # one program, not an eager op per leaf shape
    noisy = jax.jit(lambda st: jax.tree.map(
        lambda x: x + 0.3 * jax.random.normal(jax.random.key(7), x.shape, x.dtype) * jnp.std(x), st))
    ref = shard_state(noisy(state), mesh)
    batch = _batch(tiny_model.cfg)
    batch.advantages[:] = 0.0
    logprobs = make_logprobs(graphdef, "float32", ref, mesh, rows=16)
    mask = batch.loss_mask & batch.valid[:, None]
    ref_logp = np.asarray(logprobs(ref, batch.tokens, batch.temperature))
    opt = SGD(learning_rate=0.005)
    update = make_update(graphdef, UpdateSpec(use_kl=True, kl_estimator=estimator), opt, ref,
                         init_optimizer(opt, ref, mesh), mesh)  # kl_coef is traced: one program for both

    def distance_after_one_step(kl_coef):
        params = shard_state(jax.tree.map(jnp.copy, state), mesh)
        opt_state = init_optimizer(opt, params, mesh)
        before = np.asarray(logprobs(params, batch.tokens, batch.temperature))
        params, _, m = update(params, opt_state, batch, {**COEFS, "kl_coef": kl_coef}, ref)
        after = np.asarray(logprobs(params, batch.tokens, batch.temperature))
        dist = lambda lp: float(np.abs(lp - ref_logp)[mask].mean())  # noqa: E731
        return dist(before), dist(after), float(m["kl"])

    start, pulled, kl = distance_after_one_step(1.0)
    assert start > 0.05 and kl > 1e-3, (start, kl)  # the reference really differs
    assert pulled < 0.9 * start, (start, pulled)
    same, unmoved, _ = distance_after_one_step(0.0)
    assert unmoved == pytest.approx(same, abs=1e-6)


@pytest.mark.slow
def test_warmup_starts_above_zero_and_lr_metric_is_the_rate_used(tiny_model):
    """The first update of a warmed-up schedule changes the weights, and the reported rate is the one
    that update applied (SGD: the step is lr * grad, so parameter change / grad = reported lr)."""
    from jaxrl_llm.rl.update import lr_schedule
    mesh = make_mesh({"data": 1}, devices=jax.devices()[:1])
    graphdef, state = nnx.split(tiny_model)
    params = shard_state(jax.tree.map(jnp.copy, state), mesh)
    opt = optax.inject_hyperparams(optax.sgd)(learning_rate=lr_schedule(0.4, warmup_steps=2))
    opt_state = init_optimizer(opt, params, mesh)
    update = make_update(graphdef, UpdateSpec(), opt, params, opt_state, mesh)
    probe_opt, probe_rate = SGD(learning_rate=0.5), 0.5  # the step of SGD at 0.5 is 0.5 x the gradient
    grad_probe = make_update(graphdef, UpdateSpec(), probe_opt, params, init_optimizer(probe_opt, params, mesh), mesh)
    reported = []
    for s in range(3):
        batch = _batch(tiny_model.cfg, seed=s)
        before = jax.device_get(nnx.to_pure_dict(params))
        probe_params = shard_state(jax.tree.map(jnp.copy, params), mesh)
        unit, _, _ = grad_probe(probe_params, init_optimizer(probe_opt, probe_params, mesh), batch, COEFS)
        params, opt_state, m = update(params, opt_state, batch, COEFS)
        step = jax.tree.leaves(jax.tree.map(lambda a, b: a - b, jax.device_get(nnx.to_pure_dict(params)), before))
        unit_step = jax.tree.leaves(jax.tree.map(lambda a, b: (a - b) / probe_rate,
                                                 jax.device_get(nnx.to_pure_dict(unit)), before))
        ratio = sum(float(np.vdot(a, b)) for a, b in zip(step, unit_step)) / \
            sum(float(np.vdot(b, b)) for b in unit_step)
        assert ratio == pytest.approx(float(m["lr"]), rel=1e-3), (s, ratio, float(m["lr"]))
        reported.append(float(m["lr"]))
    assert reported == pytest.approx([0.2, 0.4, 0.4])


def test_cosine_schedule_by_hand():
    from jaxrl_llm.rl.update import lr_schedule
    rate = lr_schedule(1.0, warmup_steps=4, schedule="cosine", total_steps=12)
    got = [float(rate(c)) for c in (0, 3, 4, 8, 12, 20)]
    assert got == pytest.approx([0.25, 1.0, 1.0, 0.5, 0.0, 0.0], abs=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("adapters", [False, True], ids=["full", "lora"])
def test_sampler_logprobs_are_the_trainers_at_the_same_positions(tiny_model, tiny_sampler, adapters):
    """Rows sampled by the real sampler (mixed temperatures and lengths, stops) go through the update's
    log-prob pass: the gap is ~0 and no token clips. Shifting old log-probs by one position, the kind
    of off-by-one this guards against, gives a large gap. With LoRA adapters (random B) on every projection too:
    sampler and update both run base + adapters."""
    sampler, state = tiny_sampler
    if adapters:
        tiny_model = with_random_adapters(nnx.clone(tiny_model), scale=0.05)
        sampler, state = Sampler.for_model(tiny_model, pad_id=0, stop_ids=())
    rng = np.random.RandomState(0)
    prompts = [list(rng.randint(1, 96, size=n)) for n in (3, 9, 5, 14, 7, 2, 11, 6) * 2]
    temps = np.tile([0.0, 0.6, 1.0, 1.4], 4).astype(np.float32)
    out = sampler(state, prompts, max_new_tokens=rng.randint(4, 20, size=16), temperature=temps,
                  key=jax.random.key(3))
    batch = RowBatch.make(out.tokens, out.response_mask, context_len=out.context_len, old_logp=out.logprobs,
                          advantages=rng.randn(16), temperature=out.temperature)
    mesh = make_mesh({"data": 1}, devices=jax.devices()[:1])
    graphdef, params = nnx.split(tiny_model)
    params = shard_state(jax.tree.map(jnp.copy, params), mesh)
    opt = SGD(learning_rate=0.0)
    update = make_update(graphdef, UpdateSpec(), opt, params, init_optimizer(opt, params, mesh), mesh)
    _, _, m = update(params, init_optimizer(opt, params, mesh), batch, COEFS)
    assert out.response_mask.sum() > 100
    assert float(m["logp_gap"]) < 1e-5 and float(m["clip_low"]) == 0 and float(m["clip_high"]) == 0, m
    shifted = batch.replace(old_logp=np.roll(out.logprobs, 1, axis=1))
    params = shard_state(jax.tree.map(jnp.copy, nnx.state(tiny_model)), mesh)
    _, _, m = update(params, init_optimizer(opt, params, mesh), shifted, COEFS)
    assert float(m["logp_gap"]) > 0.3 and float(m["clip_low"]) + float(m["clip_high"]) > 0.05, m


_PLAIN = {}  # the plain update's step, shared by the variants


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["kl", "remat", "bf16"])
def test_update_variants_agree_with_the_plain_update(tiny_model, variant):
    """KL against a reference equal to the policy adds nothing at the first step; rematerialisation
    changes no number; bfloat16 compute over float32 weights stays close."""
    mesh = make_mesh({"data": 1}, devices=jax.devices()[:1])
    graphdef, state = nnx.split(tiny_model)
    opt = SGD(learning_rate=0.5)
    batch = _batch(tiny_model.cfg)

    def one_step(spec, graphdef, coefs, ref=None):
        params = shard_state(jax.tree.map(jnp.copy, state), mesh)
        opt_state = init_optimizer(opt, params, mesh)
        update = make_update(graphdef, spec, opt, params, opt_state, mesh)
        params, _, metrics = update(params, opt_state, batch, coefs, ref)
        return jax.device_get(nnx.to_pure_dict(params)), jax.device_get(metrics)

    if "step" not in _PLAIN:
        _PLAIN["step"] = one_step(UpdateSpec(), graphdef, COEFS)
    plain_params, plain = _PLAIN["step"]
    if variant == "kl":
        ref = shard_state(jax.tree.map(jnp.copy, state), mesh)
        params, m = one_step(UpdateSpec(use_kl=True, kl_estimator="k3"), graphdef, {**COEFS, "kl_coef": 0.5}, ref)
        assert abs(float(m["kl"])) < 1e-7
        tol = 1e-6
    elif variant == "remat":
        model = nnx.merge(graphdef, state)
        model.remat = True
        params, m = one_step(UpdateSpec(), nnx.split(model)[0], COEFS)
        tol = 1e-6
    else:
        params, m = one_step(UpdateSpec(compute_dtype="bfloat16"), graphdef, COEFS)
        tol = 2e-2
        assert jax.tree.leaves(params)[0].dtype == np.float32  # master weights stay float32
    assert float(m["loss"]) == pytest.approx(float(plain["loss"]), abs=tol * 10)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=tol), plain_params, params)


@pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 fake devices")
def test_adam_moments_are_sharded_like_the_parameters(tiny_model):
    mesh = make_mesh({"fsdp": 4, "tensor": 2})
    params = shard_state(jax.tree.map(jnp.copy, nnx.state(tiny_model)), mesh)
    opt_state = init_optimizer(make_optimizer(1e-3), params, mesh)
    adam = opt_state[1].inner_state[0]
    for moments in (adam.mu, adam.nu):
        for p, m in zip(jax.tree.leaves(params), jax.tree.leaves(moments)):
            assert m.sharding.is_equivalent_to(p.sharding, p.ndim), (m.sharding, p.sharding)
    assert any(not p.sharding.is_fully_replicated for p in jax.tree.leaves(params))


def test_group_pass_at_k_counts_groups_of_at_least_k_rows_by_brute_force():
    import itertools

    from jaxrl_llm.train.metrics import group_stats

    rng = np.random.RandomState(5)
    sizes = [2, 4, 8, 5, 12]  # E3 groups of varied sizes
    group = np.concatenate([np.full(s, g) for g, s in enumerate(sizes)])
    correct = rng.rand(len(group)) < 0.3
    correct[group == 1] = False  # an all-wrong group

    def brute(g, k):  # share of k-subsets with a correct member
        subsets = list(itertools.combinations(correct[group == g], k))
        return np.mean([any(s) for s in subsets])

    got = group_stats(correct, group)
    for k in (1, 2, 4, 8):
        want = np.mean([brute(g, k) for g, s in enumerate(sizes) if s >= k])
        assert got[f"pass@{k}"] == pytest.approx(want, abs=1e-12), k
    assert "pass@16" not in got and got["groups_all_wrong"] >= 0.2


def test_hindsight_loss_and_its_gradient_by_hand():
    """-A rho / (rho + gamma), no clipping; d/dlogp = -A gamma rho / (rho + gamma)^2."""
    d = np.array([0.0, np.log(5.0), np.log(0.2), np.log(3.0)], np.float32)  # logp - old
    adv = np.array([1.0, 1.0, -2.0, -1.0], np.float32)
    for gamma in (1.0, 0.1):
        rho = np.exp(d.astype(np.float64))
        want = -adv * rho / (rho + gamma)
        loss = hindsight_token_loss(jnp.asarray(d)[:, None], jnp.zeros((4, 1)), jnp.asarray(adv), gamma)
        np.testing.assert_allclose(np.asarray(loss)[:, 0], want, rtol=1e-6)
        grad = jax.grad(lambda x: hindsight_token_loss(x[:, None], jnp.zeros((4, 1)), jnp.asarray(adv), gamma).sum())(
            jnp.asarray(d))
        np.testing.assert_allclose(np.asarray(grad), -adv * gamma * rho / (rho + gamma) ** 2, rtol=1e-5)
    # where the clipped loss is flat (ratio 5, A > 0: capped at 1.28), the hindsight weight still has a gradient
    assert float(jax.grad(lambda x: clipped_token_loss(x[None, None], jnp.zeros((1, 1)), jnp.ones(1), eps_low=0.2,
                                                       eps_high=0.28, dual_clip=3.0)[0].sum())(jnp.log(5.0))) == 0.0


@pytest.mark.slow
def test_hindsight_rows_train_with_the_hindsight_weight_in_the_update(tiny_model):
    """Rows flagged hindsight use -A rho / (rho + gamma), the others the clipped loss, in one program:
    the update's loss and its SGD step equal jax.grad of a reference written from the formulas."""
    graphdef, state = nnx.split(tiny_model)
    batch = _batch(tiny_model.cfg, seed=3)
    flags = np.arange(batch.rows) % 3 == 0
    batch = batch.replace(hindsight=flags)
    coefs = {**COEFS, "hindsight_gamma": 0.5}
    mask = jnp.asarray(batch.loss_mask[:, 1:] & batch.valid[:, None])

    def reference(params):
        model = nnx.merge(graphdef, params)
        inputs = jnp.asarray(batch.tokens[:, :-1])
        hidden, _ = model(inputs, jnp.broadcast_to(jnp.arange(inputs.shape[1]), inputs.shape))
        logp = token_logprobs(model.logits(hidden), jnp.asarray(batch.tokens[:, 1:]), jnp.asarray(batch.temperature))
        old, adv = jnp.asarray(batch.old_logp[:, 1:]), jnp.asarray(batch.advantages)
        ratio = jnp.exp(logp - old)
        clipped = jnp.maximum(-adv[:, None] * ratio, -adv[:, None] * jnp.clip(ratio, 0.8, 1.28))
        clipped = jnp.where(adv[:, None] < 0, jnp.minimum(clipped, -adv[:, None] * 3.0), clipped)
        tok = jnp.where(jnp.asarray(flags)[:, None], -adv[:, None] * ratio / (ratio + 0.5), clipped)
        return jnp.sum(tok * mask) / jnp.sum(mask)

    ref_loss, ref_grad = jax.jit(jax.value_and_grad(reference))(state)
    mesh = make_mesh({"data": 1}, devices=jax.devices()[:1])
    params = shard_state(jax.tree.map(jnp.copy, state), mesh)
    opt = SGD(learning_rate=0.5)
    update = make_update(graphdef, UpdateSpec(micro_batches=2), opt, params, init_optimizer(opt, params, mesh), mesh)
    new, _, metrics = update(params, init_optimizer(opt, params, mesh), batch, coefs)
    assert float(metrics["loss"]) == pytest.approx(float(ref_loss), rel=1e-5)
    jax.tree.map(lambda p0, g, p1: np.testing.assert_allclose(np.asarray(p1), np.asarray(p0 - 0.5 * g),
                                                               atol=2e-6),
                 nnx.to_pure_dict(state), nnx.to_pure_dict(ref_grad), jax.device_get(nnx.to_pure_dict(new)))
