"""jaxrl_llm/ablate/intervals.py (`jaxrl-llm ablate-ci`): the paired hierarchical bootstrap against exact
enumeration, analytic widths and its coverage on synthetic data; per-problem figures against brute force; the
eval-vs-run check refusing a mismatch; the command end to end on hand-built run records and evals."""

import itertools
import json
import math
from pathlib import Path

import numpy as np
import pytest
import yaml
from scipy.stats import ttest_ind

from jaxrl_llm import cli
from jaxrl_llm.ablate import intervals
from jaxrl_llm.ablate.records import REWARD_COLUMNS
from jaxrl_llm.data.types import TaskItem
from tests.helpers import done_marker

ROOT = Path(__file__).resolve().parents[2]


def _interval(arm, base, resamples=4000, seed=0):
    diffs = intervals.resample_differences(np.asarray(arm, float), np.asarray(base, float), resamples,
                                           np.random.default_rng(seed))
    lo, hi = intervals.percentile_interval(diffs)
    return diffs, lo, hi


def test_identical_arms_give_an_interval_centred_on_zero():
    values = np.random.default_rng(1).integers(0, 2, size=(3, 50, 2))  # 3 seeds that differ, 50 problems
    _, lo, hi = _interval(values, values)
    assert np.all(lo < 0) and np.all(hi > 0)
    assert np.all(np.abs(lo + hi) < 0.1 * (hi - lo))  # symmetric: swapping the arms leaves the draw's law unchanged
    _, lo1, hi1 = _interval(values[:1], values[:1])  # one seed each: every resample's difference is exactly 0
    assert np.all(lo1 == 0) and np.all(hi1 == 0)


def test_a_constant_shift_gives_the_shift_exactly():
    base = np.tile(np.random.default_rng(2).random((1, 40, 3)), (3, 1, 1))  # seeds alike: only problems vary
    diffs, lo, hi = _interval(base + 0.1, base)
    np.testing.assert_allclose(diffs, 0.1, atol=1e-12)
    np.testing.assert_allclose(lo, 0.1, atol=1e-12)
    np.testing.assert_allclose(hi, 0.1, atol=1e-12)


def _exact_cdf(arm, base, paired: bool):
    """The bootstrap law of arm - baseline by enumerating every equally likely ordered draw of seeds and problems."""
    s_a, p = arm.shape
    s_b = base.shape[0]
    draws = list(itertools.product(range(p), repeat=p))
    out = []
    for sa in itertools.product(range(s_a), repeat=s_a):
        for sb in itertools.product(range(s_b), repeat=s_b):
            for pa in draws:
                for pb in ([pa] if paired else draws):
                    out.append(np.mean([arm[i, list(pa)].mean() for i in sa]) -
                               np.mean([base[j, list(pb)].mean() for j in sb]))
    return np.round(np.array(out), 12)


