"""jaxrl_llm/ablate/seed_intervals.py (`jaxrl-llm ablate-ci --seeds-only`): Welch's interval against its textbook
formula and the bootstrap module's own Welch p, its coverage on normal data, and the command end to end on
hand-built records."""

import json
import math
import shutil

import numpy as np
import pytest
import yaml
from scipy.stats import t as t_dist

from jaxrl_llm import cli
from jaxrl_llm.ablate import intervals, seed_intervals
from tests.helpers import done_marker


def _by_hand(a, b, level=0.95):
    """Welch's interval written out: (mean difference, lo, hi, df)."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
    df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    half = t_dist.ppf(0.5 + level / 2, df) * math.sqrt(va + vb)
    d = a.mean() - b.mean()
    return d, d - half, d + half, df


@pytest.mark.parametrize("a, b", [([0.5, 0.7, 0.6], [0.1, 0.2, 0.4]), ([0.9, 0.95, 0.98], [0.0, 0.0, 0.0]),
                                  ([1.0, 2.0, 3.0, 4.0], [2.5, 2.5, 2.7]), ([0.3, 0.31], [0.3, 0.29, 0.35, 0.2])])
def test_welch_interval_is_the_textbook_formula_and_its_p_the_bootstrap_modules(a, b):
    got = seed_intervals.welch_interval(a, b)
    d, lo, hi, df = _by_hand(a, b)
    assert got["diff"] == pytest.approx(d, abs=1e-12)
    assert (got["lo"], got["hi"], got["df"]) == pytest.approx((lo, hi, df), rel=1e-9, abs=1e-12)
    assert got["p"] == pytest.approx(intervals.welch_p(np.asarray(a), np.asarray(b)), rel=1e-9)
    # the interval excludes 0 exactly when p < 0.05
    assert (got["lo"] > 0 or got["hi"] < 0) == (got["p"] < 0.05)


def test_welch_interval_is_undefined_without_two_seeds_or_any_spread():
    for a, b in (([0.5], [0.1, 0.2]), ([0.5, 0.5], [0.1, 0.1]), ([0.5, 0.6], [0.2])):
        got = seed_intervals.welch_interval(a, b)
        assert got["diff"] == pytest.approx(np.mean(a) - np.mean(b))
        assert all(math.isnan(got[k]) for k in ("lo", "hi", "p", "df"))


def test_welch_interval_covers_the_true_difference_95_percent_of_the_time():
    """3 seeds a side from normals of unequal spread and a true difference of 0.3: the interval should hold it in
    about 95 % of 4000 draws (Welch's is slightly conservative here; binomial sd 0.0035)."""
    rng = np.random.default_rng(0)
    hits = sum(lo <= 0.3 <= hi for lo, hi in (
        (r["lo"], r["hi"]) for r in (seed_intervals.welch_interval(rng.normal(0.8, 0.05, 3), rng.normal(0.5, 0.15, 3))
                                     for _ in range(4000))))
    assert 0.94 <= hits / 4000 <= 0.975


def _record(d, arm, seed, greedy, reward, tokens, rollout_t=0.7, final=True, steps=2):
    run = d / "out" / arm / f"seed{seed}"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(f"train: {{steps: {steps}}}\n")
    ev = {"greedy_accuracy": greedy, "sampled_accuracy": greedy / 2, "sampled_reward_mean": reward,
          "rollout_t": rollout_t, "rollout_t_sampled_accuracy": greedy / 3}
    rows = [{"step": 0, "kind": "eval", **ev},
            {"step": 1, "kind": "train", "sampled_tokens": tokens, "time_step_s": 2.0},
            {"step": steps if final else 1, "kind": "eval", **ev}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "ablation_done.json").write_text(done_marker(d / "spec.yaml", arm, seed))


def test_seeds_only_end_to_end_from_the_records_rows(tmp_path, capsys):
    (tmp_path / "base.yaml").write_text("train: {steps: 2}\n")
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump({
        "base": str(tmp_path / "base.yaml"), "seeds": [0, 1, 2], "out_dir": str(tmp_path / "out"),
        "arms": {"grpo": [], "m": [], "n": []}}))
    greedy = {"grpo": [0.1, 0.2, 0.15], "m": [0.6, 0.5, 0.7]}
    for arm, values in greedy.items():
        for s, g in enumerate(values):
            _record(tmp_path, arm, s, g, 0.5 + g / 2, 100 * (s + 1) * (2 if arm == "m" else 1))
    _record(tmp_path, "n", 0, 0.3, 0.6, 10)  # n: one seed finished

    assert cli.main(["ablate-ci", str(tmp_path / "spec.yaml"), "--seeds-only"]) == 0
    text = (tmp_path / "out" / "intervals_seeds.md").read_text()
    assert capsys.readouterr().out == text + "\n"
    d, lo, hi, df = _by_hand(greedy["m"], greedy["grpo"])
    p = seed_intervals.welch_interval(greedy["m"], greedy["grpo"])["p"]
    assert (f"| greedy | 0.600 ± 0.100 | 0.150 ± 0.050 | {d:+.3f} | [{lo:+.3f}, {hi:+.3f}] | yes | {p:.4f} | "
            f"{df:.1f} |") in text
    assert "| sampled reward T=1 | 0.800 ± 0.050 | 0.575 ± 0.025 |" in text  # graded: reward != accuracy
    assert "greedy reward" not in text  # no greedy reward recorded
    assert "| sampled T=run | 0.200 ± 0.033 | 0.050 ± 0.017 |" in text  # rollout T 0.7: the T=run figures shown
    assert "sampled tokens 400 vs 200, wall s 2.0 vs 2.0." in text
    assert "| greedy | 0.300 | 0.150 ± 0.050 | +0.150 | n/a | n/a | n/a | n/a |" in text  # n: one seed
    assert "- n seed 1: not finished" in text and "- n seed 2: not finished" in text
    # a run that ends at another step than the baseline's: its pair is left out, saying why, not compared
    shutil.rmtree(tmp_path / "out" / "n" / "seed0")
    _record(tmp_path, "n", 0, 0.3, 0.6, 10, steps=3)
    assert cli.main(["ablate-ci", str(tmp_path / "spec.yaml"), "--seeds-only"]) == 0
    text = capsys.readouterr().out
    assert "## n vs grpo" not in text and "## m vs grpo" in text
    assert "n vs grpo left out: the runs end at different steps (n: [3], grpo: [2])" in text
    # a spec naming its reports (one sharing this out_dir) writes its own table beside this one
    kept = (tmp_path / "out" / "intervals_seeds.md").read_text()
    (tmp_path / "both.yaml").write_text((tmp_path / "spec.yaml").read_text() + "reports: both\n")
    assert cli.main(["ablate-ci", str(tmp_path / "both.yaml"), "--seeds-only"]) == 0
    assert "## m vs grpo" in (tmp_path / "out" / "both.intervals_seeds.md").read_text()
    assert (tmp_path / "out" / "intervals_seeds.md").read_text() == kept
    capsys.readouterr()

    # without --seeds-only: no per-problem outcomes, no checkpoint to evaluate; the error points here
    assert cli.main(["ablate-ci", str(tmp_path / "spec.yaml"), "--resamples", "1000"]) == 2
    err = capsys.readouterr().err
    assert "m seed 0: no checkpoint of step 2" in err and "--seeds-only compares" in err, err
    assert cli.main(["ablate-ci", str(tmp_path / "spec.yaml"), "--seeds-only", "--by-difficulty"]) == 2
    assert "--by-difficulty needs per-problem outcomes" in capsys.readouterr().err
    # a record whose final step has no eval row is named, not read as a zero
    (tmp_path / "out" / "grpo" / "seed1").rename(tmp_path / "gone")
    _record(tmp_path, "grpo", 1, 0.2, 0.6, 200, final=False)
    assert cli.main(["ablate-ci", str(tmp_path / "spec.yaml"), "--seeds-only", "--arms", "m"]) == 2
    assert "grpo seed 1:" in capsys.readouterr().err
