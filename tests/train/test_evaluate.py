"""Held-out evaluation measures sampled figures at T=1 and at the run's rollout temperature, and with
eval.revise_rounds test-time revise rounds of rubric tasks (their bookkeeping alone: test_revise_eval.py)."""

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


@pytest.mark.slow
@pytest.mark.parametrize("rollout", [(1e-4,), (1.0, "rollout.top_k=1")])
def test_sampled_figures_at_both_temperatures(tmp_path, rollout):
    # a scratch model at init answers "\n" to everything: its weights get noise so that replies differ. The
    # answers are then the model's own greedy replies for half the items (a wrong one for the rest), so greedy
    # accuracy is 1/2; a near-zero rollout temperature samples the argmax token, so its sampled figures must
    # equal greedy's exactly, while T=1 samples the random model's broad distribution and does not. So must the
    # rollouts' top_k=1 at T=1: the second pass samples as the rollouts do (it ignored top_p / top_k before)
    cfg = _cfg(tmp_path, rollout[0], None, *rollout[1:])
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
    assert out["rollout_t"] == pytest.approx(rollout[0])
    assert out["rollout_t_sampled_accuracy"] == out["greedy_accuracy"]
    assert out["rollout_t_sampled_reward_mean"] == out["greedy_reward_mean"]
    assert out["rollout_t_never_solved_share"] == pytest.approx(1.0 - out["greedy_accuracy"])
    assert out["rollout_t_pass@4"] == out["greedy_accuracy"]
    for k in ("sampled_accuracy", "never_solved_share", "pass@1", "pass@2", "pass@4", "sampled_reward_mean"):
        assert k in out
    # every sample of both passes and the greedy pass is counted, 1 to 3 tokens each
    assert 6 + 2 * 6 * 4 <= out["sampled_tokens"] <= 3 * (6 + 2 * 6 * 4)


@pytest.mark.slow
def test_rollout_temperature_one_copies_the_t1_figures(tmp_path):
    # answer tasks (no rubric): eval.revise_rounds does nothing, no figure and no token more
    out = _evaluate(_cfg(tmp_path, 1.0, None, "eval.revise_rounds=2"))
    for k in ("sampled_accuracy", "sampled_reward_mean", "never_solved_share", "pass@1", "pass@4"):
        assert out[f"rollout_t_{k}"] == out[k]
    assert out["sampled_tokens"] <= 3 * (6 + 6 * 4)
    assert not [k for k in out if "revise" in k]


TEMPLATE = "{question}|{draft}|{met}|{unmet}"
WORDS = ("cat", "dog", "sun", "red")


def _word_task(question, word):
    return {"question": question, "rubric": [{"description": word, "weight": 1, "check": "py:contains_all",
                                              "args": {"keywords": [word]}}]}


class _Recording:
    """The run's sampler as it is, keeping the prompts of every call."""

    def __init__(self, sampler):
        self.sampler, self.max_cache_len, self.calls = sampler, sampler.max_cache_len, []

    def __call__(self, params, prompts, **kwargs):
        self.calls.append(([list(p) for p in prompts], kwargs))
        return self.sampler(params, prompts, **kwargs)


