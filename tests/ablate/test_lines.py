"""Per-line success of step-by-step answers (jaxrl_llm/ablate/lines.py) against independent oracles: the tested
step profile of jaxrl_llm.data.worked, brute-force pass@k over every subset, and a bootstrap written out
resample by resample."""

import dataclasses
import itertools
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from jaxrl_llm.ablate import intervals, lines
from jaxrl_llm.data.worked import first_error, step_profile, steps


def _problems(rng, n=12):
    """n expressions of 3-6 one-digit terms (2-5 lines)."""
    out = {}
    for i in range(n):
        terms = rng.integers(0, 10, rng.integers(3, 7))
        ops = rng.choice(["+", "-"], len(terms) - 1)
        out[f"u{i}"] = " ".join([str(terms[0])] + [f"{o} {t}" for o, t in zip(ops, terms[1:])])
    return out


def _answer(expr, rng):
    """The worked solution with a wrong line from a random point on (or none), as a policy might write it."""
    want = [line for line, _ in steps(expr)]
    cut = int(rng.integers(0, len(want) + 1))
    got = want[:cut] + ([want[cut].split("=")[0] + "=99"] if cut < len(want) else [])
    if cut < len(want) and rng.random() < 0.5:
        got += want[cut + 1:]  # right lines after the error count for nothing
    return "\n".join(got)


def _completions(exprs, rng, samples, trailing=0.0):
    """Samples of every problem; with `trailing`, that share of the all-lines-right ones is scored wrong (as text
    after the last line makes a scorer do)."""
    rows = []
    for uid, expr in exprs.items():
        for j in range(samples):
            text = _answer(expr, rng)
            rows.append({"uid": uid, "completion": text, "temperature": 1.0, "sample": j,
                         "correct": first_error(text, expr) == len(steps(expr)) and rng.random() >= trailing})
    return rows


def test_counts_match_the_step_profile_and_a_per_sample_count():
    rng = np.random.default_rng(0)
    exprs = _problems(rng)
    rows = _completions(exprs, rng, 6, trailing=0.3)
    greedy = [{**r, "temperature": 0.0, "completion": "nonsense"} for r in rows[:12]]  # another pass: not counted
    c = lines.count_lines(rows + greedy, exprs)
    profile = step_profile([r["completion"] for r in rows], [exprs[r["uid"]] for r in rows],
                           [r["correct"] for r in rows])
    assert c.samples.tolist() == [6] * len(exprs)
    assert c.solved.sum() / c.samples.sum() == pytest.approx(profile["accuracy"], abs=1e-12)
    for k in range(1, int(c.lines.max()) + 1):
        assert c.cond(k) == pytest.approx(profile[f"cond_{k}"], abs=1e-12), k
    # late lines, counted sample by sample: first n // 2 lines right, then all of them (and scored correct)
    num = scored = den = 0
    for r in rows:
        n, fe = len(steps(exprs[r["uid"]])), first_error(r["completion"], exprs[r["uid"]])
        den += fe >= n // 2
        num += fe >= n
        scored += fe >= n and r["correct"]
    assert lines.value(*c.late()) == pytest.approx(num / den, abs=1e-12)
    assert lines.value(*c.late(scored=True)) == pytest.approx(scored / den, abs=1e-12)
    assert 0 < scored < num < den  # the case is not degenerate


def test_counts_survive_json_and_bad_input_is_named():
    rng = np.random.default_rng(1)
    exprs = _problems(rng, 4)
    c = lines.count_lines(_completions(exprs, rng, 3, trailing=0.5), exprs, source={"run": "a/seed0", "step": 4})
    back = lines.LineCounts.from_json(c.to_json())
    assert back.uids == c.uids and back.source == {"run": "a/seed0", "step": 4}
    assert all(np.array_equal(getattr(back, k), getattr(c, k)) for k in ("reach", "solved", "whole", "lines"))
    with pytest.raises(ValueError, match="file.json: shapes disagree"):
        lines.LineCounts.from_json(json.dumps({**json.loads(c.to_json()), "solved": [1]}), "file.json")
    with pytest.raises(ValueError, match="x.json: not line counts"):
        lines.LineCounts.from_json("{}", "x.json")
    with pytest.raises(ValueError, match=r"c.jsonl: 1 problems have no expression \(e.g. uid 'zz'\)"):
        lines.count_lines([{"uid": "zz", "completion": "", "temperature": 1.0, "correct": False}], exprs, 1.0,
                          "c.jsonl")
    with pytest.raises(ValueError, match="no samples at temperature 1.0"):
        lines.count_lines([{"uid": "u0", "completion": "", "temperature": 0.0, "correct": False}], exprs)


