"""jaxrl_llm/ablate (`jaxrl-llm ablate`): spec checks, aggregation against hand-computed values, skip / resume
logic, signal forwarding, and one real 2-arm grid through the trainer subprocess."""

import csv
import io
import json
import math
import os
import runpy
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from jaxrl_llm import cli
from jaxrl_llm.ablate import command, grid as grid_mod, records, report, spec as spec_mod
from tests.helpers import CACHE_DIR, FAST_COMPILE, done_marker

ROOT = Path(__file__).resolve().parents[2]


def run_tool(name: str, argv: list[str], monkeypatch) -> int:
    """`python tools/<name> *argv` (a shim kept for docs and queued scripts), in this process: its exit code."""
    monkeypatch.setattr(sys, "argv", [str(ROOT / "tools" / name), *argv])
    monkeypatch.setattr(sys, "path", list(sys.path))  # the shim puts its tree first; undone after the test
    with pytest.raises(SystemExit) as stop:
        runpy.run_path(str(ROOT / "tools" / name), run_name="__main__")
    return stop.value.code


def _write_spec(tmp_path, text: str, base: str = "train: {steps: 2}\n") -> Path:
    (tmp_path / "base.yaml").write_text(base)
    path = tmp_path / "spec.yaml"
    path.write_text(text.replace("BASE", str(tmp_path / "base.yaml")).replace("OUT", str(tmp_path / "out")))
    return path


def _write_run(spec, arm: str, seed: int, steps: int, evals: list[tuple[int, dict]], train: list[dict], done=True,
               extra=()):
    """(arm, seed)'s run folder as the trainer and harness leave it: config.yaml, metrics.jsonl, ablation_done.json."""
    run_dir = spec.run_dir(arm, seed)
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump({"train": {"steps": steps}}))
    rows = [{"step": 0, "kind": "eval_before_sft", "greedy_accuracy": 0.99}, {"step": 3, "kind": "sft", "nll": 1.0}]
    rows += [{"step": s, "kind": "eval", **m} for s, m in evals[:1]]
    rows += [{"step": i + 1, "kind": "train", "reward_mean": 0.1 * i, **t} for i, t in enumerate(train)]
    rows += [{"step": s, "kind": "eval", **m} for s, m in evals[1:]] + list(extra)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if done:
        (run_dir / spec_mod.DONE).write_text(done_marker(spec, arm, seed))


def _eval(greedy, sampled, never, ks, time_eval=0.25):
    return {"greedy_accuracy": greedy, "sampled_accuracy": sampled, "never_solved_share": never,
            "time_eval_s": time_eval, **{f"pass@{k}": v for k, v in ks.items()}}


SPEC = ("base: BASE\noverrides: [eval.samples=8]\nseeds: [0, 1, 2]\nout_dir: OUT\n"
        "arms:\n  a: []\n  b: [rollout.temperature=0.5]\n")


@pytest.fixture
def grid(tmp_path):
    """Arm a: three finished seeds with eval.samples=8; arm b: two finished (pass@1, pass@2 only; one
    train row without sampled_tokens), seed 2 started but unfinished."""
    spec = spec_mod.load_spec(_write_spec(tmp_path, SPEC))
    train = [{"sampled_tokens": 10, "time_step_s": 1.0}, {"sampled_tokens": 20, "time_step_s": 2.0},
             {"sampled_tokens": 30, "time_step_s": 0.5}]
    for seed, (g0, g, p8) in enumerate([(0.1, 0.5, 0.9), (0.2, 0.6, 0.8), (0.3, 0.7, 1.0)]):
        ks = {1: g / 2, 2: g / 2 + 0.1, 4: g / 2 + 0.2, 8: p8}
        stale = (3, _eval(0.0, 0.0, 1.0, ks))  # an earlier row at the final step: the later one wins
        _write_run(spec, "a", seed, 3, [(0, _eval(g0, g0 / 2, 0.5, {1: g0 / 2, 8: 0.4})), stale,
                                                (3, _eval(g, g / 2, 0.1 * seed, ks))], train)
    for seed, g in enumerate([0.2, 0.4]):
        rows = [dict(t) for t in train]
        if seed == 1:
            del rows[1]["sampled_tokens"]
        _write_run(spec, "b", seed, 3, [(0, _eval(0.0, 0.0, 1.0, {1: 0.0, 2: 0.0})),
                                                (3, _eval(g, g, 0.5, {1: g, 2: g + 0.2}))], rows)
    _write_run(spec, "b", 2, 3, [(0, _eval(0.0, 0.0, 1.0, {}))], train[:1], done=False)
    return spec


def test_run_summary_sums_tokens_and_wall_time_and_takes_the_last_row_per_step(grid):
    run = records.collect(grid)[0][0]
    s = records.run_summary(run.rows, run.steps)
    # wall: three steps plus the evaluations at steps 0 and 3 (the stale step-3 row is not counted)
    assert s["final"] == pytest.approx({"greedy_accuracy": 0.5, "sampled_accuracy": 0.25, "never_solved_share": 0.0,
                                        "pass@1": 0.25, "pass@2": 0.35, "pass@4": 0.45, "pass@8": 0.9,
                                        "sampled_tokens": 60.0, "wall_s": 1.0 + 2.0 + 0.5 + 0.25 + 0.25,
                                        "rl_steps": 3.0}, abs=1e-12)
    assert s["start"] == pytest.approx({"greedy_accuracy": 0.1, "sampled_accuracy": 0.05, "never_solved_share": 0.5,
                                        "pass@1": 0.05, "pass@8": 0.4}, abs=1e-12)
    assert records.run_summary(run.rows, 4) is None  # no eval row at train.steps: not finished


def test_cpu_seconds_are_summed_over_steps_and_evaluations_and_shown_only_where_logged(tmp_path):
    """cpu_s = the train rows' cpu_step_s + the eval rows' cpu_eval_s; absent where any row lacks it (records made
    before it was logged), and then neither report nor budget sentence shows it."""
    from jaxrl_llm.ablate.intervals import budget_sentence

    spec = spec_mod.load_spec(_write_spec(tmp_path, "base: BASE\nseeds: [0]\nout_dir: OUT\narms: {a: [], b: []}\n"))
    ev = [(s, {**_eval(0.5, 0.5, 0.5, {}), "cpu_eval_s": 3.0 + s}) for s in (0, 2)]
    _write_run(spec, "a", 0, 2, ev, [{"sampled_tokens": 5, "time_step_s": 1.0, "cpu_step_s": c} for c in (1.5, 2.5)])
    _write_run(spec, "b", 0, 2, ev, [{"sampled_tokens": 5, "time_step_s": 1.0, "cpu_step_s": 1.5},
                                     {"sampled_tokens": 5, "time_step_s": 1.0}])
    runs, _ = records.collect(spec)
    (a, b) = sorted(runs, key=lambda r: r.arm)
    assert records.run_summary(a.rows, 2)["final"]["cpu_s"] == 1.5 + 2.5 + 3.0 + 5.0
    assert "cpu_s" not in records.run_summary(b.rows, 2)["final"]
    table = records.arm_table(spec, runs)
    text = report.format_markdown(spec, table, runs, [])
    assert "CPU s" in text and "| a | 0 | 0.500 | 0.500 | 0.500 | 10 | 2.5 | 12.0 |" in text
    assert "| b | 0 | 0.500 | 0.500 | 0.500 | 10 | 2.5 |  |" in text
    only_b = [r for r in runs if r.arm == "b"]
    assert "CPU s" not in report.format_markdown(spec, records.arm_table(spec, only_b), only_b, [])
    budget = {"sampled_tokens": 10.0, "wall_s": 3.5, "cpu_s": 12.0}
    assert budget_sentence([budget], [{**budget, "cpu_s": 8.0}]).endswith("wall s 3.5 vs 3.5, CPU s 12.0 vs 8.0.")
    assert budget_sentence([budget], [{**budget, "cpu_s": None}]).endswith("wall s 3.5 vs 3.5.")