def test_bootstrap_law_matches_exact_enumeration_and_is_paired():
    arm = np.array([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    base = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    exact = _exact_cdf(arm, base, paired=True)
    unpaired = _exact_cdf(arm, base, paired=False)
    atoms = np.unique(np.concatenate([exact, unpaired]))
    cdf = lambda x: np.array([np.mean(x <= a + 1e-9) for a in atoms])  # noqa: E731
    assert np.max(np.abs(cdf(exact) - cdf(unpaired))) > 0.05  # so the comparison below can tell the two apart
    diffs, _, _ = _interval(arm[:, :, None], base[:, :, None], resamples=40000, seed=3)
    assert np.max(np.abs(cdf(diffs[:, 0]) - cdf(exact))) < 0.012  # Kolmogorov distance; its noise sd ~0.0025
    assert diffs.mean() == pytest.approx(exact.mean(), abs=0.003)


def test_pairing_cancels_a_shared_problem_effect():
    """One seed each, so only problems vary: the paired interval's width is 2 x 1.96 x sd(a_p - b_p) / sqrt(P)
    and far narrower than the unpaired sqrt(var a + var b) / sqrt(P) when problems are mostly easy or hard."""
    rng = np.random.default_rng(4)
    q = np.where(rng.random(400) < 0.5, 0.03, 0.97)
    base = (rng.random(400) < q).astype(float)
    arm = (rng.random(400) < np.clip(q + 0.02, 0, 1)).astype(float)
    _, lo, hi = _interval(arm[None, :, None], base[None, :, None], resamples=20000, seed=5)
    paired = 2 * 1.96 * np.std(arm - base) / math.sqrt(400)
    unpaired = 2 * 1.96 * math.sqrt(np.var(arm) + np.var(base)) / math.sqrt(400)
    assert hi[0] - lo[0] == pytest.approx(paired, rel=0.08)
    assert hi[0] - lo[0] < 0.5 * unpaired


def test_coverage_on_bernoulli_problems_with_a_known_difference():
    """Problems with success q ~ U(0.05, 0.85) under the baseline and q + 0.1 under the arm: the true difference
    is 0.1 exactly; 400 independent data sets of 100 problems: the 95 % interval covers it ~95 % of the time
    (binomial sd 0.011; an unpaired interval would cover ~98 %, one without problem resampling ~0 %)."""
    rng = np.random.default_rng(6)
    covered = 0
    for _ in range(400):
        q = rng.uniform(0.05, 0.85, 100)
        arm, base = (rng.random(100) < q + 0.1).astype(float), (rng.random(100) < q).astype(float)
        diffs = intervals.resample_differences(arm[None, :, None], base[None, :, None], 1000, rng)
        lo, hi = intervals.percentile_interval(diffs)
        covered += bool(lo[0] <= 0.1 <= hi[0])
    assert 0.92 <= covered / 400 <= 0.975


def _brute_pass(outcomes, k):
    """pass@k: the share of k-subsets of the samples that hold a correct one."""
    subsets = list(itertools.combinations(outcomes, k))
    return sum(any(s) for s in subsets) / len(subsets)


def _rows(outcomes: dict, greedy: dict, temps=(1.0, 0.5)):
    rows = [{"uid": u, "question": f"q {u}", "temperature": 0.0, "sample": 0, "correct": bool(g)}
            for u, g in greedy.items()]
    for t in temps:
        rows += [{"uid": u, "question": f"q {u}", "temperature": t, "sample": j, "correct": bool(c)}
                 for u, cs in outcomes[t].items() for j, c in enumerate(cs)]
    return rows


def _figures(outcomes: dict, greedy: dict, ks=(2, 4)) -> dict:
    """The in-training evaluation's figures by hand: means over problems of brute-force per-problem values."""
    out = {"greedy_accuracy": float(np.mean(list(greedy.values())))}
    for prefix, t in (("", 1.0), ("rollout_t_", 0.5)):
        per = list(outcomes[t].values())
        out[f"{prefix}sampled_accuracy"] = float(np.mean(per))
        out[f"{prefix}never_solved_share"] = float(np.mean([not any(p) for p in per]))
        out.update({f"{prefix}pass@{k}": float(np.mean([_brute_pass(p, k) for p in per])) for k in ks})
    return out


def _outcomes(seed: int, problems: int = 5):
    rng = np.random.default_rng(seed)
    return ({t: {f"u{i}": list(rng.integers(0, 2, 4)) for i in range(problems)} for t in (1.0, 0.5)},
            {f"u{i}": int(rng.integers(0, 2)) for i in range(problems)})


def test_problem_values_against_brute_force():
    outcomes, greedy = _outcomes(7)
    problems, values = intervals.problem_values(_rows(outcomes, greedy), 0.5, [1, 2, 4])
    rewarded = [{**r, "reward": 0.1 * (r["sample"] + 1) + r["correct"]} for r in _rows(outcomes, greedy)]
    with_rewards = intervals.problem_values(rewarded, 0.5, [1, 2, 4])[1]
    assert sorted(set(with_rewards) - set(values)) == sorted(REWARD_COLUMNS)
    for t, prefix in ((1.0, ""), (0.5, "rollout_t_")):
        want = [np.mean([0.1 * (j + 1) + c for j, c in enumerate(outcomes[t][f"u{i}"])]) for i in range(5)]
        np.testing.assert_allclose(with_rewards[f"{prefix}sampled_reward_mean"], want, atol=1e-12)
    np.testing.assert_allclose(with_rewards["greedy_reward_mean"], [0.1 + greedy[f"u{i}"] for i in range(5)])
    assert problems == tuple((f"u{i}", f"q u{i}") for i in range(5))
    assert sorted(values) == sorted(_figures(outcomes, greedy))
    for name, want in _figures(outcomes, greedy).items():
        assert values[name].mean() == pytest.approx(want, abs=1e-12), name
    np.testing.assert_array_equal(values["never_solved_share"], [not any(outcomes[1.0][f"u{i}"]) for i in range(5)])


def test_check_figures_refuses_a_mismatch():
    run = {"greedy_accuracy": 0.25, "sampled_accuracy": 0.5, "pass@4": 0.75, "time_eval_s": 3.0}
    assert intervals.check_figures({**run, "time_eval_s": 9.0, "pass@4": 0.75 + 5e-7}, run, "x") == 3
    with pytest.raises(intervals.EvalMismatch, match=r"x: 1 of 3 figures differ .*pass@4: 0.75002 vs 0.75"):
        intervals.check_figures({**run, "pass@4": 0.75002}, run, "x")
    with pytest.raises(intervals.EvalMismatch, match="no held-out figure in common"):
        intervals.check_figures({"pass@4": 0.75}, {"pass@4": 0.75}, "x")


def test_difficulty_key_reads_the_items_difficulty_or_the_varying_task_parameters():
    entry = {"metadata": {"num_terms": 4, "num_digits": 1, "difficulty": {"num_terms": [2, 5], "num_digits": [1, 1]}}}
    item = TaskItem("a", "q", "1", "reasoning_gym:x", json.dumps(entry))
    assert intervals.difficulty_key(item) == (("num_terms", 4),)
    fixed = {"metadata": {"num_terms": 7, "difficulty": {"num_terms": [7, 7]}}}
    assert intervals.difficulty_key(TaskItem("a", "q", "1", "reasoning_gym:x", json.dumps(fixed))) is None
    assert intervals.difficulty_key(TaskItem("a", "q", "1", "math", difficulty=0.9)) == (("difficulty", "0.8-1.0"),)


def test_difficulty_groups_split_arithmetic_chains_by_their_number_of_terms(tmp_path):
    """Groups from the run's own task data, checked against the terms counted in each question's text."""
    from jaxrl_llm.data.tasks import load_splits
    from jaxrl_llm.config import load_config

    cfg = yaml.safe_load((ROOT / "configs" / "toy.yaml").read_text())
    cfg["data"].update(task_args={**cfg["data"]["task_args"], "min_terms": 2, "max_terms": 5}, eval_size=40)
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg))
    held = load_splits(load_config(tmp_path / "config.yaml", []).data)[1]
    problems = [(it.uid, it.question) for it in held]
    terms = [it.question.count(" + ") + it.question.count(" - ") + 1 for it in held]
    groups = intervals.difficulty_groups(tmp_path / "config.yaml", problems)
    assert list(groups) == [f"num_terms={n}" for n in sorted(set(terms))] and len(groups) >= 3
    for name, idx in groups.items():
        np.testing.assert_array_equal(idx, [i for i, t in enumerate(terms) if f"num_terms={t}" == name])
    assert intervals.difficulty_groups(tmp_path / "config.yaml", [(problems[0][0], "another question")]) == {}


