"""An ablation spec: what every arm trains from, its overrides, the seeds, where the runs and their archive go.

A spec (YAML; relative paths are taken from the working directory, like the trainer's):

    base: configs/toy.yaml                       # the run config every arm starts from
    overrides: [train.steps=100, eval.every=25]  # common to all arms
    seeds: [0, 1, 2]                             # train.seed of each run, the same for every arm
    out_dir: runs/ablate/example                 # runs go to <out_dir>/<arm>/seed<S>
    arms:
      grpo: []
      hot: [rollout.temperature=1.2]
    archive: tools/results/ablate_example        # optional, meant to be committed (records.py)
    prepare:                                     # optional, run once before the first run (grid.py)
      - creates: runs/example_sft/final/config.json
        run: jaxrl-llm sft --config configs/toy.yaml train.out_dir=runs/example_sft
    reports: example                             # optional: results.md -> example.results.md, and so on (a spec
                                                 # sharing its out_dir and archive with another keeps its tables)
"""

from __future__ import annotations

import difflib
import hashlib
import json
import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

SPEC_KEYS = ("base", "overrides", "seeds", "out_dir", "arms", "archive", "prepare", "reports")
# set per run by the harness, never by a spec; eval.start_cache: the arms of a seed share their step-0 evaluation
# where they start from the same weights with the same evaluation (train/start_cache.py)
HARNESS_KEYS = ("train.seed", "train.out_dir", "eval.start_cache")
START_CACHE = "start_evals"  # the folder in out_dir
DONE, LOG = "ablation_done.json", "train.log"
ARM_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


class SpecError(ValueError):
    pass