def test_aggregate_is_mean_and_sample_std():
    st = records.aggregate([0.5, 0.6, 0.7])
    assert st.n == 3 and st.mean == pytest.approx(0.6, abs=1e-12) and st.std == pytest.approx(0.1, abs=1e-12)
    one = records.aggregate([0.3])
    assert one.mean == 0.3 and math.isnan(one.std) and one.n == 1
    assert records.aggregate([]) is None


def test_table_csv_and_markdown_against_hand_computed_values(grid):
    runs, missing = records.collect(grid)
    assert missing == [("b", 2, f"unfinished or failed (see {grid.run_dir('b', 2) / 'train.log'})")]
    table = records.arm_table(grid, runs)
    assert [(t["arm"], t["when"], t["step"], t["seeds"]) for t in table] == [
        ("a", "start", "0", [0, 1, 2]), ("a", "final", "3", [0, 1, 2]),
        ("b", "start", "0", [0, 1]), ("b", "final", "3", [0, 1])]
    a_final, b_final = table[1]["stats"], table[3]["stats"]
    assert a_final["greedy_accuracy"].mean == pytest.approx(0.6)
    assert a_final["greedy_accuracy"].std == pytest.approx(0.1)
    assert a_final["pass@8"].mean == pytest.approx(0.9) and a_final["pass@8"].std == pytest.approx(0.1)
    assert a_final["sampled_tokens"].mean == 60 and a_final["sampled_tokens"].std == 0
    assert a_final["wall_s"].mean == pytest.approx(4.0) and a_final["rl_steps"].mean == 3
    assert b_final["greedy_accuracy"].std == pytest.approx(math.sqrt(0.02)) and "pass@4" not in b_final
    assert b_final["sampled_tokens"].n == 1  # seed 1 lacks the field in a train row: reported as missing
    assert table[0]["stats"]["greedy_accuracy"].mean == pytest.approx(0.2)

    rows = list(csv.DictReader(io.StringIO(report.format_csv(table))))
    assert [(r["arm"], r["when"], r["n_seeds"], r["seeds"]) for r in rows] == [
        ("a", "start", "3", "0 1 2"), ("a", "final", "3", "0 1 2"),
        ("b", "start", "2", "0 1"), ("b", "final", "2", "0 1")]
    assert float(rows[1]["never_solved_share_mean"]) == pytest.approx(0.1)
    assert float(rows[1]["never_solved_share_std"]) == pytest.approx(0.1)
    assert rows[3]["pass@4_mean"] == "" and rows[3]["pass@4_n"] == "0" and rows[1]["pass@16_mean"] == ""

    md = report.format_markdown(grid, table, runs, missing)
    assert f"`python tools/ablate.py {grid.path}`" in md and f"base: `{grid.base}`" in md
    assert "overrides (all arms): `eval.samples=8`" in md and "**b**: `rollout.temperature=0.5`" in md
    header = "| arm | at step | seeds | greedy | sampled T=1 | pass@1 | pass@2 | pass@4 | pass@8 | never solved |"
    assert header in md and "pass@16" not in md  # a column no run has is left out
    assert ("| a | 0 | 3 | 0.200 ± 0.100 | 0.100 ± 0.050 | 0.100 ± 0.050 |  |  | 0.400 ± 0.000 | "
            "0.500 ± 0.000 |  |  |  |") in md
    assert ("| a | 3 | 3 | 0.600 ± 0.100 | 0.300 ± 0.050 | 0.300 ± 0.050 | 0.400 ± 0.050 | 0.500 ± 0.050 | "
            "0.900 ± 0.100 | 0.100 ± 0.100 | 60 ± 0 | 4.0 ± 0.0 | 3 |") in md
    assert ("| b | 3 | 2 | 0.300 ± 0.141 | 0.300 ± 0.141 | 0.300 ± 0.141 | 0.500 ± 0.141 |  |  | 0.500 ± 0.000 | "
            "60 (n=1) | 4.0 ± 0.0 | 3 |") in md
    assert "- b seed 2: unfinished or failed" in md and "1 of 6 runs not in the table" in md
    assert "without `sampled_tokens`) in some runs of: b." in md


def test_report_files_and_curves(grid):
    written = report.write_report(grid)
    assert [p.name for p in written] == ["results.md", "results.csv", "curves.png"]
    assert (grid.out_dir / "curves.png").read_bytes()[:4] == b"\x89PNG"
    runs = [r for r in records.collect(grid)[0] if r.arm == "a"]
    steps, mean, lo, hi = report.arm_curve(runs, "eval", "greedy_accuracy")
    assert steps == [0, 3] and mean == pytest.approx([0.2, 0.6]) and lo == [0.1, 0.5] and hi == [0.3, 0.7]
    steps, mean, _, _ = report.arm_curve(runs, "train", "reward_mean", window=2)
    assert steps == [1, 2, 3] and mean == pytest.approx([0.0, 0.05, 0.15])


def test_a_spec_naming_its_reports_leaves_the_other_specs_tables_in_a_shared_archive(grid):
    """Two specs over one out_dir (the composition control counts the HeRL control's runs): the one with `reports`
    writes <reports>.results.md and so on beside the other's results.md, which stays as written."""
    first = [p.read_bytes() for p in report.write_report(grid)]
    other = spec_mod.load_spec(_write_spec(grid.out_dir.parent, SPEC + "reports: both\n"))
    written = report.write_report(other)
    assert [p.name for p in written] == ["both.results.md", "both.results.csv", "both.curves.png"]
    assert [(grid.out_dir / n).read_bytes() for n in ("results.md", "results.csv", "curves.png")] == first
    assert other.report_file(grid.out_dir, "intervals.md") == grid.out_dir / "both.intervals.md"
    assert grid.report_file(grid.out_dir, "intervals.md") == grid.out_dir / "intervals.md"