def _write_run(spec_dir, arm, seed, outcomes, greedy, run_row_edit=None, tokens=100):
    """A finished run's record and its eval at the final step, as the harness and `jaxrl-llm eval` leave them."""
    figures = _figures(outcomes, greedy)
    run_dir = spec_dir / "out" / arm / f"seed{seed}"
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text("train: {steps: 2}\n")
    row = {"step": 2, "kind": "eval", "problems": 5, **figures, **(run_row_edit or {})}
    rows = [{"step": 1, "kind": "train", "sampled_tokens": tokens, "time_step_s": 1.0 + seed}, row]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run_dir / "ablation_done.json").write_text(done_marker(spec_dir / "spec.yaml", arm, seed))
    out = spec_dir / "out" / "eval" / arm / f"seed{seed}"
    out.mkdir(parents=True)
    summary = {"step": 2, "problems": 5, "rollout_t": 0.5, "pass_k": [1, 2, 4], **figures}
    (out / "summary.json").write_text(json.dumps(summary))
    (out / "completions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _rows(outcomes, greedy)))
    return figures


def test_ablate_ci_end_to_end_and_refuses_an_eval_that_is_not_the_runs(tmp_path, capsys):
    (tmp_path / "base.yaml").write_text("train: {steps: 2}\n")
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(yaml.safe_dump({"base": str(tmp_path / "base.yaml"), "seeds": [0, 1],
                                         "out_dir": str(tmp_path / "out"), "arms": {"grpo": [], "m": []}}))
    figs = {(arm, s): _write_run(tmp_path, arm, s, *_outcomes(10 * i + s), tokens=100 * (i + 1) + 10 * s)
            for i, arm in enumerate(("grpo", "m")) for s in (0, 1)}
    assert cli.main(["ablate-ci", str(spec_path), "--resamples", "2000"]) == 0
    text = (tmp_path / "out" / "intervals.md").read_text()
    assert capsys.readouterr().out == text + "\n"
    assert "## m vs grpo\n\nSeeds 0, 1 vs 0, 1; rollout T 0.5. Budget per run (mean): sampled tokens 205 vs 105, " \
        "wall s 1.5 vs 1.5." in text
    for name, label in (("greedy_accuracy", "greedy"), ("rollout_t_pass@2", "pass@2 T=run")):
        a = [figs["m", s][name] for s in (0, 1)]
        b = [figs["grpo", s][name] for s in (0, 1)]
        line = next(ln for ln in text.splitlines() if ln.startswith(f"| {label} |"))
        cells = [c.strip() for c in line.split("|")[1:-1]]
        assert cells[1] == f"{np.mean(a):.3f} ± {np.std(a, ddof=1):.3f}"
        assert cells[3] == f"{np.mean(a) - np.mean(b):+.3f}"
        lo, hi = (float(x) for x in cells[4].strip("[]").split(","))
        assert lo <= np.mean(a) - np.mean(b) <= hi and cells[5] == ("yes" if lo > 0 or hi < 0 else "no")
        assert np.var(a) + np.var(b) > 0  # the data give this figure a spread over seeds: a p to compare
        assert cells[6] == f"{ttest_ind(a, b, equal_var=False).pvalue:.3f}"
    flat = [[figs[arm, s]["rollout_t_pass@4"] for s in (0, 1)] for arm in ("m", "grpo")]
    assert np.ptp(flat[0]) == np.ptp(flat[1]) == 0  # no spread on either side: no p, an empty cell
    assert next(ln for ln in text.splitlines() if ln.startswith("| pass@4 T=run |")).endswith("| no |  |")

    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "base.yaml").write_text("train: {steps: 2}\n")
    spec_path = bad / "spec.yaml"
    spec_path.write_text(yaml.safe_dump({"base": str(bad / "base.yaml"), "seeds": [0], "out_dir": str(bad / "out"),
                                         "arms": {"grpo": [], "m": []}}))
    _write_run(bad, "grpo", 0, *_outcomes(0))
    _write_run(bad, "m", 0, *_outcomes(1), run_row_edit={"greedy_accuracy": 0.123})
    assert cli.main(["ablate-ci", str(spec_path), "--arms", "m"]) == 1
    err = capsys.readouterr().err
    assert "THE EVAL IS NOT THE RUN'S: m seed 0: the eval in" in err
    eval_greedy = _figures(*_outcomes(1))["greedy_accuracy"]
    assert f"1 of 9 figures differ by more than 1e-06: greedy_accuracy: {eval_greedy!r} vs 0.123" in err
    assert not (bad / "out" / "intervals.md").exists()


