"""Held-out evaluation measures sampled figures at T=1 and at the run's rollout temperature."""

import dataclasses
import json

import jax
import numpy as np
import pytest

from jaxrl_llm.config import load_config
from jaxrl_llm.train.evaluate import sample_scored
from jaxrl_llm.train.loop import Run


def _cfg(tmp_path, temperature, answers=None, *extra):
    answers = answers or [str(i % 3) for i in range(6)]
    rows = [{"question": f"Held {i}: the magic word?", "answer": a, "scorer": "exact"} for i, a in enumerate(answers)]
    held, data = tmp_path / "held.jsonl", tmp_path / "train.jsonl"
    held.write_text("".join(json.dumps(r) + "\n" for r in rows))
    data.write_text("".join(json.dumps({**r, "question": r["question"].replace("Held", "Train")}) + "\n" for r in rows))
    return load_config(None, [
        "model.name=scratch", "model.scratch={hidden_size: 32, intermediate_size: 64, num_layers: 1, "
        "num_heads: 2, num_kv_heads: 1, head_dim: 16, max_position_embeddings: 96, tie_embeddings: true}",
        "data.source=jsonl", f"data.path={data}", f"data.eval_path={held}", "data.answer_format=raw",
        "data.max_prompt_len=64", "rollout.prompts_per_step=2", "rollout.group_size=4", "rollout.max_new_tokens=3",
        f"rollout.temperature={temperature}", "eval.size=6", "eval.samples=4", "reward.workers=1",
        f"train.out_dir={tmp_path / 'run'}", "train.tensorboard=false", "train.memory_check=false", *extra])


def _evaluate(cfg):
    run = Run(cfg, log=lambda *a: None)
    with run.reward_pool() as pool:
        return run.evaluate(pool)


def test_sampled_figures_at_both_temperatures(tmp_path):
    # a scratch model at init answers "\n" to everything: its weights get noise so that replies differ. The
    # answers are then the model's own greedy replies for half the items (a wrong one for the rest), so greedy
    # accuracy is 1/2; a near-zero rollout temperature samples the argmax token, so its sampled figures must
    # equal greedy's exactly, while T=1 samples the random model's broad distribution and does not
    cfg = _cfg(tmp_path, 1e-4)
    run = Run(cfg, log=lambda *a: None)
    leaves, tree = jax.tree.flatten(run.state.params)
    keys = jax.random.split(jax.random.key(1), len(leaves))
    run.state.params = jax.tree.unflatten(tree, [x + 0.5 * jax.random.normal(k, x.shape, x.dtype)
                                                 for x, k in zip(leaves, keys)])
    with run.reward_pool() as pool:
        n = len(run.eval_items)
        _, _, texts = sample_scored(run.sampler, run.sampling_params(), pool, run.tok, cfg, run.eval_items,
                                    np.arange(n), 0.0, jax.random.key(0))
        assert all(t.strip() for t in texts), texts
        run.eval_items = [(dataclasses.replace(it, answer=t.strip() + ("" if i % 2 == 0 else "#")), ids)
                          for i, ((it, ids), t) in enumerate(zip(run.eval_items, texts))]
        out = run.evaluate(pool)
    assert out["greedy_accuracy"] == 0.5
    assert out["sampled_accuracy"] < 0.5
    assert out["rollout_t"] == pytest.approx(1e-4)
    assert out["rollout_t_sampled_accuracy"] == out["greedy_accuracy"]
    assert out["rollout_t_sampled_reward_mean"] == out["greedy_reward_mean"]
    assert out["rollout_t_never_solved_share"] == pytest.approx(1.0 - out["greedy_accuracy"])
    assert out["rollout_t_pass@4"] == out["greedy_accuracy"]
    for k in ("sampled_accuracy", "never_solved_share", "pass@1", "pass@2", "pass@4", "sampled_reward_mean"):
        assert k in out
    # every sample of both passes and the greedy pass is counted, 1 to 3 tokens each
    assert 6 + 2 * 6 * 4 <= out["sampled_tokens"] <= 3 * (6 + 2 * 6 * 4)


def test_rollout_temperature_one_copies_the_t1_figures(tmp_path):
    out = _evaluate(_cfg(tmp_path, 1.0))
    for k in ("sampled_accuracy", "sampled_reward_mean", "never_solved_share", "pass@1", "pass@4"):
        assert out[f"rollout_t_{k}"] == out[k]
    assert out["sampled_tokens"] <= 3 * (6 + 6 * 4)