@pytest.mark.parametrize("text,error", [
    ("base: BASE\nseed: [0]\nout_dir: OUT\narms: {a: []}\n", r"spec.yaml: unknown key 'seed'; did you mean 'seeds'"),
    ("base: BASE\nseeds: [0]\nout_dir: OUT\narms: {a: []}\nreports: ../x\n", r"'reports' is a file-name prefix"),
    ("seeds: [0]\nout_dir: OUT\narms: {a: []}\n", r"spec.yaml: missing 'base'"),
    ("base: nowhere.yaml\nseeds: [0]\nout_dir: OUT\narms: {a: []}\n", r"'base' is 'nowhere.yaml': no such file"),
    ("base: BASE\nseeds: [0]\nout_dir: OUT\narms: {}\n", r"spec.yaml: 'arms' is empty"),
    ("base: BASE\nseeds: [0, 1, 0]\nout_dir: OUT\narms: {a: []}\n", r"spec.yaml: 'seeds' lists 0 2 times"),
    ("base: BASE\nseeds: [0]\nout_dir: OUT\narms: {a: [rollout.temperature]}\n",
     r"'arms.a' item 1 \('rollout.temperature'\) is not of the form a.b=value"),
    ("base: BASE\noverrides: [train.seed=3]\nseeds: [0]\nout_dir: OUT\narms: {a: []}\n",
     r"'overrides' sets train.seed, which the harness sets"),
    ("base: BASE\nseeds: [0]\nout_dir: OUT\narms: {a/b: []}\n", r"'arms.a/b': an arm name is a folder name"),
])
def test_spec_errors_name_the_file_and_key(tmp_path, text, error):
    with pytest.raises(spec_mod.SpecError, match=error):
        spec_mod.load_spec(_write_spec(tmp_path, text))


def test_arm_config_errors_name_the_arm_and_key(tmp_path, capsys):
    path = _write_spec(tmp_path, "base: BASE\nseeds: [0]\nout_dir: OUT\narms: {a: [], b: [rollout.temprature=1.0]}\n")
    with pytest.raises(spec_mod.SpecError, match=r"arm 'b': .*unknown key 'rollout.temprature'"):
        spec_mod.check_configs(spec_mod.load_spec(path), ["a", "b"])
    assert command.main([str(path), "--dry-run"]) == 2 and "unknown key 'rollout.temprature'" in capsys.readouterr().err
    assert cli.main(["ablate", str(path), "--arms", "a,c"]) == 2
    assert "['c'] not in the spec's arms" in capsys.readouterr().err


@pytest.mark.parametrize("path", sorted((ROOT / "configs" / "ablate").glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_spec_loads(path, monkeypatch):
    monkeypatch.chdir(ROOT)
    spec = spec_mod.load_spec(path.relative_to(ROOT))
    spec_mod.check_configs(spec, spec.arms)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(), reason="needs the git checkout")
@pytest.mark.parametrize("path", [p for p in sorted((ROOT / "configs" / "ablate").glob("*.yaml"))
                                  if yaml.safe_load(p.read_text()).get("archive")], ids=lambda p: p.name)
def test_archived_records_are_not_git_ignored(path):
    """A spec's archive is committed so a grid continues on a fresh checkout: no ignore rule may swallow
    its run records (a bare `runs/` rule did, for every archive's `runs/` folder)."""
    import subprocess

    spec = spec_mod.load_spec(path)
    record = spec.archived(next(iter(spec.arms)), spec.seeds[0]) / "metrics.jsonl"
    rel = record.resolve().relative_to(ROOT) if record.is_absolute() else record
    # --no-index: a committed record must still not match an ignore rule (git skips tracked files otherwise)
    got = subprocess.run(["git", "-C", str(ROOT), "check-ignore", "--no-index", "-v", str(rel)], capture_output=True,
                         text=True)
    assert got.returncode == 1, f"{rel} is git-ignored: {got.stdout.strip()}"


class _FakeTrainer:
    """Stands in for the trainer subprocess: writes what a run that reached `reach` steps leaves."""

    def __init__(self, run_dir: Path, steps: int, reach: int, rc: int):
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.yaml").write_text(yaml.safe_dump({"train": {"steps": steps}}))
        rows = [{"step": s, "kind": "eval", "greedy_accuracy": 0.5, "sampled_accuracy": 0.5,
                 "never_solved_share": 0.5} for s in (0, reach)]
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (run_dir / "train.log").write_text("boom: something broke\n")
        self.rc = rc

    def poll(self):
        return self.rc


def test_finished_runs_are_skipped_and_failures_reported(tmp_path, monkeypatch, capsys):
    path = _write_spec(tmp_path, "base: BASE\nseeds: [0, 1]\nout_dir: OUT\narms: {a: [], b: []}\n")
    spec = spec_mod.load_spec(path)
    _write_run(spec, "a", 0, 2, [(0, _eval(0, 0, 1, {})), (2, _eval(1, 1, 0, {}))], [{}, {}])

    assert run_tool("ablate.py", [str(path), "--dry-run"], monkeypatch) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"# done: a seed 0 ({spec.run_dir('a', 0) / 'ablation_done.json'})"
    # the trainer this interpreter runs as a module, so it is the package of the harness's working directory
    train = [sys.executable, "-m", "jaxrl_llm.cli", "train", "--config", str(tmp_path / "base.yaml"), "train.seed=0",
             f"train.out_dir={spec.run_dir('b', 0)}", f"eval.start_cache={spec.out_dir / 'start_evals'}"]
    assert lines[1] == (f"HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 {shlex.join(train)} "
                        f">> {spec.run_dir('b', 0) / 'train.log'} 2>&1")
    assert [ln.split("train.out_dir=")[1].split()[0] for ln in lines[1:]] == [
        str(spec.run_dir(a, s)) for a, s in (("b", 0), ("a", 1), ("b", 1))]
    assert not spec.run_dir("b", 0).exists()  # a dry run creates nothing

    launched = []
    outcome = {("b", 0): (2, 0), ("a", 1): (1, 0), ("b", 1): (2, 3)}  # (steps reached, exit code)

    def fake_launch(spec, arm, seed):
        launched.append((arm, seed))
        reach, rc = outcome[arm, seed]
        return _FakeTrainer(spec.run_dir(arm, seed), 2, reach, rc)

    monkeypatch.setattr(grid_mod, "launch", fake_launch)
    assert command.main([str(path)]) == 1
    err = capsys.readouterr().err
    assert launched == [("b", 0), ("a", 1), ("b", 1)]
    assert "FAILED: arm a, seed 1: no eval row at step 2 (last eval step: 1)" in err
    assert "FAILED: arm b, seed 1: exit code 3" in err and "boom: something broke" in err
    assert (spec.run_dir("b", 0) / "ablation_done.json").is_file()
    assert not (spec.run_dir("a", 1) / "ablation_done.json").exists()
    md = (spec.out_dir / "results.md").read_text()
    assert "- a seed 1: unfinished or failed" in md and "- b seed 1: unfinished or failed" in md
    # a marker alone does not make it count
    (spec.run_dir("a", 1) / "ablation_done.json").write_text(done_marker(spec, "a", 1))
    assert ("a", 1, "marked done, but no eval row at step 2 (last eval step: 1)") in records.collect(spec)[1]
    (spec.run_dir("a", 1) / "ablation_done.json").unlink()

    launched.clear()
    outcome.update({("a", 1): (2, 0), ("b", 1): (2, 0)})
    assert command.main([str(path), "--seeds", "1"]) == 0
    assert launched == [("a", 1), ("b", 1)]
    assert "Missing" not in (spec.out_dir / "results.md").read_text()


def test_a_signal_while_a_run_starts_reaches_that_run(tmp_path, monkeypatch):
    """A SIGTERM after the trainer started but before the harness listed it as running was never passed on: that
    run trained to its end while the harness waited for it."""
    path = _write_spec(tmp_path, "base: BASE\nseeds: [0]\nout_dir: OUT\narms: {a: []}\n")
    spec = spec_mod.load_spec(path)
    got, ready = tmp_path / "got", tmp_path / "ready"
    child = ("import pathlib, signal, sys, time\n"
             f"signal.signal(signal.SIGTERM, lambda *a: (pathlib.Path({str(got)!r}).write_text('term'), sys.exit(0)))\n"
             f"pathlib.Path({str(ready)!r}).write_text('')\ntime.sleep(60)\n")

    def launch(spec, arm, seed):
        proc = subprocess.Popen([sys.executable, "-c", child])
        while not ready.exists():
            time.sleep(0.02)
        os.kill(os.getpid(), signal.SIGTERM)  # the harness's handler runs before launch returns
        return proc

    monkeypatch.setattr(grid_mod, "launch", launch)
    t0 = time.monotonic()
    failed, stopped, left = grid_mod.run_grid(spec, [("a", 0)])
    assert stopped == signal.SIGTERM and got.read_text() == "term" and time.monotonic() - t0 < 30


@pytest.mark.slow
def test_a_signal_is_forwarded_to_the_trainer_and_stops_the_grid(tmp_path, monkeypatch):
    path = _write_spec(tmp_path, "base: BASE\nseeds: [0]\nout_dir: OUT\narms: {a: [], b: []}\n")
    spec = spec_mod.load_spec(path)
    ready, got, where = tmp_path / "ready", tmp_path / "got", tmp_path / "where"
    (tmp_path / "wd").mkdir()
    monkeypatch.chdir(tmp_path / "wd")  # a run starts where the harness was started (a frozen tree trains itself)
    child = ("import os, pathlib, signal, sys, time\n"
             f"signal.signal(signal.SIGTERM, lambda *a: (pathlib.Path({str(got)!r}).write_text('term'), sys.exit(0)))\n"
             f"pathlib.Path({str(where)!r}).write_text(os.getcwd())\n"
             f"pathlib.Path({str(ready)!r}).write_text('')\ntime.sleep(60)\n")
    monkeypatch.setattr(spec_mod.Spec, "command", lambda self, arm, seed: [sys.executable, "-c", child])

    def kill_when_ready():
        while not ready.exists():
            time.sleep(0.02)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=kill_when_ready, daemon=True).start()
    t0 = time.monotonic()
    failed, stopped, left = grid_mod.run_grid(spec, [("a", 0), ("b", 0)])
    assert stopped == signal.SIGTERM and failed == [] and left == [] and time.monotonic() - t0 < 30
    assert got.read_text() == "term" and not spec.run_dir("b", 0).exists()  # b never started
    assert where.read_text() == str(tmp_path / "wd")
    assert not (spec.run_dir("a", 0) / "ablation_done.json").exists()