def test_pass_k_on_the_problems_unsolved_at_start_against_every_subset():
    rng = np.random.default_rng(2)
    exprs = _problems(rng, 10)
    start = lines.count_lines(_completions(exprs, rng, 2), exprs)
    later = lines.aligned([lines.count_lines(_completions(exprs, rng, 5), exprs)], start.uids, "test")[0]
    hard = lines.unsolved(start)
    assert 0 < len(hard) < len(exprs) and (start.solved[hard] == 0).all()
    for k in (1, 2, 4):
        brute = []
        for p in hard:
            n, c = int(later.samples[p]), int(later.solved[p])
            outcomes = [True] * c + [False] * (n - c)
            subsets = list(itertools.combinations(outcomes, k))
            brute.append(sum(any(s) for s in subsets) / len(subsets))
        num, den = lines.figures(later, hard)[f"pass@{k} unsolved at start"]
        assert lines.value(num, den) == pytest.approx(np.mean(brute), abs=1e-12)
    assert "pass@8 unsolved at start" not in lines.figures(later, hard)  # 5 samples cannot give pass@8


def test_aligned_reorders_and_refuses_another_problem_set():
    rng = np.random.default_rng(3)
    exprs = _problems(rng, 5)
    c = lines.count_lines(_completions(exprs, rng, 2), exprs)
    flipped = lines.aligned([c], tuple(reversed(c.uids)), "w")[0]
    assert flipped.uids == tuple(reversed(c.uids)) and np.array_equal(flipped.reach, c.reach[::-1])
    with pytest.raises(ValueError, match="w: run 0 sampled another problem set"):
        lines.aligned([c], c.uids[:3], "w")


def test_ratio_bootstrap_equals_the_mean_bootstrap_when_every_denominator_is_one():
    rng = np.random.default_rng(4)
    arm, base = rng.random((3, 20, 2)), rng.random((3, 20, 2))
    ones = np.ones_like(arm)
    got = lines.resample_ratio_differences(arm, ones, base, ones, 500, np.random.default_rng(9))
    want = intervals.resample_differences(arm, base, 500, np.random.default_rng(9))
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_ratio_bootstrap_against_one_resample_written_out():
    rng = np.random.default_rng(5)
    s_arm, s_base, p, b = 3, 2, 7, 40
    num_a, den_a = rng.integers(0, 5, (s_arm, p, 1)).astype(float), rng.integers(5, 9, (s_arm, p, 1)).astype(float)
    num_b, den_b = rng.integers(0, 5, (s_base, p, 1)).astype(float), rng.integers(5, 9, (s_base, p, 1)).astype(float)
    got = lines.resample_ratio_differences(num_a, den_a, num_b, den_b, b, np.random.default_rng(11))
    draws = np.random.default_rng(11)  # the same draws, in the documented order: problems, arm seeds, base seeds
    prob, seeds_a, seeds_b = (intervals.draw_counts(n, b, draws) for n in (p, s_arm, s_base))
    for i in range(b):
        def arm_value(num, den, seed_counts):
            ratios = [sum(prob[i, q] * num[s, q, 0] for q in range(p))
                      / sum(prob[i, q] * den[s, q, 0] for q in range(p)) for s in range(num.shape[0])]
            return sum(seed_counts[i, s] * ratios[s] for s in range(num.shape[0])) / num.shape[0]
        want = arm_value(num_a, den_a, seeds_a) - arm_value(num_b, den_b, seeds_b)
        assert got[i, 0] == pytest.approx(want, abs=1e-12)


def test_compare_of_an_arm_with_itself_is_zero_and_a_shift_is_found():
    rng = np.random.default_rng(6)
    exprs = _problems(rng, 30)
    runs = [lines.count_lines(_completions(exprs, rng, 8), exprs) for _ in range(3)]
    runs = lines.aligned(runs, runs[0].uids, "t")
    hard = np.arange(10)
    figs = [lines.figures(c, hard) for c in runs]
    one = [figs[0]] * 3  # three seeds alike: every resample's difference is 0 (up to the sums' rounding)
    same = lines.compare(one, one, resamples=300)
    assert len(same) == 7 and all(line["diff"] == 0 and abs(line["lo"]) < 1e-12 and abs(line["hi"]) < 1e-12
                                  for line in same)
    # an arm whose every sample is right: +1 - base accuracy, interval above 0
    right = [lines.LineCounts(c.uids, c.lines, c.samples.copy(),
                              np.repeat(c.samples[:, None], c.reach.shape[1], axis=1), c.samples.copy()) for c in runs]
    up = {line["figure"]: line for line in lines.compare([lines.figures(c, hard) for c in right], figs, 300)}
    base_acc = np.mean([c.solved.sum() / c.samples.sum() for c in runs])
    assert up["accuracy"]["diff"] == pytest.approx(1 - base_acc) and up["accuracy"]["lo"] > 0
    assert up["late_lines"]["arm"].mean == 1.0 and up["late_lines"]["lo"] > 0