@pytest.mark.slow
def test_a_revise_round_meets_what_the_unmet_item_names(tmp_path):
    # a scratch model warm-started (SFT) on two kinds of prompt: a bare question, answered "no", and a revise
    # prompt of the run's template whose unmet item is a word, answered with that word. Held-out tasks ask for
    # "no" (met by the first answer) or for a word (unmet until a revise round names it): greedy accuracy 1/2 at
    # first, 1 after round 1, and only the unmet half is ever sent back
    from jaxrl_llm.train.evaluate import evaluate
    from jaxrl_llm.train.metrics import MetricsWriter
    from jaxrl_llm.train.policy import encode_text
    from jaxrl_llm.train.revise_eval import call_shape, eval_prompts
    from jaxrl_llm.train.stop import StopFlag
    from jaxrl_llm.utils import compile_counter

    sft = []
    for i in range(200):
        w = WORDS[i % 4]
        sft += [{"question": f"Q{i}", "answer": "no", "scorer": "exact"},
                {"question": TEMPLATE.format(question=f"Q{i}", draft="no", met="(none)", unmet=f"- {w}"), "answer": w,
                 "scorer": "exact"}]
    held = [_word_task(f"Q{300 + i}", "no" if i % 2 == 0 else WORDS[i // 2 % 4]) for i in range(8)]
    files = {"sft": sft, "train": [_word_task(f"T{i}", "no") for i in range(4)], "held": held}
    for name, rows in files.items():
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = load_config(None, [
        "model.name=scratch", "model.scratch={hidden_size: 32, intermediate_size: 64, num_layers: 1, num_heads: 2, "
        "num_kv_heads: 1, head_dim: 16, max_position_embeddings: 256, tie_embeddings: true}",
        "data.source=jsonl", f"data.path={tmp_path / 'train.jsonl'}", f"data.eval_path={tmp_path / 'held.jsonl'}",
        f"data.sft_path={tmp_path / 'sft.jsonl'}", "data.answer_format=raw", "data.max_prompt_len=64",
        "rollout.prompts_per_step=2", "rollout.group_size=4", "rollout.max_new_tokens=4", "rollout.temperature=1e-4",
        "eval.size=8", "eval.samples=2", "eval.revise_rounds=2", f"explore.herl.revise_template='{TEMPLATE}'",
        "sft.steps=150", "sft.batch_size=32", "sft.lr=0.003", "algo.micro_batch=32", "reward.workers=1",
        f"train.out_dir={tmp_path / 'run'}", "train.tensorboard=false", "train.memory_check=false"])
    run = Run(cfg, log=lambda *a: None)
    with StopFlag(log=lambda *a: None) as stop:
        run.run_sft(MetricsWriter(tmp_path, tensorboard=False), stop)
    params, items, key = run.sampling_params(), run.eval_items, jax.random.key(3)
    sampler = _Recording(run.sampler)
    with run.reward_pool() as pool:
        plain = evaluate(run.sampler, params, pool, run.tok, dataclasses.replace(
            cfg, eval=dataclasses.replace(cfg.eval, revise_rounds=0)), items, key)
        before = compile_counter.compilations()
        out = evaluate(sampler, params, pool, run.tok, cfg, items, key)
        after = compile_counter.compilations()
        again = evaluate(run.sampler, params, pool, run.tok, cfg, items, key)
    # every revise call of every round and pass runs one program, compiled once (or not at all here, when an earlier
    # test in this worker process already compiled a program of the same shapes: the jit cache is per process)
    assert after - before <= 1 and compile_counter.compilations() == after
    timeless = lambda m: {k: v for k, v in m.items() if k not in ("time_eval_s", "cpu_eval_s")}  # noqa: E731
    assert timeless(again) == timeless(out)
    # the first answers are what they are without rounds (the rounds draw keys of their own)
    revise = {k for k in out if "revise_" in k}
    assert {k: plain[k] for k in plain if k not in ("sampled_tokens", "time_eval_s", "cpu_eval_s")} == \
        {k: out[k] for k in out if k not in revise | {"sampled_tokens", "time_eval_s", "cpu_eval_s"}}
    assert out["greedy_accuracy"] == 0.5 and out["greedy_reward_mean"] == 0.5
    assert out["revise_r1_accuracy"] == 1.0 and out["revise_r1_reward_mean"] == 1.0
    assert (out["revise_r1_sent"], out["revise_r1_improved"], out["revise_r1_worse"]) == (0.5, 0.5, 0.0)
    assert out["revise_r1_tokens"] == 4 * 4  # a word and the end token, for each of the 4 sent back
    assert (out["revise_r2_sent"], out["revise_r2_tokens"], out["revise_r2_accuracy"]) == (0.0, 0, 1.0)
    assert out["revise_best_accuracy"] == 1.0 and out["revise_best_reward_mean"] == 1.0
    # the greedy round's prompts: the revise prompts of the unmet half, the first answer "no" as the draft
    want = [encode_text(run.tok, cfg, TEMPLATE.format(question=f"Q{300 + i}", draft="no", met="(none)",
                                                      unmet=f"- {WORDS[i // 2 % 4]}")) for i in range(1, 8, 2)]
    revise_calls = [(p, kw) for p, kw in sampler.calls if kw.get("min_context")]
    assert revise_calls[0][0] == want and revise_calls[0][1]["temperature"] == 0.0
    prompts = eval_prompts(cfg, [it for it, _ in items], lambda text: encode_text(run.tok, cfg, text))
    assert all((kw["min_rows"], kw["min_context"]) == call_shape(cfg, prompts, 256) for _, kw in revise_calls)
    # at T = 1e-4 the samples are the greedy answers, eval.samples = 2 of each: the same rounds
    for r in (1, 2):
        for k in ("accuracy", "reward_mean", "sent", "improved", "worse"):
            assert out[f"rollout_t_revise_sampled_r{r}_{k}"] == out[f"revise_r{r}_{k}"]
        assert out[f"rollout_t_revise_sampled_r{r}_tokens"] == 2 * out[f"revise_r{r}_tokens"]
    # at T = 1: everything short of full marks (all-or-nothing here) is sent back; accuracy never falls
    assert out["revise_sampled_r1_sent"] == 1.0 - out["sampled_accuracy"]
    assert out["sampled_accuracy"] <= out["revise_sampled_r1_accuracy"] <= out["revise_sampled_r2_accuracy"]
    rounds = sum(v for k, v in out.items() if k.endswith("_tokens") and "revise_" in k)
    assert out["sampled_tokens"] == plain["sampled_tokens"] + rounds