def _tiny_base(tmp_path) -> Path:
    rows = [{"question": f"Question {i}: what is the magic word?", "answer": "7", "scorer": "exact"} for i in range(40)]
    (tmp_path / "magic.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "held.jsonl").write_text("".join(
        json.dumps({**r, "question": r["question"].replace("Question", "Held")}) + "\n" for r in rows[:8]))
    cfg = {"model": {"name": "scratch", "scratch": {"hidden_size": 32, "intermediate_size": 64, "num_layers": 1,
                                                     "num_heads": 2, "num_kv_heads": 1, "head_dim": 16,
                                                     "max_position_embeddings": 96, "tie_embeddings": True}},
           "data": {"source": "jsonl", "path": str(tmp_path / "magic.jsonl"), "eval_path": str(tmp_path / "held.jsonl"),
                    "answer_format": "raw", "max_prompt_len": 64},
           "rollout": {"prompts_per_step": 4, "group_size": 4, "max_new_tokens": 1},
           "algo": {"micro_batch": 16}, "optim": {"lr": 0.02},
           "eval": {"every": 2, "size": 8, "samples": 2}, "reward": {"workers": 1},
           "train": {"steps": 2, "checkpoint_every": 2, "async_checkpoint": False, "tensorboard": False,
                     "export_final": False}}
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.mark.slow
def test_end_to_end_two_arms_through_the_real_trainer(tmp_path, monkeypatch, capsys):
    """Two arms x one seed, 2 RL steps each of a 1-layer scratch model (~15 s a run on 2 cores); their archived
    records (the final evaluation's per-problem outcomes among them) give `ablate-ci` its interval once the run
    folders are gone."""
    monkeypatch.setenv("XLA_FLAGS", FAST_COMPILE)  # one CPU device: the fastest tiny run
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", CACHE_DIR)
    monkeypatch.setenv("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.5")
    base = _tiny_base(tmp_path)
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(yaml.safe_dump({"base": str(base), "overrides": ["train.steps=2"], "seeds": [0],
                                         "out_dir": str(tmp_path / "out"), "archive": str(tmp_path / "kept"),
                                         "arms": {"cool": ["rollout.temperature=0.7"],
                                                  "hot": ["rollout.temperature=1.0"]}}))
    assert cli.main(["ablate", str(spec_path)]) == 0, capsys.readouterr().err
    out = tmp_path / "out"
    for arm in ("cool", "hot"):
        done = json.loads((out / arm / "seed0" / "ablation_done.json").read_text())
        assert done["command"][:6] == [sys.executable, "-m", "jaxrl_llm.cli", "train", "--config", str(base)]
        assert "train.seed=0" in (out / arm / "seed0" / "train.log").read_text()
    # the arms sample their evaluations at other temperatures: each makes its own, none is shared
    assert len(list((out / "start_evals").glob("*.json"))) == 2
    assert "start_reused" not in (out / "hot" / "seed0" / "metrics.jsonl").read_text()
    md = (out / "results.md").read_text()
    assert "| cool | 2 | 1 |" in md and "| hot | 2 | 1 |" in md and "| cool | 0 | 1 |" in md and "Missing" not in md
    rows = list(csv.DictReader(io.StringIO((out / "results.csv").read_text())))
    assert {(r["arm"], r["when"]) for r in rows} == {(a, w) for a in ("cool", "hot") for w in ("start", "final")}
    assert all(float(r["rl_steps_mean"]) == 2 for r in rows if r["when"] == "final")
    assert (out / "curves.png").stat().st_size > 1000
    capsys.readouterr()
    assert command.main([str(spec_path), "--dry-run"]) == 0
    assert capsys.readouterr().out.count("# done:") == 2
    kept = tmp_path / "kept" / "runs"
    assert sorted(p.relative_to(kept).as_posix() for p in kept.rglob("*.jsonl")) == [
        f"{arm}/seed0/{name}" for arm in ("cool", "hot") for name in ("held_out/step2.jsonl", "metrics.jsonl")]
    shutil.rmtree(out)  # a fresh machine: no run folder, no checkpoint; the archive's records alone
    assert cli.main(["ablate-ci", str(spec_path), "--baseline", "cool", "--resamples", "1000"]) == 0
    text = (tmp_path / "kept" / "intervals.md").read_text()
    assert "## hot vs cool" in text and "| greedy |" in text and not out.exists()