@pytest.mark.slow
def test_late_lines_tool_trains_a_missing_checkpoint_again_and_tables_the_arms(tmp_path, monkeypatch, capsys):
    """tools/late_lines.py end to end on a 1-layer model: a grid of two arms from one warm start (`prepare`), one
    run's folder deleted (a fresh machine), the other kept. The tool trains the deleted one again (on the same
    machine: both its evaluations equal its record's), samples both final policies and the warm start, keeps the
    counts, says the sources are mixed, and makes the same table again from the kept counts alone."""
    import runpy

    import yaml

    from jaxrl_llm import cli
    from tests.helpers import CACHE_DIR, FAST_COMPILE

    monkeypatch.setenv("XLA_FLAGS", FAST_COMPILE)
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", CACHE_DIR)
    monkeypatch.setenv("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.5")
    monkeypatch.chdir(tmp_path)
    base = {"model": {"name": "scratch", "scratch": {"hidden_size": 32, "intermediate_size": 64, "num_layers": 1,
                                                     "num_heads": 2, "num_kv_heads": 1, "head_dim": 16,
                                                     "max_position_embeddings": 96, "tie_embeddings": True}},
            "data": {"source": "reasoning_gym", "task": "basic_arithmetic", "worked": "steps",
                     "task_args": {"min_terms": 3, "max_terms": 3, "min_digits": 1, "max_digits": 1,
                                   "operators": ["+", "-"], "allow_parentheses": False, "allow_negation": False},
                     "train_size": 12, "sft_size": 64, "eval_size": 8, "answer_format": "last_number",
                     "max_prompt_len": 64},
            "rollout": {"prompts_per_step": 4, "group_size": 4, "max_new_tokens": 16},
            "algo": {"micro_batch": 16}, "sft": {"steps": 20, "batch_size": 16, "lr": 3e-3},
            "eval": {"every": 2, "size": 8, "samples": 2}, "reward": {"workers": 1},
            "train": {"steps": 2, "checkpoint_every": 2, "async_checkpoint": False, "tensorboard": False,
                      "export_final": False}}
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(base))
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(yaml.safe_dump({
        "base": "base.yaml", "overrides": ["model.name=warm/final", "sft.steps=0"], "seeds": [0],
        "out_dir": "out", "archive": "kept",
        "prepare": [{"creates": "warm/final/config.json",
                     "run": "jaxrl-llm sft --config base.yaml train.out_dir=warm train.export_final=true"}],
        "arms": {"grpo": [], "cool": ["rollout.temperature=0.5"]}}))
    assert cli.main(["ablate", str(spec_path)]) == 0, capsys.readouterr().err
    shutil.rmtree(tmp_path / "out" / "grpo")  # its checkpoint is gone; cool's stays
    tool = str(Path(__file__).resolve().parents[2] / "tools" / "late_lines.py")
    monkeypatch.setattr(sys, "argv", [tool, str(spec_path), "--samples", "4", "--start-samples", "4",
                                      "--resamples", "200", "--root", "again"])
    with pytest.raises(SystemExit) as done:
        runpy.run_path(tool, run_name="__main__")
    assert done.value.code == 0, capsys.readouterr().err
    kept = tmp_path / "kept" / "late_lines"
    assert sorted(p.relative_to(kept).as_posix() for p in kept.rglob("*.json")) == [
        "cool/seed0.json", "grpo/seed0.json", "runs/grpo/seed0/ablation_done.json", "start.json"]
    text = (tmp_path / "kept" / "late_lines.md").read_text()
    assert "- grpo seed 0: step 0 (the starting policy): equal; step 2: equal" in text
    assert "| cool | 1 |" in text and "| grpo | 1 |" in text and "**Mixed sources**" in text
    counts = lines.LineCounts.from_json((kept / "cool" / "seed0.json").read_text())
    assert counts.samples.tolist() == [4] * 12 and counts.reach.shape == (12, 3)
    summary = json.loads((tmp_path / "again" / "spec" / "eval" / "cool" / "seed0" / "summary.json").read_text())
    assert counts.solved.sum() / 48 == pytest.approx(summary["sampled_accuracy"], abs=1e-12)
    shutil.rmtree(tmp_path / "again")  # the table again from what is kept alone
    monkeypatch.setattr(sys, "argv", [tool, str(spec_path), "--report-only", "--resamples", "200", "--samples", "4",
                                      "--start-samples", "4"])
    with pytest.raises(SystemExit):
        runpy.run_path(tool, run_name="__main__")
    assert (tmp_path / "kept" / "late_lines.md").read_text() == text


