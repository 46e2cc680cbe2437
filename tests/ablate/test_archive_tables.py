"""The committed tables are what the committed records give: every spec with an archive has its results.md and
results.csv, and every committed controls table its mechanism checks, made again from the archive alone (the
run folder pointed at an empty one) and compared line for line. A table left from before a run was archived, or
a record changed after its table, fails here. Which runs a table lists as missing is compared, not why (not
started, unfinished): that says what a machine's run folder held when the table was made."""

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