def test_replay_column_is_the_last_train_rows_count_and_shown_only_when_recorded(tmp_path):
    spec = spec_mod.load_spec(_write_spec(tmp_path, SPEC.replace("seeds: [0, 1, 2]", "seeds: [0]")))
    ev = [(0, _eval(0.1, 0.1, 0.5, {1: 0.1})), (2, _eval(0.2, 0.2, 0.4, {1: 0.2}))]
    _write_run(spec, "a", 0, 2, ev, [{"sampled_tokens": 5, "time_step_s": 1.0}] * 2)
    _write_run(spec, "b", 0, 2, ev, [{"sampled_tokens": 5, "time_step_s": 1.0,
                                              "rrl_solved_first_via_replay": n} for n in (2, 7)])
    runs, missing = records.collect(spec)
    summaries = {r.arm: records.run_summary(r.rows, r.steps)["final"] for r in runs}
    assert "rrl_solved_first_via_replay" not in summaries["a"] and summaries["b"]["rrl_solved_first_via_replay"] == 7
    text = report.format_markdown(spec, records.arm_table(spec, runs), runs, missing)
    assert "solved first via replay" in text and "| 7.0" in text
    plain = report.format_markdown(spec, records.arm_table(spec, runs[:1]), runs[:1], missing)
    assert "solved first via replay" not in plain


def test_reward_columns_are_shown_only_where_rewards_are_graded(tmp_path):
    """Mean rewards equal the accuracies on 0/1 tasks (hidden); rubric or partial-credit runs show them."""
    spec = spec_mod.load_spec(_write_spec(tmp_path, SPEC.replace("seeds: [0, 1, 2]", "seeds: [0]")))
    start = {"greedy_reward_mean": 0.1, "sampled_reward_mean": 0.1}  # equal to the accuracies below
    binary = {"greedy_reward_mean": 0.2, "sampled_reward_mean": 0.2}
    graded = {"greedy_reward_mean": 0.55, "sampled_reward_mean": 0.45}
    for arm, rewards in (("a", binary), ("b", graded)):
        ev = [(0, {**_eval(0.1, 0.1, 0.5, {1: 0.1}), **start}), (2, {**_eval(0.2, 0.2, 0.4, {1: 0.2}), **rewards})]
        _write_run(spec, arm, 0, 2, ev, [{"sampled_tokens": 5, "time_step_s": 1.0}] * 2)
    runs, missing = records.collect(spec)
    summaries = {r.arm: records.run_summary(r.rows, r.steps) for r in runs}
    assert "greedy_reward_mean" not in summaries["a"]["final"] and "greedy_reward_mean" not in summaries["b"]["start"]
    assert summaries["b"]["final"]["greedy_reward_mean"] == 0.55
    assert summaries["b"]["final"]["sampled_reward_mean"] == 0.45
    text = report.format_markdown(spec, records.arm_table(spec, runs), runs, missing)
    assert "| never solved | greedy reward | sampled reward |" in text
    assert "| 0.400 | 0.550 | 0.450 |" in text
    plain = report.format_markdown(spec, records.arm_table(spec, runs[:1]), runs[:1], missing)
    assert "greedy reward" not in plain