def test_a_resample_drawing_a_seed_without_a_denominator_has_no_figure_and_is_counted():
    """Seed 1 of the arm has no sample reaching the first half anywhere: a resample that draws it has no figure
    (dropped, and counted), one that does not draw it is seed 0's ratio over the drawn problems (no NaN leak)."""
    rng = np.random.default_rng(7)
    num = rng.integers(0, 4, (2, 9, 1)).astype(float)
    den = num + rng.integers(1, 4, (2, 9, 1))
    den[1], num[1] = 0.0, 0.0
    base_num, base_den = num[:1] + 1, den[:1] + 2
    got = lines.resample_ratio_differences(num, den, base_num, base_den, 300, np.random.default_rng(3))[:, 0]
    draws = np.random.default_rng(3)
    prob, seeds_a, _ = (intervals.draw_counts(n, 300, draws) for n in (9, 2, 1))
    assert np.array_equal(np.isnan(got), seeds_a[:, 1] > 0) and 0 < np.isnan(got).sum() < 300
    free = np.flatnonzero(seeds_a[:, 1] == 0)
    want = (prob[free] @ num[0, :, 0]) / (prob[free] @ den[0, :, 0]) - (prob[free] @ base_num[0, :, 0]) / (
        prob[free] @ base_den[0, :, 0])
    np.testing.assert_allclose(got[free], want, rtol=1e-12, atol=1e-15)
    arm = [{"late_lines": (num[i, :, 0], den[i, :, 0])} for i in range(2)]
    # whole-run figures: seed 1 has none (nan), so the arm's mean is nan; the interval is over the kept draws
    line = lines.compare(arm, [{"late_lines": (base_num[0, :, 0], base_den[0, :, 0])}], resamples=300, seed=3)[0]
    assert line["dropped"] == int(np.isnan(got).sum()) and np.isfinite(line["lo"])


def _tool():
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "tools" / "late_lines.py"
    spec = importlib.util.spec_from_file_location("late_lines_tool", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_table_aligns_each_runs_problems_to_the_start_and_refuses_another_warm_start():
    from types import SimpleNamespace

    tool = _tool()
    rng = np.random.default_rng(8)
    exprs = _problems(rng, 16)
    src = {"warm_start": "w1"}
    start = lines.count_lines(_completions(exprs, rng, 2), exprs, source=src)
    runs = {arm: {s: lines.count_lines(_completions(exprs, rng, 4, 0.2), exprs, source=src) for s in (0, 1)}
            for arm in ("grpo", "rrl")}
    spec = SimpleNamespace(path="x.yaml")
    text = tool.table(spec, ["grpo", "rrl"], "grpo", start, runs, {}, 200)
    flipped = {arm: {s: c.reordered(tuple(reversed(c.uids))) for s, c in by.items()} for arm, by in runs.items()}
    assert tool.table(spec, ["grpo", "rrl"], "grpo", start, flipped, {}, 200) == text
    assert "| rrl | 2 |" in text and "late_lines_scored" in text
    runs["rrl"][1] = dataclasses.replace(runs["rrl"][1], source={"warm_start": "w2"})
    with pytest.raises(ValueError, match=r"x.yaml: runs counted from another warm start .*rrl seed 1 \(w2\)"):
        tool.table(spec, ["grpo", "rrl"], "grpo", start, runs, {}, 200)
    kept = lines.count_lines(_completions(exprs, rng, 2), exprs, source={"run": "a/seed0", "samples": 8})
    assert tool.stale(kept, {"run": "a/seed0", "samples": 8}) is None
    assert tool.stale(kept, {"run": "a/seed0", "samples": 16}) == "samples 8 (now 16)"
