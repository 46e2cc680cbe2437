"""jaxrl_llm/ablate/controls.py (`jaxrl-llm ablate-check`): each positive control's prediction check on hand-built
run records, against the figures computed by hand (a check that cannot say NO is a defect, so each is shown failing
too), and the report over a spec's finished and missing runs."""

import inspect
import json
import runpy
import sys
from pathlib import Path

import pytest
import yaml

from jaxrl_llm import cli
from jaxrl_llm.ablate import controls
from jaxrl_llm.ablate.records import RunData
from tests.helpers import done_marker

ROOT = Path(__file__).resolve().parents[2]


def _run(arm, train_rows, evals=()):
    rows = [{"step": s + 1, "kind": "train", **r} for s, r in enumerate(train_rows)]
    rows += [{"step": s, "kind": "eval", **r} for s, r in evals]
    return RunData(arm, 0, len(train_rows), rows)


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


RRL_ROWS = [{"rrl_continuation_success": 0.5, "rrl_fresh_success_same_prompts": 0.1, "rrl_replay_rows": 16,
             "rrl_replay_groups_all_wrong_prompts": 2, "rrl_replay_mixed_all_wrong_prompts": 1,
             "replay_groups_zero_variance": 0.5, "rrl_replayed_states": 4, "rrl_solved_first_via_replay": 1},
            {"rrl_continuation_success": 0.1, "rrl_fresh_success_same_prompts": 0.1, "rrl_replay_rows": 48,
             "rrl_replay_groups_all_wrong_prompts": 2, "rrl_replay_mixed_all_wrong_prompts": 0,
             "replay_groups_zero_variance": 0.75, "rrl_replayed_states": 12, "rrl_solved_first_via_replay": 2}]


def test_rrl_weights_rates_by_replay_rows():
    rows = [dict(r) for r in RRL_ROWS]
    got = controls.rrl(_run("rrl", rows), [])
    assert got["continuation success"] == pytest.approx((0.5 * 16 + 0.1 * 48) / 64)  # 0.2
    assert got["mixed share of those"] == 0.25 and got["solved first via replay"] == 2
    assert got["holds"]  # 0.2 >= 2 x 0.1, a quarter mixed, 2 prompts first solved via replay
    rows[0]["rrl_replay_mixed_all_wrong_prompts"] = 0
    assert not controls.rrl(_run("rrl", rows), [])["holds"]


def test_ablate_check_reports_finished_runs_per_arm_and_lists_the_rest(tmp_path, monkeypatch, capsys):
    """The checks are chosen by the spec's file name; one finished rrl run (its record as the harness leaves
    it), everything else missing. Figures by hand: zero-variance share (0.5 x 4 + 0.75 x 12) / 16 = 0.6875."""
    (tmp_path / "base.yaml").write_text("train: {steps: 2}\n")
    spec_path = tmp_path / "rrl_control.yaml"
    spec_path.write_text(yaml.safe_dump({"base": str(tmp_path / "base.yaml"), "seeds": [0, 1],
                                         "out_dir": str(tmp_path / "out"), "arms": {"rrl": [], "rrl_value": []}}))
    run_dir = tmp_path / "out" / "rrl" / "seed0"
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text("train: {steps: 2}\n")
    rows = [{"step": 0, "kind": "eval"}, *({"step": i + 1, "kind": "train", **r} for i, r in enumerate(RRL_ROWS)),
            {"step": 2, "kind": "eval"}]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run_dir / "ablation_done.json").write_text(done_marker(spec_path, "rrl", 0))

    out = tmp_path / "controls.md"
    assert cli.main(["ablate-check", str(spec_path), "--out", str(out)]) == 0
    text = out.read_text()
    assert capsys.readouterr().out == text + "\n"
    assert text.startswith(f"# Mechanism checks: {spec_path}\n\nMade by `python tools/controls.py {spec_path}`.\n")
    assert ("| seed | continuation success | fresh success, same prompts | replay groups on all-wrong prompts | "
            "mixed share of those | zero-variance replay groups | solved first via replay | holds |\n"
            "|---|---|---|---|---|---|---|---|\n"
            "| 0 | 0.200 | 0.100 | 4 | 0.250 | 0.688 | 2 | yes |\n\nPrediction held in 1 of 1 runs.") in text
    assert f"## rrl_reference\n\n{inspect.cleandoc(controls.rrl.__doc__)}\n\n(no finished run)\n" in text
    assert text.endswith("## Not finished\n\n- rrl seed 1: not started\n- rrl_value seed 0: not started\n"
                         "- rrl_value seed 1: not started\n")

    (tmp_path / "other.yaml").write_text(spec_path.read_text())  # no checks are defined for this name
    monkeypatch.setattr(sys, "argv", ["tools/controls.py", str(tmp_path / "other.yaml")])
    monkeypatch.setattr(sys, "path", list(sys.path))  # the shim puts its tree first; undone after the test
    with pytest.raises(SystemExit) as stop:
        runpy.run_path(str(ROOT / "tools" / "controls.py"), run_name="__main__")
    assert stop.value.code == 2 and "other.yaml: no mechanism checks defined" in capsys.readouterr().err


def _hidden_rows(rates, success=0.5, entropy=1.0, target=1.0, cont=0.4, fresh=0.2):
    return [{"rubric_item_met": [1.0, r], "herl_revision_success": success, "entropy": entropy,
             "e3_target_entropy": target, "rrl_continuation_success": cont, "rrl_fresh_success_same_prompts": fresh,
             "rrl_replay_rows": 8} for r in rates]


def test_herl_and_all_three_checks_hold_and_fail_by_hand():
    """The hidden item's rate (last 4 steps) against GRPO's, revision success over steps 1-4, and for all three
    together also continuations against fresh rollouts, the entropy gap to E3's target and HeRL alone's reward."""
    grpo = _run("grpo", _hidden_rows([0.0] * 8), [(8, {"sampled_reward_mean": 0.5})])
    herl = _run("herl", _hidden_rows([0.0, 0.1, 0.2, 0.3, 0.5, 0.5, 0.6, 0.6]), [(8, {"sampled_reward_mean": 0.7})])
    got = controls.herl_hidden(herl, [grpo, herl])
    assert got["hidden rate last 4"] == pytest.approx(0.55) and got["GRPO's last 4"] == 0.0 and got["holds"]
    assert controls.hidden_flat(grpo, [])["holds"] and not controls.hidden_flat(herl, [])["holds"]
    assert not controls.herl_hidden(_run("herl", _hidden_rows([0.6] * 8, success=0.2),
                                         [(8, {"sampled_reward_mean": 0.7})]), [grpo])["holds"]  # calibration

    def three(reward=0.68, **kw):
        return _run("all_three", _hidden_rows([0.0, 0.1, 0.3, 0.4, 0.5, 0.5, 0.6, 0.6], **kw),
                    [(8, {"sampled_reward_mean": reward})])

    runs = [grpo, herl]
    got = controls.all_three(three(entropy=1.05), runs)
    assert got["entropy gap to target, last 4"] == pytest.approx(0.05) and got["HeRL alone's"] == 0.7 and got["holds"]
    assert not controls.all_three(three(entropy=1.2), runs)["holds"]  # E3 lost its target
    assert not controls.all_three(three(cont=0.1), runs)["holds"]  # continuations below fresh rollouts
    assert not controls.all_three(three(reward=0.6), runs)["holds"]  # worse than HeRL alone