def _write_archived(spec_dir, arm, seed, outcomes, greedy, run_row_edit=None, tokens=100, partial=False):
    """A finished run as the archive keeps it when the trainer wrote its per-problem outcomes (train/outcomes.py):
    config, metrics and the final evaluation's held_out/step2.jsonl; no run folder, checkpoint or eval. Rewards
    are the correct flags (a 0/1 task), or with `partial` a rubric's partial credit: 0.75 if correct, else 0.25
    (the row's reward figures then 0.25 + 0.5 x each accuracy)."""
    from jaxrl_llm.train import outcomes as held_out

    figures = _figures(outcomes, greedy)
    if partial:
        figures.update({r: 0.25 + 0.5 * figures[a] for r, a in REWARD_COLUMNS.items()})
    record = spec_dir / "archive" / "runs" / arm / f"seed{seed}"
    record.mkdir(parents=True)
    (record / "config.yaml").write_text("train: {steps: 2}\n")
    row = {"step": 2, "kind": "eval", "problems": 5, "rollout_t": 0.5, **figures, **(run_row_edit or {})}
    rows = [{"step": 1, "kind": "train", "sampled_tokens": tokens, "time_step_s": 1.0 + seed}, row]
    (record / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (record / "ablation_done.json").write_text(done_marker(spec_dir / "spec.yaml", arm, seed))
    items = [(TaskItem(u, f"q {u}", "7", "exact"), [1]) for u in greedy]
    flags = {0.0: [greedy[u] for u in greedy], **{t: [c for u in greedy for c in outcomes[t][u]] for t in outcomes}}
    held_out.write(record, 2, items, {t: (0.25 + 0.5 * np.asarray(f, float) if partial else np.asarray(f, float),
                                          np.asarray(f, bool)) for t, f in flags.items()})
    return figures


def test_partial_credit_rewards_are_bootstrapped_and_checked_against_the_runs_row(tmp_path, capsys):
    """A rubric task's rewards (partial credit) get their own rows: greedy reward and sampled reward at each
    temperature, each run's mean checked against its own row first; with rewards 0.25 + 0.5 x correct every
    reward difference is half the accuracy difference, interval included (the same resamples). 0/1 rewards add
    no rows (they would repeat the accuracy rows): see the test above."""
    d = tmp_path
    (d / "base.yaml").write_text("train: {steps: 2}\n")
    spec = {"base": str(d / "base.yaml"), "seeds": [0, 1], "out_dir": str(d / "out"), "archive": str(d / "archive"),
            "arms": {"grpo": [], "m": []}}
    (d / "spec.yaml").write_text(yaml.safe_dump(spec))
    for i, arm in enumerate(("grpo", "m")):
        for s in (0, 1):
            _write_archived(d, arm, s, *_outcomes(10 * i + s), partial=True)
    assert cli.main(["ablate-ci", str(d / "spec.yaml"), "--resamples", "2000"]) == 0
    capsys.readouterr()
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ") for line in
            (d / "archive" / "intervals.md").read_text().splitlines() if line.startswith("| ")}

    def diff_and_interval(label):
        lo, hi = rows[label][4].strip("[]").split(", ")
        return float(rows[label][3]), float(lo), float(hi)

    for reward, acc in (("greedy reward", "greedy"), ("sampled reward T=1", "sampled T=1"),
                        ("sampled reward T=run", "sampled T=run")):
        assert diff_and_interval(reward) == pytest.approx([0.5 * v for v in diff_and_interval(acc)], abs=1.5e-3)
    metrics = d / "archive" / "runs" / "m" / "seed0" / "metrics.jsonl"
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    rows[-1]["greedy_reward_mean"] += 0.01  # the run's row no longer what its outcomes give
    metrics.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert cli.main(["ablate-ci", str(d / "spec.yaml"), "--resamples", "1000"]) == 1
    assert "greedy_reward_mean" in capsys.readouterr().err