def test_archived_records_carry_a_grid_over_to_a_fresh_checkout(tmp_path, monkeypatch, capsys):
    """With `archive`, finished runs' records (no checkpoints) are copied there as they finish; once the
    run folders are gone (a fresh machine), those runs still count as finished and still make the table."""
    path = _write_spec(tmp_path, "base: BASE\nseeds: [0, 1]\nout_dir: OUT\narms: {a: [], b: []}\n"
                                 f"archive: {tmp_path / 'kept'}\n")
    spec = spec_mod.load_spec(path)
    launched, short = [], {("b", 1)}

    def fake_launch(spec, arm, seed):
        launched.append((arm, seed))
        return _FakeTrainer(spec.run_dir(arm, seed), 2, 1 if (arm, seed) in short else 2, 0)

    monkeypatch.setattr(grid_mod, "launch", fake_launch)
    assert command.main([str(path)]) == 1  # b seed 1 stops short of its final eval
    kept = tmp_path / "kept"
    assert sorted(str(p.relative_to(kept)) for p in kept.rglob("*") if p.is_file()) == sorted(
        [f"runs/{a}/seed{s}/{n}" for a, s in (("a", 0), ("b", 0), ("a", 1)) for n in records.RECORD]
        + ["results.md", "results.csv", "curves.png"])
    table = (kept / "results.md").read_text()
    assert table == (spec.out_dir / "results.md").read_text() and "- b seed 1: unfinished or failed" in table

    import shutil
    shutil.rmtree(spec.out_dir)  # the machine is gone; the committed archive is what is left
    capsys.readouterr()
    assert command.main([str(path), "--dry-run"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[:3] == [f"# done: {a} seed {s} ({kept / 'runs' / a / f'seed{s}' / spec_mod.DONE})"
                       for a, s in (("a", 0), ("b", 0), ("a", 1))]
    assert len(out) == 4 and f"train.out_dir={spec.run_dir('b', 1)}" in out[3]
    launched.clear()
    short.clear()
    assert command.main([str(path)]) == 0
    assert launched == [("b", 1)]  # only the unfinished run trains again
    assert "Missing" not in (kept / "results.md").read_text()
    runs, missing = records.collect(spec)
    assert missing == [] and sorted((r.arm, r.seed) for r in runs) == [("a", 0), ("a", 1), ("b", 0), ("b", 1)]


def test_a_record_trained_by_another_command_than_the_spec_gives_is_refused(tmp_path, monkeypatch, capsys):
    """An arm's overrides edited after its runs finished: counted as finished, its records would mix two
    configurations in one arm; run again, they would be replaced. Every command that reads records refuses,
    naming the spec, arm, seed, record and what changed, and trains nothing."""
    kept = tmp_path / "kept"
    text = f"base: BASE\nseeds: [0]\nout_dir: OUT\narms: {{a: [], b: [rollout.temperature=0.5]}}\narchive: {kept}\n"
    path = _write_spec(tmp_path, text)
    launched = []

    def fake_launch(spec, arm, seed):
        launched.append((arm, seed))
        return _FakeTrainer(spec.run_dir(arm, seed), 2, 2, 0)

    monkeypatch.setattr(grid_mod, "launch", fake_launch)
    assert command.main([str(path)]) == 0 and launched == [("a", 0), ("b", 0)]
    shutil.rmtree(tmp_path / "out")  # the archive alone, as on a fresh machine
    assert command.main([str(path), "--report-only"]) == 0  # unchanged spec: the records count
    moved = text.replace("out_dir: OUT", f"out_dir: {tmp_path / 'elsewhere'}")
    _write_spec(tmp_path, moved)
    assert command.main([str(path), "--dry-run"]) == 0 and launched == [("a", 0), ("b", 0)]  # out_dir may move

    path.write_text(text.replace("BASE", str(tmp_path / "base.yaml")).replace("OUT", str(tmp_path / "out"))
                    .replace("rollout.temperature=0.5", "rollout.temperature=0.7"))
    capsys.readouterr()
    launched.clear()
    for argv in ([str(path)], [str(path), "--arms", "a"], [str(path), "--dry-run"], [str(path), "--report-only"]):
        assert command.main(argv) == 2, argv
        err = capsys.readouterr().err
        assert f"{path}: arm 'b', seed 0: the record {kept / 'runs' / 'b' / 'seed0'} was trained by another command" \
            in err and "adds ['rollout.temperature=0.7'] and drops ['rollout.temperature=0.5']" in err, err
    assert launched == []
    assert cli.main(["ablate-ci", str(path), "--baseline", "a"]) == 2 and "arm 'b', seed 0" in capsys.readouterr().err
    # a run folder holding another command's record (b's, copied into a's folder): --report-only refuses it before
    # archiving anything (it copied the record over a's archived one first, then refused: the archive destroyed)
    _write_spec(tmp_path, text)
    shutil.copytree(kept / "runs" / "b" / "seed0", tmp_path / "out" / "a" / "seed0")
    archived = {f: f.read_bytes() for f in (kept / "runs" / "a" / "seed0").rglob("*") if f.is_file()}
    assert command.main([str(path), "--report-only"]) == 2 and "arm 'a', seed 0: the record" in capsys.readouterr().err
    assert {f: f.read_bytes() for f in (kept / "runs" / "a" / "seed0").rglob("*") if f.is_file()} == archived
    shutil.rmtree(tmp_path / "out")
    # the base config's contents edited (the command names it by path): refused too; a comment alone is no edit
    _write_spec(tmp_path, text, base="# the same base\ntrain: {steps: 2}\n")
    assert command.main([str(path), "--report-only"]) == 0
    _write_spec(tmp_path, text, base="train: {steps: 2}\noptim: {lr: 0.5}\n")
    assert command.main([str(path), "--report-only"]) == 2
    assert f"was trained from another content of the base config {tmp_path / 'base.yaml'}" in capsys.readouterr().err
    _write_spec(tmp_path, text)
    # a marker that is not the harness's (hand-made, truncated) is refused as well, not counted
    (kept / "runs" / "a" / "seed0" / spec_mod.DONE).write_text("{}\n")
    with pytest.raises(spec_mod.SpecError, match=r"arm 'a', seed 0: .*ablation_done.json is not a finished run's "
                                                  r"record \(KeyError"):
        spec_mod.load_spec(path).record("a", 0)


def test_a_finished_runs_checkpoints_but_the_final_one_are_deleted_unless_kept(tmp_path, monkeypatch):
    path = _write_spec(tmp_path, "base: BASE\nseeds: [0]\nout_dir: OUT\narms: {a: [], b: [], c: []}\n")
    spec = spec_mod.load_spec(path)

    def fake_launch(spec, arm, seed):
        run_dir = spec.run_dir(arm, seed)
        for d in ("checkpoints/1", "checkpoints/2", "checkpoints/2/arrays", "sft_checkpoints/3", "checkpoints/tmp.x"):
            (run_dir / d).mkdir(parents=True, exist_ok=True)
        (run_dir / "checkpoints" / "2" / "arrays" / "x").write_text("the final state")
        return _FakeTrainer(run_dir, 2, 1 if arm == "c" else 2, 0)  # c stops short: not finished

    monkeypatch.setattr(grid_mod, "launch", fake_launch)
    assert command.main([str(path), "--arms", "a,c"]) == 1
    def left(arm):
        return sorted(str(p.relative_to(spec.run_dir(arm, 0))) for p in spec.run_dir(arm, 0).glob("*checkpoints/*"))

    assert left("a") == ["checkpoints/2", "checkpoints/tmp.x"]  # the final step's, and what is not a step folder
    assert (spec.run_dir("a", 0) / "checkpoints" / "2" / "arrays" / "x").read_text() == "the final state"
    assert left("c") == ["checkpoints/1", "checkpoints/2", "checkpoints/tmp.x", "sft_checkpoints/3"]  # unfinished
    assert command.main([str(path), "--arms", "b", "--keep-checkpoints"]) == 0
    assert left("b") == ["checkpoints/1", "checkpoints/2", "checkpoints/tmp.x", "sft_checkpoints/3"]
    # no final step's folder: nothing is deleted
    (spec.run_dir("b", 0) / "checkpoints" / "2" / "arrays" / "x").unlink()
    for d in ("checkpoints/2/arrays", "checkpoints/2"):
        (spec.run_dir("b", 0) / d).rmdir()
    assert grid_mod.prune_checkpoints(spec.run_dir("b", 0), 2) == []
    assert left("b") == ["checkpoints/1", "checkpoints/tmp.x", "sft_checkpoints/3"]


def test_stop_by_parses_durations_and_local_times_and_refuses_the_past_and_junk():
    from datetime import datetime

    now = datetime(2026, 12, 7, 5, 0, 0).timestamp()
    assert command.parse_deadline("90m", now) == now + 5400
    assert command.parse_deadline("2h30m", now) == now + 9000 and command.parse_deadline("45s", now) == now + 45
    assert command.parse_deadline("06:50", now) == datetime(2026, 12, 7, 6, 50).timestamp()
    assert command.parse_deadline("2026-12-08T01:02:03", now) == datetime(2026, 12, 8, 1, 2, 3).timestamp()
    with pytest.raises(spec_mod.SpecError, match=r"has passed \(tomorrow's: --stop-by 2026-12-08T04:59\)$"):
        command.parse_deadline("04:59", now)
    for text, error in (("04:59", "has passed"), ("2026-12-07T04:00", "has passed$"), ("soon", "give a duration"),
                        ("", "give a duration"), ("25:00", "give a duration")):
        with pytest.raises(spec_mod.SpecError, match=error):
            command.parse_deadline(text, now)


def test_a_first_run_is_estimated_from_another_arms_by_their_steps(tmp_path):
    """Arms of one spec train 30 or 400 steps: a run with no finished run of its own arm is estimated from the
    others' scaled by the two arms' RL steps (it took the others' time as it was: 13x too short at 30 vs 400)."""
    path = _write_spec(tmp_path, "base: BASE\nseeds: [0]\nout_dir: OUT\narms: {a: [], long: [train.steps=8]}\n")
    spec = spec_mod.load_spec(path)
    _write_run(spec, "a", 0, 2, [(0, _eval(0, 0, 1, {})), (2, _eval(1, 1, 0, {}))], [{"time_step_s": 1.0}] * 2)
    done = json.loads((spec.run_dir("a", 0) / spec_mod.DONE).read_text())
    (spec.run_dir("a", 0) / spec_mod.DONE).write_text(json.dumps({**done, "elapsed_s": 100.0}))
    assert grid_mod.run_seconds(spec, "a") == 100.0 and grid_mod.run_seconds(spec, "long") == 400.0


def test_a_run_resumed_on_a_warm_start_made_again_is_refused(tmp_path):
    """An unfinished run keeps what its first attempt started from; made again since (the trainer sees a model
    folder of the same file names and sizes), the warm start would give a run of neither: refused, named."""
    run_dir = tmp_path / "out" / "a" / "seed0"
    assert grid_mod.started_from(run_dir, {"runs/sft/final/config.json": "aaaa"}) is None  # first attempt: kept
    assert grid_mod.started_from(run_dir, {"runs/sft/final/config.json": "aaaa"}) is None  # the same: resumes
    why = grid_mod.started_from(run_dir, {"runs/sft/final/config.json": "bbbb"})
    assert why.startswith("its warm start changed since the run started (runs/sft/final/config.json was aaaa, "
                          "now bbbb); delete ") and str(run_dir) in why
    assert grid_mod.started_from(tmp_path / "other", {}) is None and not (tmp_path / "other").exists()


def test_stop_by_starts_no_run_expected_to_end_after_it(tmp_path, monkeypatch, capsys):
    """Estimates from the arm's own longest finished run (its marker's elapsed_s), else any arm's; a run that
    finishes records how long it took; runs left for the deadline are listed and the grid exits 0."""
    path = _write_spec(tmp_path, "base: BASE\nseeds: [0, 1, 2]\nout_dir: OUT\narms: {a: [], b: [], c: []}\n")
    spec = spec_mod.load_spec(path)
    ev = [(0, _eval(0, 0, 1, {})), (2, _eval(1, 1, 0, {}))]
    for arm, took in (("a", 100.0), ("b", 1000.0)):
        _write_run(spec, arm, 0, 2, ev, [{"time_step_s": 1.0}] * 2)
        done = json.loads((spec.run_dir(arm, 0) / spec_mod.DONE).read_text())
        (spec.run_dir(arm, 0) / spec_mod.DONE).write_text(json.dumps({**done, "elapsed_s": took}))
    assert grid_mod.run_seconds(spec, "a") == 100.0 and grid_mod.run_seconds(spec, "b") == 1000.0
    assert grid_mod.run_seconds(spec, "c") == 1000.0  # no run of its own: the longest of any arm
    launched = []

    def fake_launch(spec, arm, seed):
        launched.append((arm, seed))
        return _FakeTrainer(spec.run_dir(arm, seed), 2, 2, 0)

    monkeypatch.setattr(grid_mod, "launch", fake_launch)
    assert command.main([str(path), "--seeds", "1", "--stop-by", "8m20s"]) == 0  # 500 s: a's 100 fit, b's 1000 not
    assert launched == [("a", 1)]
    err = capsys.readouterr().err
    assert "not started: b seed 1 (expected 17 min, past --stop-by 8m20s)" in err
    assert "not started: c seed 1 (expected 17 min" in err
    done = json.loads((spec.run_dir("a", 1) / spec_mod.DONE).read_text())
    assert 0 <= done["elapsed_s"] < 30 and done["command"] == spec.command("a", 1)
    # --run-minutes replaces the estimate (b's 1000 s from a run that shared the machine, say): 5 min fit in 8m20s
    launched.clear()
    assert command.main([str(path), "--seeds", "1", "--arms", "b", "--stop-by", "8m20s", "--run-minutes", "5"]) == 0
    assert launched == [("b", 1)]
    for bad in (["--run-minutes", "5"], ["--stop-by", "1h", "--run-minutes", "0"]):
        assert command.main([str(path), *bad]) == 2
        assert "--run-minutes" in capsys.readouterr().err
    shutil.rmtree(spec.run_dir("b", 1))
    launched.clear()
    assert command.main([str(path), "--seeds", "1", "--stop-by", "1h"]) == 0
    assert launched == [("b", 1), ("c", 1)]
    # a wall time recorded in metrics larger than the marker's elapsed_s (a resumed run) is the estimate
    shutil.rmtree(spec.out_dir)
    _write_run(spec, "a", 0, 2, ev, [{"time_step_s": 300.0}] * 2)
    assert grid_mod.run_seconds(spec, "a") == 600.5 == grid_mod.run_seconds(spec, "b")  # 2 x 300 s + 2 evals x 0.25
    shutil.rmtree(spec.out_dir)
    launched.clear()
    assert command.main([str(path), "--seeds", "0", "--stop-by", "1m"]) == 0  # nothing to estimate from: runs start
    assert launched == [("a", 0), ("b", 0), ("c", 0)]
    assert "no finished run to estimate a seed 0 from; starting it" in capsys.readouterr().err


@pytest.mark.parametrize("text, error", [
    ("prepare: {creates: x, run: y}\n", r"'prepare' must be a list"),
    ("prepare: [{creates: x}]\n", r"'prepare' item 1 must have exactly the keys 'creates' and 'run'"),
    ("prepare: [{creates: x, run: ''}]\n", r"'prepare' item 1: 'run' must be a command line"),
    ("prepare: [{creates: x, run: \"a 'b\"}]\n", r"'prepare' item 1: 'run' is not a command line"),
])
def test_prepare_errors_name_the_item(tmp_path, text, error):
    with pytest.raises(spec_mod.SpecError, match=error):
        spec_mod.load_spec(_write_spec(tmp_path, "base: BASE\nseeds: [0]\nout_dir: OUT\narms: {a: []}\n" + text))


def test_prepare_runs_once_before_the_first_run_and_a_failure_stops_the_grid(tmp_path, monkeypatch, capsys):
    made, count = tmp_path / "warm" / "model.txt", tmp_path / "count.txt"
    script = tmp_path / "prep.py"
    script.write_text("import pathlib, sys\n"
                      f"c = pathlib.Path({str(count)!r})\n"
                      "c.write_text(str(int(c.read_text() or 0) + 1) if c.exists() else '1')\n"
                      "if sys.argv[1] == 'fail': print('prep broke'); sys.exit(4)\n"
                      f"pathlib.Path({str(made)!r}).parent.mkdir(exist_ok=True)\n"
                      f"pathlib.Path({str(made)!r}).write_text('w')\n")
    spec_text = ("base: BASE\nseeds: [0]\nout_dir: OUT\narms: {a: [], b: []}\n"
                 f"prepare:\n  - creates: {made}\n    run: {sys.executable} {script} MODE\n")
    launched = []

    def fake_launch(spec, arm, seed):
        assert made.is_file(), "a run started before its prepare command made its input"
        launched.append((arm, seed))
        return _FakeTrainer(spec.run_dir(arm, seed), 2, 2, 0)

    monkeypatch.setattr(grid_mod, "launch", fake_launch)
    path = _write_spec(tmp_path, spec_text.replace("MODE", "fail"))
    assert command.main([str(path), "--dry-run"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == f"# prepare (missing: {made}): {sys.executable} {script} fail"
    assert command.main([str(path)]) == 1
    err = capsys.readouterr().err
    assert f"prepare command {sys.executable} {script} fail: exit code 4" in err and "prep broke" in err
    assert launched == [] and count.read_text() == "1"

    path = _write_spec(tmp_path, spec_text.replace("MODE", "ok"))
    assert command.main([str(path)]) == 0
    assert launched == [("a", 0), ("b", 0)] and count.read_text() == "2" and made.read_text() == "w"
    done = json.loads((tmp_path / "out" / "a" / "seed0" / "ablation_done.json").read_text())
    digest = grid_mod.prepared_digests(spec_mod.load_spec(path))[str(made)]
    assert done["prepared"] == {str(made): digest} and len(digest) == 16
    shutil.rmtree(tmp_path / "out" / "b")  # one run to redo: the prepared input exists, so it is not made again
    assert command.main([str(path)]) == 0
    assert launched == [("a", 0), ("b", 0), ("b", 0)] and count.read_text() == "2"
    # the warm start made again elsewhere is another one: a new run beside records of the old one is refused
    made.write_text("w, made again on another machine")
    shutil.rmtree(tmp_path / "out" / "b")
    assert command.main([str(path)]) == 2
    err = capsys.readouterr().err
    assert f"a seed 0 ({tmp_path / 'out' / 'a' / 'seed0'}): {made} was {digest}, here " in err
    assert "another warm start" in err and launched == [("a", 0), ("b", 0), ("b", 0)]
    made.write_text("w")  # the same bytes again: the grid goes on
    assert command.main([str(path)]) == 0 and launched[-1] == ("b", 0)


def test_prepare_names_jaxrl_llm_as_this_interpreters_trainer(tmp_path):
    spec = spec_mod.load_spec(_write_spec(tmp_path, "base: BASE\nseeds: [0]\nout_dir: OUT\narms: {a: []}\n"
                                        "prepare: [{creates: w/config.json, "
                                        "run: jaxrl-llm sft --config c.yaml a.b=1}]\n"))
    assert spec.prepare == ((Path("w/config.json"), (sys.executable, "-m", "jaxrl_llm.cli", "sft", "--config",
                                                     "c.yaml", "a.b=1")),)


def test_explorer_section_weights_each_steps_rate_by_its_count(tmp_path):
    """Continuation success over a run = successes / continuation rows (hand-computed), NaN steps skipped;
    revision success weighted by revisions, bonus by candidates; counts summed; no section without explorers."""
    spec = spec_mod.load_spec(_write_spec(tmp_path, SPEC.replace("seeds: [0, 1, 2]", "seeds: [0]")))
    ev = [(0, _eval(0.1, 0.1, 0.5, {1: 0.1})), (3, _eval(0.2, 0.2, 0.4, {1: 0.2}))]
    base = {"sampled_tokens": 5, "time_step_s": 1.0}
    _write_run(spec, "a", 0, 3, ev, [base] * 3)
    rrl = [{"rrl_replay_rows": 16, "rrl_continuation_success": 12 / 16, "rrl_fresh_success_same_prompts": 0.25},
           {"rrl_replay_rows": 0},
           {"rrl_replay_rows": 4, "rrl_continuation_success": 0.0, "rrl_fresh_success_same_prompts": math.nan}]
    herl = [{"herl_revisions": 8, "herl_candidates": 2, "herl_revision_success": 0.5, "herl_bonus_mean": 0.1,
             "herl_kept": 2, "herl_sampled_tokens": 300},
            {"herl_revisions": 0, "herl_candidates": 0, "herl_kept": 0, "herl_sampled_tokens": 0},
            {"herl_revisions": 4, "herl_candidates": 1, "herl_revision_success": 1.0, "herl_bonus_mean": 0.4,
             "herl_kept": 1, "herl_sampled_tokens": 100}]
    _write_run(spec, "b", 0, 3, ev, [{**base, **r, **h} for r, h in zip(rrl, herl)])
    runs, missing = records.collect(spec)
    e = {r.arm: records.explorer_summary(r.rows) for r in runs}
    assert e["a"] == {}
    assert e["b"]["rrl_replay_rows"] == 20 and e["b"]["herl_revisions"] == 12 and e["b"]["herl_sampled_tokens"] == 400
    assert e["b"]["herl_kept"] == 3
    assert e["b"]["rrl_continuation_success"] == pytest.approx(12 / 20, abs=1e-12)  # 12 of 20 continuations
    assert e["b"]["rrl_fresh_success_same_prompts"] == pytest.approx(0.25, abs=1e-12)  # the NaN step has no weight
    assert e["b"]["herl_revision_success"] == pytest.approx((4 + 4) / 12, abs=1e-12)
    assert e["b"]["herl_bonus_mean"] == pytest.approx((2 * 0.1 + 0.4) / 3, abs=1e-12)
    text = report.format_markdown(spec, records.arm_table(spec, runs), runs, missing)
    assert "## Explorers" in text
    assert "| b | 0 | 20 | 0.600 | 0.250 | 12 | 0.667 | 3 | 0.200 | 400 |" in text
    assert "| a | 0 |  |  |  |  |  |  |  |  |" in text
    plain = report.format_markdown(spec, records.arm_table(spec, runs[:1]), runs[:1], missing)
    assert "## Explorers" not in plain


def test_timing_keys_are_the_machines_figures_and_nothing_else():
    """Every wall / CPU / per-second key the trainer writes is timing; no policy figure is (a figure wrongly
    called timing would let a retrained run with other numbers pass as equal)."""
    timing = ["time_step_s", "time_eval_s", "time_sample_s", "time_other_s", "cpu_step_s", "cpu_eval_s",
              "sample_tokens_per_s", "update_positions_per_s", "wall_time"]
    figures = ["greedy_accuracy", "sampled_reward_mean", "pass@8", "rollout_t_sampled_accuracy", "sampled_tokens",
               "never_solved_share", "response_len_mean", "kl", "entropy", "rrl_replay_rows", "compilations"]
    assert [k for k in timing if not records.is_timing(k)] == []
    assert [k for k in figures if records.is_timing(k)] == []