@dataclass(frozen=True)
class Spec:
    path: Path
    base: str
    overrides: tuple[str, ...]
    seeds: tuple[int, ...]
    out_dir: Path
    arms: dict[str, tuple[str, ...]]
    archive: Path | None = None
    prepare: tuple[tuple[Path, tuple[str, ...]], ...] = ()  # (path it creates, command) in order
    reports: str = ""  # the report files' prefix, if any

    def report_file(self, folder: Path, name: str) -> Path:
        """Where a report file `name` (results.md, intervals.md, ...) of this spec goes in `folder`: `name`, or
        `<reports>.<name>` where the spec names its reports, so that two specs sharing one archive (one's runs
        counted by both) do not write over each other's tables."""
        return Path(folder) / (f"{self.reports}.{name}" if self.reports else name)

    def write_table(self, name: str, text: str) -> Path:
        """`text` as the report file `name` in the archive (else out_dir), named by report_file; its path."""
        folder = self.archive or self.out_dir
        folder.mkdir(parents=True, exist_ok=True)
        path = self.report_file(folder, name)
        path.write_text(text)
        return path

    def run_dir(self, arm: str, seed: int) -> Path:
        return self.out_dir / arm / f"seed{seed}"

    def archived(self, arm: str, seed: int) -> Path | None:
        return None if self.archive is None else self.archive / "runs" / arm / f"seed{seed}"

    def record(self, arm: str, seed: int) -> Path | None:
        """The folder holding the run's finished record: its run folder, else its archived copy, else None.
        A record trained by another command than the spec's today (an arm's or the common overrides edited,
        the base or the seed changed, a record copied to another arm's folder) is refused: counted as finished
        it would mix two configurations in one arm's figures, and run again it would replace what it records."""
        for d in (self.run_dir(arm, seed), self.archived(arm, seed)):
            if d is not None and (d / DONE).is_file():
                self.check_record(d, arm, seed)
                return d
        return None

    def done_text(self, arm: str, seed: int, **facts) -> str:
        """ablation_done.json's text for a finished (arm, seed): the command that trained it and its base config's
        digest (what `record` checks), and `facts` (steps, exit code, times)."""
        return json.dumps({"arm": arm, "seed": seed, **facts, "base_digest": self.base_digest(),
                           "command": self.command(arm, seed)}, indent=1) + "\n"

    def base_digest(self) -> str:
        """sha256 (16 hex digits) of the base config as YAML reads it (comments and layout left out): the command
        names the base by path, so an edit of its contents would otherwise go unseen."""
        try:
            content = yaml.safe_load(Path(self.base).read_text())
        except (OSError, yaml.YAMLError) as e:
            raise SpecError(f"{self.path}: base {self.base}: {e}") from None
        return hashlib.sha256(json.dumps(content, sort_keys=True, default=str).encode()).hexdigest()[:16]

    def check_record(self, d: Path, arm: str, seed: int) -> None:
        """Refuse (SpecError) the record in `d` unless the spec's command for (arm, seed) today trained it."""
        try:
            done = json.loads((d / DONE).read_text())
            recorded = done["command"]
            if not isinstance(recorded, list) or not all(isinstance(a, str) for a in recorded):
                raise TypeError("not a list of strings")
        except (ValueError, KeyError, TypeError) as e:
            raise SpecError(f"{self.path}: arm '{arm}', seed {seed}: {d / DONE} is not a finished run's record "
                            f"({type(e).__name__}: {e})") from None
        # the interpreter's path (argv[0..2] = python -m jaxrl_llm.cli) differs between machines, and out_dir may
        # move (to a bigger disk) without changing what a run trains, nor may a shared start evaluation (records
        # made before the harness set it lack it); the rest may not differ
        def what_trains(argv):
            return [a for a in argv[3:] if not a.startswith(("train.out_dir=", "eval.start_cache="))]

        base = done.get("base_digest")  # records made before the harness kept it: the command alone
        if base is not None and base != (today := self.base_digest()):
            raise SpecError(f"{self.path}: arm '{arm}', seed {seed}: the record {d} was trained from another content "
                            f"of the base config {self.base} (digest {base}, today {today}). Restore the "
                            f"base, or give the spec a new base file (or a new out_dir and archive).")
        want, got = what_trains(self.command(arm, seed)), what_trains(recorded)
        if got != want:
            added = [a for a in want if a not in got]
            dropped = [a for a in got if a not in want]
            what = (f"the spec now adds {added} and drops {dropped}" if added or dropped
                    else f"the same arguments in another order: {shlex.join(got)}")
            raise SpecError(f"{self.path}: arm '{arm}', seed {seed}: the record {d} was trained by another command "
                            f"than the spec gives today ({what}). Restore the spec, or give the changed arm a new "
                            f"name (or the spec a new out_dir and archive) so that both stay what they are.")

    def run_overrides(self, arm: str, seed: int) -> list[str]:
        return [*self.overrides, *self.arms[arm], f"train.seed={seed}", f"train.out_dir={self.run_dir(arm, seed)}",
                f"eval.start_cache={self.out_dir / START_CACHE}"]

    def command(self, arm: str, seed: int) -> list[str]:
        # `-m` from the harness's working directory: a grid started in a frozen copy of the tree trains that copy
        return [sys.executable, "-m", "jaxrl_llm.cli", "train", "--config", self.base, *self.run_overrides(arm, seed)]


def _override_list(value, key: str, fail) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        fail(f"'{key}' must be a list of a.b=value overrides, got {value!r}")
    for i, item in enumerate(value):
        if not isinstance(item, str) or "=" not in item or not item.split("=", 1)[0].strip():
            fail(f"'{key}' item {i + 1} ({item!r}) is not of the form a.b=value")
        name = item.split("=", 1)[0].strip()
        if name in HARNESS_KEYS:
            fail(f"'{key}' sets {name}, which the harness sets for each run (from 'seeds' and 'out_dir')")
    return tuple(value)