def test_ablate_ci_reads_the_trainers_own_outcomes_from_the_archive_alone(tmp_path, capsys):
    """Records whose final evaluation's per-problem outcomes the trainer wrote give the same table as evals of
    their checkpoints would, from the archive alone (a fresh machine: no run folder, checkpoint or eval); a file
    whose outcomes do not reproduce the run's row is refused, naming it."""
    tables = {}
    for how, writer in (("evals", _write_run), ("archive", _write_archived)):
        d = tmp_path / how
        d.mkdir()
        (d / "base.yaml").write_text("train: {steps: 2}\n")
        spec = {"base": str(d / "base.yaml"), "seeds": [0, 1], "out_dir": str(d / "out"), "arms": {"grpo": [], "m": []}}
        if how == "archive":
            spec["archive"] = str(d / "archive")
        (d / "spec.yaml").write_text(yaml.safe_dump(spec))
        for i, arm in enumerate(("grpo", "m")):
            for s in (0, 1):
                writer(d, arm, s, *_outcomes(10 * i + s), tokens=100 * (i + 1) + 10 * s)
        assert cli.main(["ablate-ci", str(d / "spec.yaml"), "--resamples", "2000"]) == 0
        capsys.readouterr()
        tables[how] = (d / ("archive" if how == "archive" else "out") / "intervals.md").read_text().replace(str(d), "D")
    assert not (tmp_path / "archive" / "out").exists()  # nothing was evaluated or written beside the records
    assert tables["archive"] == tables["evals"] and "| greedy |" in tables["archive"]

    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "base.yaml").write_text("train: {steps: 2}\n")
    (bad / "spec.yaml").write_text(yaml.safe_dump({"base": str(bad / "base.yaml"), "seeds": [0],
                                                   "out_dir": str(bad / "out"), "archive": str(bad / "archive"),
                                                   "arms": {"grpo": [], "m": []}}))
    _write_archived(bad, "grpo", 0, *_outcomes(0))
    _write_archived(bad, "m", 0, *_outcomes(1), run_row_edit={"rollout_t_pass@4": 0.5})
    assert cli.main(["ablate-ci", str(bad / "spec.yaml"), "--arms", "m"]) == 1
    err = capsys.readouterr().err
    assert f"m seed 0: {bad / 'archive' / 'runs' / 'm' / 'seed0' / 'held_out' / 'step2.jsonl'} vs the run's own " \
           "evaluation at step 2" in err and "rollout_t_pass@4" in err
    (bad / "archive" / "runs" / "m" / "seed0" / "held_out" / "step2.jsonl").write_text('{"uid": "u0"}\n')
    assert cli.main(["ablate-ci", str(bad / "spec.yaml"), "--arms", "m"]) == 1
    assert "step2.jsonl, line 1: not a held-out outcome row (KeyError" in capsys.readouterr().err
