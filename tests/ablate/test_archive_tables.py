"""The committed tables are what the committed records give: every spec with an archive has its results.md and
results.csv, every committed controls table its mechanism checks, and every committed interval table (Welch over
seeds; the paired bootstrap where the records hold per-problem outcomes) what its own 'Produced by' command gives,
made again from the archive alone (the run folder pointed at an empty one) and compared line for line. A table
left from before a run was archived, or a record changed after its table, fails here. Which runs a table lists as
missing is compared, not why (not started, unfinished): that says what a machine's run folder held when the table
was made."""

import dataclasses
import re
from pathlib import Path

import pytest
import yaml

from jaxrl_llm.ablate.controls import CHECKS, report
from jaxrl_llm.ablate.records import arm_table, collect
from jaxrl_llm.ablate.report import format_csv, format_markdown
from jaxrl_llm.ablate.spec import load_spec

ROOT = Path(__file__).resolve().parents[2]
# the specs that keep an archive (the others' tables live in a machine's run folder only)
SPECS = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "configs" / "ablate").glob("*.yaml")
               if "archive" in yaml.safe_load(p.read_text()))
CONTROLS = [s for s in SPECS if Path(s).stem in CHECKS]


def _without_reasons(text: str) -> str:
    """The text with each unfinished run's reason cut ("- arm seed S: not started" -> "- arm seed S"): which runs
    are missing follows from the records, why from the machine's run folder."""
    return re.sub(r"(?m)^(- \S+ seed \d+): .*$", r"\1", text)


def _from_archive(spec_path: str, tmp_path: Path, monkeypatch):
    monkeypatch.chdir(ROOT)  # spec paths are taken from the working directory
    spec = load_spec(spec_path)
    return spec, dataclasses.replace(spec, out_dir=tmp_path / "no_runs")


@pytest.mark.parametrize("spec_path", SPECS)
def test_results_tables_are_what_the_archived_records_give(spec_path, tmp_path, monkeypatch):
    spec, bare = _from_archive(spec_path, tmp_path, monkeypatch)
    runs, missing = collect(bare)
    table = arm_table(bare, runs)
    made = format_markdown(bare, table, runs, missing).replace(str(bare.out_dir), str(spec.out_dir))
    committed = spec.report_file(spec.archive, "results.md")
    assert runs and "| arm |" in _without_reasons(made)
    assert _without_reasons(committed.read_text()).splitlines() == _without_reasons(made).splitlines(), (
        f"{committed} is stale: `jaxrl-llm ablate {spec_path} --report-only` makes it again")
    assert spec.report_file(spec.archive, "results.csv").read_text() == format_csv(table)


def test_the_specs_and_their_checks_are_found():
    assert len(SPECS) >= 10 and len(CONTROLS) >= 5


@pytest.mark.parametrize("spec_path", CONTROLS)
def test_committed_controls_tables_are_what_the_archived_records_give(spec_path, tmp_path, monkeypatch):
    spec, bare = _from_archive(spec_path, tmp_path, monkeypatch)
    committed = spec.report_file(spec.archive, "controls.md")
    made = report(spec_path, bare)
    assert committed.is_file(), (f"{spec_path} has mechanism checks and no committed table: "
                                 f"`jaxrl-llm ablate-check {spec_path} --out {committed}`")
    assert "Prediction held in" in made
    assert _without_reasons(committed.read_text()).splitlines() == _without_reasons(made).splitlines(), (
        f"{committed} is stale: `jaxrl-llm ablate-check {spec_path} --out {committed}`")


def _produced_by(table: str, tmp_path: Path, monkeypatch):
    """The committed text of an ablate-ci table, its 'Produced by' command, that command's arguments (read by
    ablate-ci's own parser), the spec and the spec with an empty run folder; tables are not written."""
    import argparse
    import shlex

    from jaxrl_llm.ablate.command import add_ci_arguments
    from jaxrl_llm.ablate.spec import Spec

    committed = (ROOT / table).read_text()
    line = re.search(r"Produced by `(jaxrl-llm ablate-ci [^`]+)`", committed)
    assert line, f"{table}: no 'Produced by' command"
    parser = argparse.ArgumentParser()
    add_ci_arguments(parser)
    args = parser.parse_args(shlex.split(line[1])[2:])
    spec, bare = _from_archive(str(args.spec), tmp_path, monkeypatch)
    name = "intervals_seeds.md" if args.seeds_only else "intervals.md"
    assert (ROOT / spec.report_file(spec.archive, name)).resolve() == (ROOT / table).resolve()
    monkeypatch.setattr(Spec, "write_table", lambda self, name, text: None)
    return committed, line[1], args, spec, bare


def _assert_remade(table: str, committed: str, command: str, made: str, spec, bare) -> None:
    made = made.replace(str(bare.out_dir), str(spec.out_dir))
    assert _without_reasons(committed).splitlines() == _without_reasons(made).splitlines(), (
        f"{table} is stale: `{command}` makes it again")


# every committed Welch table over seeds (ablate-ci --seeds-only: from the records' final rows, so the archive
# alone makes it again); the bootstrap tables (intervals.md): the test after this one
SEED_TABLES = sorted(p.relative_to(ROOT).as_posix()
                     for p in (ROOT / "tools" / "results").rglob("*intervals_seeds.md"))


@pytest.mark.parametrize("table", SEED_TABLES)
def test_committed_seed_interval_tables_are_what_their_command_gives_from_the_archive(table, tmp_path, monkeypatch):
    from jaxrl_llm.ablate import seed_intervals
    from jaxrl_llm.ablate.intervals import parse_pairs

    committed, command, args, spec, bare = _produced_by(table, tmp_path, monkeypatch)
    assert args.seeds_only, f"{table}: {command} is not a --seeds-only table"
    made, _ = seed_intervals.run(bare, parse_pairs(args.arms, args.baseline, bare), command)
    _assert_remade(table, committed, command, made, spec, bare)


def test_the_seed_interval_tables_are_found():
    assert len(SEED_TABLES) >= 5


# every committed bootstrap table (ablate-ci: paired over seeds and held-out problems); the records of these runs
# hold their per-problem outcomes, so the archive alone makes them again. The toy controls' records predate those
# outcomes: their tables need the runs' final checkpoints (gone with the machines that trained them)
BOOTSTRAP_TABLES = sorted(p.relative_to(ROOT).as_posix()
                          for p in (ROOT / "tools" / "results").rglob("*intervals.md"))
NEED_CHECKPOINTS = {"tools/results/ablate_e3_budget_control/intervals.md",
                    "tools/results/ablate_e3_temperature_control/intervals.md",
                    "tools/results/ablate_rrl_control/intervals.md"}


def test_committed_bootstrap_tables_are_what_their_command_gives_from_the_archive(tmp_path, monkeypatch):
    from jaxrl_llm.ablate import intervals
    from jaxrl_llm.ablate.spec import SpecError

    remade = []
    for table in BOOTSTRAP_TABLES:
        committed, command, args, spec, bare = _produced_by(table, tmp_path / Path(table).parent.name, monkeypatch)
        pairs = intervals.parse_pairs(args.arms, args.baseline, bare)
        try:
            made, _ = intervals.run(bare, pairs, args.resamples, args.seed, args.by_difficulty, command,
                                    log=lambda m: None)
        except SpecError as e:
            assert table in NEED_CHECKPOINTS and "no checkpoint" in str(e), (table, str(e))
            continue
        _assert_remade(table, committed, command, made, spec, bare)
        remade.append(table)
    assert len(remade) >= 3 and not NEED_CHECKPOINTS & set(remade), remade