def load_spec(path: str | Path) -> Spec:
    """Read and check a spec; every error names the spec file and the key at fault."""
    path = Path(path)

    def fail(msg):
        raise SpecError(f"{path}: {msg}")

    try:
        raw = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        fail("no such spec file")
    except yaml.YAMLError as e:
        fail(f"invalid YAML: {e}")
    if not isinstance(raw, dict):
        fail(f"a spec is a mapping with keys {', '.join(SPEC_KEYS)}; got {type(raw).__name__}")
    for key in raw:
        if key not in SPEC_KEYS:
            close = difflib.get_close_matches(str(key), SPEC_KEYS, n=2, cutoff=0.5)
            fail(f"unknown key '{key}'; " + (f"did you mean {' or '.join(map(repr, close))}?" if close
                                               else f"known keys: {', '.join(SPEC_KEYS)}"))
    for key in ("base", "seeds", "out_dir", "arms"):
        if key not in raw or raw[key] is None:
            fail(f"missing '{key}'")
    base, out_dir, seeds, arms = raw["base"], raw["out_dir"], raw["seeds"], raw["arms"]
    if not isinstance(base, str) or not base:
        fail(f"'base' must be the path of a run config, got {base!r}")
    if not Path(base).is_file():
        fail(f"'base' is {base!r}: no such file (relative paths are from the working directory {Path.cwd()})")
    if not isinstance(out_dir, str) or not out_dir:
        fail(f"'out_dir' must be a folder path, got {out_dir!r}")
    if not isinstance(seeds, list) or not seeds:
        fail(f"'seeds' must be a non-empty list of integers, got {seeds!r}")
    for s in seeds:
        if not isinstance(s, int) or isinstance(s, bool):
            fail(f"'seeds' must hold integers, got {s!r}")
        if seeds.count(s) > 1:
            fail(f"'seeds' lists {s} {seeds.count(s)} times; each seed is one run per arm")
    if not isinstance(arms, dict):
        fail(f"'arms' must map arm names to override lists, got {arms!r}")
    if not arms:
        fail("'arms' is empty; give at least one, e.g. `grpo: []`")
    checked = {}
    for name, value in arms.items():
        if not isinstance(name, str) or not ARM_NAME.match(name):
            fail(f"'arms.{name}': an arm name is a folder name (letters, digits, _ . -)")
        checked[name] = _override_list(value, f"arms.{name}", fail)
    archive = raw.get("archive")
    if archive is not None and (not isinstance(archive, str) or not archive):
        fail(f"'archive' must be a folder path, got {archive!r}")
    reports = raw.get("reports", "")
    if not isinstance(reports, str) or (reports and not ARM_NAME.match(reports)):
        fail(f"'reports' is a file-name prefix (letters, digits, _ . -), got {reports!r}")
    return Spec(path, base, _override_list(raw.get("overrides"), "overrides", fail), tuple(seeds), Path(out_dir),
                checked, None if archive is None else Path(archive), _prepare_steps(raw.get("prepare"), fail),
                reports)


def _prepare_steps(value, fail) -> tuple[tuple[Path, tuple[str, ...]], ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        fail(f"'prepare' must be a list of {{creates: PATH, run: COMMAND}}, got {value!r}")
    steps = []
    for i, item in enumerate(value):
        where = f"'prepare' item {i + 1}"
        if not isinstance(item, dict) or set(item) != {"creates", "run"}:
            fail(f"{where} must have exactly the keys 'creates' and 'run', got {item!r}")
        if not isinstance(item["creates"], str) or not item["creates"]:
            fail(f"{where}: 'creates' must be a path, got {item['creates']!r}")
        try:
            argv = shlex.split(item["run"]) if isinstance(item["run"], str) else []
        except ValueError as e:
            fail(f"{where}: 'run' is not a command line ({e})")
        if not argv:
            fail(f"{where}: 'run' must be a command line, got {item['run']!r}")
        if argv[0] == "jaxrl-llm":  # this interpreter's trainer, whether or not a venv's bin is on PATH
            argv = [sys.executable, "-m", "jaxrl_llm.cli", *argv[1:]]
        steps.append((Path(item["creates"]), tuple(argv)))
    return tuple(steps)


def check_configs(spec: Spec, arms) -> None:
    """Load each arm's run config as the trainer will, so a typo fails now rather than mid-grid."""
    from jaxrl_llm.config import ConfigError, load_config

    for arm in arms:
        try:
            load_config(spec.base, spec.run_overrides(arm, spec.seeds[0]))
        except ConfigError as e:
            raise SpecError(f"{spec.path}: arm '{arm}': {e}") from None
