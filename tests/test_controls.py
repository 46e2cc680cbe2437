"""tools/controls.py: each positive control's prediction check on hand-built run records, against the
figures computed by hand (a check that cannot say NO is a defect, so each is shown failing too)."""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import ablate  # noqa: E402
import controls  # noqa: E402


def _run(arm, train_rows, evals=()):
    rows = [{"step": s + 1, "kind": "train", **r} for s, r in enumerate(train_rows)]
    rows += [{"step": s, "kind": "eval", **r} for s, r in evals]
    return ablate.RunData(arm, 0, len(train_rows), rows)


def test_closed_loop_needs_a_monotone_rise_and_a_small_final_gap():
    temps = [0.5 + 0.02 * i for i in range(30)]
    ents = [0.5 + 0.02 * i for i in range(16)] + [0.81, 0.83] * 7
    rows = [{"temperature": t, "entropy": h, "e3_target_entropy": 0.82} for t, h in zip(temps, ents)]
    got = controls.closed_loop(_run("closed_loop", rows))
    assert got["steps to reach 5 %"] == 15 and got["T monotone until then"]  # step 15: 0.78 / 0.82 - 1 = -4.9 %
    assert got["entropy gap, last 10"] == pytest.approx((0.81 + 0.83) / 2 / 0.82 - 1) and got["holds"]
    rows[3]["temperature"] = 0.4  # a fall before the target is reached
    assert not controls.closed_loop(_run("closed_loop", rows))["holds"]
    short = [dict(r, entropy=0.7) for r in rows]  # never within 5 %
    assert not controls.closed_loop(_run("closed_loop", short))["holds"]


def test_collapse_checks():
    falling = [{"entropy": 0.8 - 0.01 * i, "temperature": 1.0, "e3_target_entropy": 0.8} for i in range(60)]
    grpo = controls.collapse_grpo(_run("grpo_collapse", falling))
    assert grpo["ratio"] == pytest.approx((0.8 - 0.01 * 54.5) / 0.8) and grpo["holds"]
    e3 = controls.collapse_e3(_run("e3_collapse", falling))
    assert not e3["holds"] and e3["gap to target"] == pytest.approx((0.8 - 0.01 * 54.5) / 0.8 - 1)
    # at lr 3e-4 the collapse must also keep held-out greedy accuracy (not a wrecked policy)
    kept = controls.collapse_grpo(_run("grpo_collapse_3e-4", falling, [(0, {"greedy_accuracy": 0.2}),
                                                                        (60, {"greedy_accuracy": 0.25})]))
    wrecked = controls.collapse_grpo(_run("grpo_collapse_3e-4", falling, [(0, {"greedy_accuracy": 0.2}),
                                                                           (60, {"greedy_accuracy": 0.05})]))
    assert kept["holds"] and not wrecked["holds"]
    held = [dict(r, entropy=0.78) for r in falling]
    assert controls.collapse_e3(_run("e3_collapse", held))["holds"]
    assert not controls.collapse_grpo(_run("grpo_collapse", held))["holds"]


def test_budget_compares_quintiles_to_bounds_and_mixed_rows_to_grpo():
    def rows(q1, q5, mixed, tokens=100):
        return [{"e3_group_size_q1": q1, "e3_group_size_q5": q5, "e3_n_min": 4, "e3_n_max": 12,
                 "rows_in_mixed_groups": mixed, "sampled_tokens": tokens} for _ in range(20)]

    grpo = _run("grpo", [{"rows_in_mixed_groups": 0.3, "sampled_tokens": 100} for _ in range(20)])
    good = _run("budget", rows(4.5, 11.5, 0.4))
    assert controls.budget(good, [grpo, good])["holds"]
    for bad in (rows(6, 11.5, 0.4), rows(4.5, 10, 0.4), rows(4.5, 11.5, 0.2), rows(4.5, 11.5, 0.4, tokens=120)):
        run = _run("budget", bad)
        assert not controls.budget(run, [grpo, run])["holds"]


def test_rrl_weights_rates_by_replay_rows():
    rows = [{"rrl_continuation_success": 0.5, "rrl_fresh_success_same_prompts": 0.1, "rrl_replay_rows": 16,
             "rrl_replay_groups_all_wrong_prompts": 2, "rrl_replay_mixed_all_wrong_prompts": 1,
             "replay_groups_zero_variance": 0.5, "rrl_replayed_states": 4, "rrl_solved_first_via_replay": 1},
            {"rrl_continuation_success": 0.1, "rrl_fresh_success_same_prompts": 0.1, "rrl_replay_rows": 48,
             "rrl_replay_groups_all_wrong_prompts": 2, "rrl_replay_mixed_all_wrong_prompts": 0,
             "replay_groups_zero_variance": 0.75, "rrl_replayed_states": 12, "rrl_solved_first_via_replay": 2}]
    got = controls.rrl(_run("rrl", rows), [])
    assert got["continuation success"] == pytest.approx((0.5 * 16 + 0.1 * 48) / 64)  # 0.2
    assert got["mixed share of those"] == 0.25 and got["solved first via replay"] == 2
    assert got["holds"]  # 0.2 >= 2 x 0.1, a quarter mixed, 2 prompts first solved via replay
    rows[0]["rrl_replay_mixed_all_wrong_prompts"] = 0
    assert not controls.rrl(_run("rrl", rows), [])["holds"]
