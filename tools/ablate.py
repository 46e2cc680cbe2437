"""Ablation harness: train every arm of a spec on the same seeds, one run per (arm, seed), then report
each arm's held-out results (mean, sample std and n over seeds), its sampled-token budget and wall
time, and curves. An exploration method is credited only by such a table (ALGORITHMS.md section 5).

    .venv/bin/python tools/ablate.py configs/ablate/example.yaml               # run what is unfinished, report
    .venv/bin/python tools/ablate.py configs/ablate/example.yaml --dry-run     # print the commands only
    .venv/bin/python tools/ablate.py configs/ablate/example.yaml --report-only # table from the finished runs

A spec (YAML; relative paths are taken from the working directory, like the trainer's):

    base: configs/toy.yaml                       # the run config every arm starts from
    overrides: [train.steps=100, eval.every=25]  # common to all arms
    seeds: [0, 1, 2]                             # train.seed of each run, the same for every arm
    out_dir: runs/ablate/example                 # runs go to <out_dir>/<arm>/seed<S>
    arms:
      grpo: []
      hot: [rollout.temperature=1.2]
    archive: tools/results/ablate_example        # optional, meant to be committed: see below

Each run is `python -m jaxrl_llm.cli train --config base *overrides *arm train.seed=S train.out_dir=...`
in a subprocess (output appended to <run_dir>/train.log); rerunning the harness resumes unfinished
runs from their checkpoints and skips finished ones (those with ablation_done.json). Ctrl-C / SIGTERM
is forwarded to the running trainer, which checkpoints and exits; then the harness stops.

With `archive`, every finished run's record (config.yaml, metrics.jsonl, ablation_done.json: a few
kB, no checkpoints) is copied to <archive>/runs/<arm>/seed<S> and the report to <archive>. A run whose
record is there counts as finished even where out_dir is gone, so a grid longer than one machine's life
continues on a fresh checkout: commit the archive, rerun the same command.

`prepare` lists commands that make what the runs start from (e.g. one shared SFT warm start that
every arm loads through model.name), each run once, before the first run, only while the path it
`creates` is missing; output goes to <out_dir>/prepare.log and a signal reaches it like a run:

    prepare:
      - creates: runs/example_sft/final/config.json
        run: jaxrl-llm sft --config configs/example.yaml train.out_dir=runs/example_sft
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import difflib
import io
import json
import math
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

SPEC_KEYS = ("base", "overrides", "seeds", "out_dir", "arms", "archive", "prepare")
HARNESS_KEYS = ("train.seed", "train.out_dir")  # set per run by the harness, never by a spec
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
DONE, LOG = "ablation_done.json", "train.log"
RECORD = ("config.yaml", "metrics.jsonl", DONE)  # what the archive keeps of a finished run (no checkpoints)
EVAL_KS = (1, 2, 4, 8, 16)
EVAL_COLUMNS = (("greedy_accuracy", "greedy"), ("sampled_accuracy", "sampled T=1"),
                *((f"pass@{k}", f"pass@{k}") for k in EVAL_KS), ("never_solved_share", "never solved"),
                ("greedy_reward_mean", "greedy reward"), ("sampled_reward_mean", "sampled reward"),
                # the same sampled figures at the run's configured rollout temperature (train/evaluate.py: an arm
                # whose controller moves T toward 1 would otherwise gain at T=1 for that alone)
                ("rollout_t_sampled_accuracy", "sampled T=run"),
                *((f"rollout_t_pass@{k}", f"pass@{k} T=run") for k in EVAL_KS),
                ("rollout_t_never_solved_share", "never solved T=run"),
                ("rollout_t_sampled_reward_mean", "sampled reward T=run"))
# mean rewards: shown when rewards are graded (rubric tasks, partial credit), i.e. some run's differ from its accuracy
REWARD_COLUMNS = {"greedy_reward_mean": "greedy_accuracy", "sampled_reward_mean": "sampled_accuracy",
                  "rollout_t_sampled_reward_mean": "rollout_t_sampled_accuracy"}
# figures that records written before evaluation measured them lack: shown when some arm has them
ROLLOUT_T_COLUMNS = {k for k, _ in EVAL_COLUMNS if k.startswith("rollout_t_")}
# training prompts first solved by a continuation of a replayed prefix state (RRL), over the whole run
REPLAY_COLUMNS = (("rrl_solved_first_via_replay", "solved first via replay"),)
BUDGET_COLUMNS = REPLAY_COLUMNS + (("sampled_tokens", "sampled tokens"), ("wall_s", "wall s"), ("rl_steps", "RL steps"))
# shown when some arm has them
OPTIONAL = {k for k, _ in REPLAY_COLUMNS} | {f"pass@{k}" for k in EVAL_KS} | set(REWARD_COLUMNS) | ROLLOUT_T_COLUMNS
COLUMNS = EVAL_COLUMNS + BUDGET_COLUMNS
# what an explorer did over a whole run, from its train rows: (metric, label, weight): a step's count summed
# (weight None), or a per-step rate averaged with each step weighted by its count of `weight` (NaN steps skipped)
EXPLORER_COLUMNS = (("rrl_replay_rows", "replay rows", None),
                    ("rrl_continuation_success", "continuation success", "rrl_replay_rows"),
                    ("rrl_fresh_success_same_prompts", "fresh success, same prompts", "rrl_replay_rows"),
                    ("herl_revisions", "revisions", None),
                    ("herl_revision_success", "revision success", "herl_revisions"),
                    ("herl_bonus_mean", "mean bonus", "herl_candidates"),
                    ("herl_sampled_tokens", "revision tokens", None))
ARM_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


class SpecError(ValueError):
    pass


# -- the spec -------------------------------------------------------------------------------------
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

    def run_dir(self, arm: str, seed: int) -> Path:
        return self.out_dir / arm / f"seed{seed}"

    def archived(self, arm: str, seed: int) -> Path | None:
        return None if self.archive is None else self.archive / "runs" / arm / f"seed{seed}"

    def record(self, arm: str, seed: int) -> Path | None:
        """The folder holding the run's finished record: its run folder, else its archived copy, else None."""
        for d in (self.run_dir(arm, seed), self.archived(arm, seed)):
            if d is not None and (d / DONE).is_file():
                return d
        return None

    def run_overrides(self, arm: str, seed: int) -> list[str]:
        return [*self.overrides, *self.arms[arm], f"train.seed={seed}", f"train.out_dir={self.run_dir(arm, seed)}"]

    def command(self, arm: str, seed: int) -> list[str]:
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
    return Spec(path, base, _override_list(raw.get("overrides"), "overrides", fail), tuple(seeds), Path(out_dir),
                checked, None if archive is None else Path(archive), _prepare_steps(raw.get("prepare"), fail))


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


# -- reading runs (pure) ---------------------------------------------------------------------------
def load_rows(path: Path) -> list[dict]:
    from jaxrl_llm.train.metrics import read_rows

    return read_rows(path)


def by_step(rows: list[dict], kind: str) -> dict[int, dict]:
    """Rows of one kind keyed by step, in step order; of two rows at one step the later wins."""
    found = {}
    for r in rows:
        if r.get("kind") == kind:
            found[r["step"]] = r
    return dict(sorted(found.items()))


def run_steps(run_dir: Path) -> int:
    """train.steps as the trainer ran it (its config.yaml in the run folder)."""
    return int(yaml.safe_load((Path(run_dir) / "config.yaml").read_text())["train"]["steps"])


def final_eval_problem(run_dir: Path) -> str | None:
    """Why a run that exited is not finished (no eval row at train.steps), or None when it is."""
    if not (run_dir / "config.yaml").is_file() or not (run_dir / "metrics.jsonl").is_file():
        return "no config.yaml / metrics.jsonl in the run folder"
    steps = run_steps(run_dir)
    evals = by_step(load_rows(run_dir / "metrics.jsonl"), "eval")
    if steps not in evals:
        return f"no eval row at step {steps} (last eval step: {max(evals, default='none')})"
    return None


def run_summary(rows: list[dict], steps: int) -> dict | None:
    """A run's step-0 and final evaluation metrics and its budget; None without an eval row at `steps`.
    Tokens are the rollouts' (train rows' `sampled_tokens`); None when any train row lacks them.
    Wall time is the RL steps' time plus the evaluations' (SFT and start-up are not counted)."""
    evals, train = by_step(rows, "eval"), by_step(rows, "train")
    if steps not in evals:
        return None
    tokens = [r.get("sampled_tokens") for r in train.values()]
    step_times = [r.get("time_step_s") for r in train.values()]
    budget = {"sampled_tokens": None if None in tokens else float(sum(tokens)),
              "wall_s": None if None in step_times else
              float(sum(step_times) + sum(r.get("time_eval_s", 0.0) for r in evals.values())),
              "rl_steps": float(len(train))}
    last = train[max(train)] if train else {}
    for key, _ in REPLAY_COLUMNS:
        if key in last:
            budget[key] = float(last[key])

    def eval_metrics(row):
        out = {k: float(row[k]) for k, _ in EVAL_COLUMNS if k in row}
        if all(out.get(k) == out.get(acc) for k, acc in REWARD_COLUMNS.items()):
            out = {k: v for k, v in out.items() if k not in REWARD_COLUMNS}
        return out

    return {"start": eval_metrics(evals.get(0, {})), "final": {**eval_metrics(evals[steps]), **budget}}


def explorer_summary(rows: list[dict]) -> dict[str, float]:
    """EXPLORER_COLUMNS over a run's train rows (the later row of a step wins); a metric no row has is left out."""
    train = list(by_step(rows, "train").values())
    out = {}
    for key, _, weight in EXPLORER_COLUMNS:
        if weight is None:
            if any(key in r for r in train):
                out[key] = float(sum(r.get(key, 0) for r in train))
            continue
        pairs = [(r[key], r.get(weight, 0)) for r in train if key in r and not math.isnan(r[key])]
        total = sum(w for _, w in pairs)
        if total > 0:
            out[key] = sum(v * w for v, w in pairs) / total
    return out


@dataclass(frozen=True)
class Stat:
    mean: float
    std: float  # sample standard deviation (ddof 1); nan for one value
    n: int


def aggregate(values: list[float]) -> Stat | None:
    if not values:
        return None
    n = len(values)
    mean = sum(values) / n
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else math.nan
    return Stat(mean, std, n)


def aggregate_arm(summaries: list[dict]) -> dict[str, Stat]:
    """Mean, spread and n of each metric over the runs (seeds) that have it."""
    keys = [k for k, _ in COLUMNS]
    stats = {k: aggregate([s[k] for s in summaries if s.get(k) is not None]) for k in keys}
    return {k: v for k, v in stats.items() if v is not None}


@dataclass(frozen=True)
class RunData:
    arm: str
    seed: int
    steps: int
    rows: list


def collect(spec: Spec) -> tuple[list[RunData], list[tuple[str, int, str]]]:
    """Finished runs (with their metrics rows) and the (arm, seed, why) of every one that is not."""
    runs, missing = [], []
    for arm in spec.arms:
        for seed in spec.seeds:
            d = spec.record(arm, seed)
            if d is None:
                d = spec.run_dir(arm, seed)
                why = f"unfinished or failed (see {d / LOG})" if d.exists() else "not started"
                missing.append((arm, seed, why))
                continue
            why = final_eval_problem(d)
            if why is not None:
                missing.append((arm, seed, f"marked done, but {why}"))
                continue
            runs.append(RunData(arm, seed, run_steps(d), load_rows(d / "metrics.jsonl")))
    return runs, missing


def arm_table(spec: Spec, runs: list[RunData]) -> list[dict]:
    """Two lines per arm with finished runs: the step-0 evaluation ("start") and the final one."""
    table = []
    for arm in spec.arms:
        mine = [(r, run_summary(r.rows, r.steps)) for r in runs if r.arm == arm]
        if not mine:
            continue
        seeds = [r.seed for r, _ in mine]
        steps = sorted({r.steps for r, _ in mine})
        for when in ("start", "final"):
            table.append({"arm": arm, "when": when, "step": "0" if when == "start" else "/".join(map(str, steps)),
                          "seeds": seeds, "stats": aggregate_arm([s[when] for _, s in mine])})
    return table


# -- formatting (pure) -----------------------------------------------------------------------------
def _cell(key: str, stat: Stat | None, n_arm: int) -> str:
    if stat is None:
        return ""
    fmt = {"sampled_tokens": "{:,.0f}", "wall_s": "{:.1f}", "rl_steps": "{:.0f}",
           "rrl_solved_first_via_replay": "{:.1f}"}.get(key, "{:.3f}")
    text = fmt.format(stat.mean)
    if stat.n > 1 and key != "rl_steps":
        text += " ± " + fmt.format(stat.std)
    return text + (f" (n={stat.n})" if stat.n != n_arm else "")


def format_markdown(spec: Spec, table: list[dict], runs: list[RunData], missing: list) -> str:
    shown = [(k, label) for k, label in COLUMNS if k not in OPTIONAL or any(k in line["stats"] for line in table)]
    out = [f"# Ablation: {spec.path}", "",
           f"Produced by `python tools/ablate.py {spec.path}` (rerun it to resume, `--report-only` to redo this).", "",
           f"- base: `{spec.base}`",
           f"- overrides (all arms): `{' '.join(spec.overrides) or '(none)'}`",
           f"- seeds (train.seed): {', '.join(map(str, spec.seeds))}",
           f"- runs: `{spec.out_dir}/<arm>/seed<S>`",
           "- arms:", *[f"  - **{arm}**: `{' '.join(ov) or '(base + overrides only)'}`"
                        for arm, ov in spec.arms.items()],
           "", "Held-out evaluation at step 0 (the starting policy) and at the last RL step: mean ± sample std "
           "over seeds. Sampled tokens are the rollouts' (the budget); wall s = RL step time + evaluation time.",
           ""]
    if table:
        out += ["| arm | at step | seeds | " + " | ".join(label for _, label in shown) + " |",
                "|" + "---|" * (3 + len(shown))]
    else:
        out.append("No run has finished yet.")
    for line in table:
        n = len(line["seeds"])
        cells = [_cell(k, line["stats"].get(k), n) for k, _ in shown]
        out.append(f"| {line['arm']} | {line['step']} | {n} | " + " | ".join(cells) + " |")
    finals = [line for line in table if line["when"] == "final"]
    budgets = {line["arm"]: line["stats"]["sampled_tokens"].mean for line in finals
               if "sampled_tokens" in line["stats"] and line["stats"]["sampled_tokens"].n == len(line["seeds"])}
    lacking = [line["arm"] for line in finals if line["arm"] not in budgets]
    if lacking:
        out += ["", "Budget: sampled tokens not recorded (a train row without `sampled_tokens`) in some runs of: "
                + ", ".join(lacking) + "."]
    elif budgets:
        low, high = min(budgets.values()), max(budgets.values())
        out += ["", f"Budget: mean sampled tokens per run range {low:,.0f} .. {high:,.0f} over arms"
                + (f" (max/min {high / low:.3f})." if low > 0 else ".")]
    if runs:
        out += ["", "## Per run (final evaluation)", "", "| arm | seed | greedy | sampled T=1 | never solved | "
                "sampled tokens | wall s |", "|---|---|---|---|---|---|---|"]
        for r in runs:
            f = {k: Stat(v, math.nan, 1) for k, v in run_summary(r.rows, r.steps)["final"].items() if v is not None}
            out.append(f"| {r.arm} | {r.seed} | " + " | ".join(
                _cell(k, f.get(k), 1) for k in ("greedy_accuracy", "sampled_accuracy", "never_solved_share",
                                                "sampled_tokens", "wall_s")) + " |")
    explored = [(r, explorer_summary(r.rows)) for r in runs]
    cols = [(k, label) for k, label, _ in EXPLORER_COLUMNS if any(k in e for _, e in explored)]
    counts = {k for k, _, weight in EXPLORER_COLUMNS if weight is None}
    if cols:
        out += ["", "## Explorers (per run, over all RL steps)", "",
                "Counts are sums over the steps; rates are per-step rates weighted by the step's replay rows "
                "(continuations; fresh success is of the fresh rollouts of the replayed prompts so far), "
                "revisions (revision success: above the group's best), or candidates (bonus).", "",
                "| arm | seed | " + " | ".join(label for _, label in cols) + " |", "|" + "---|" * (2 + len(cols))]
        for r, e in explored:
            out.append(f"| {r.arm} | {r.seed} | " + " | ".join(
                "" if k not in e else f"{e[k]:,.0f}" if k in counts else f"{e[k]:.3f}" for k, _ in cols) + " |")
    if missing:
        out += ["", f"## Missing: {len(missing)} of {len(spec.arms) * len(spec.seeds)} runs not in the table", ""]
        out += [f"- {arm} seed {seed}: {why}" for arm, seed, why in missing]
    return "\n".join(out) + "\n"


def format_csv(table: list[dict]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["arm", "when", "step", "n_seeds", "seeds",
                *[f"{k}_{p}" for k, _ in COLUMNS for p in ("mean", "std", "n")]])
    for line in table:
        cells = []
        for k, _ in COLUMNS:
            st = line["stats"].get(k)
            cells += ["", "", 0] if st is None else [repr(st.mean), "" if math.isnan(st.std) else repr(st.std), st.n]
        w.writerow([line["arm"], line["when"], line["step"], len(line["seeds"]), " ".join(map(str, line["seeds"])),
                    *cells])
    return buf.getvalue()


# -- curves ----------------------------------------------------------------------------------------
def trailing_mean(values: list[float], window: int) -> list[float]:
    return [sum(values[max(0, i - window + 1):i + 1]) / (i + 1 - max(0, i - window + 1)) for i in range(len(values))]


def arm_curve(runs: list[RunData], kind: str, key: str, window: int = 1):
    """(steps, mean, min, max) over runs of `key` in rows of `kind`, each run smoothed first."""
    per_step: dict[int, list[float]] = {}
    for r in runs:
        pts = [(s, row[key]) for s, row in by_step(r.rows, kind).items() if key in row]
        for (s, _), v in zip(pts, trailing_mean([v for _, v in pts], window)):
            per_step.setdefault(s, []).append(v)
    steps = sorted(per_step)
    return (steps, [sum(per_step[s]) / len(per_step[s]) for s in steps],
            [min(per_step[s]) for s in steps], [max(per_step[s]) for s in steps])


def plot_curves(spec: Spec, runs: list[RunData], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ks = [k for k in EVAL_KS if any(f"pass@{k}" in row for r in runs for row in by_step(r.rows, "eval").values())]
    top = f"pass@{8 if 8 in ks else ks[-1]}" if ks else "sampled_accuracy"
    longest = max((len(by_step(r.rows, "train")) for r in runs), default=0)
    window = max(1, min(10, longest // 10))
    panels = (("eval", "greedy_accuracy", "held-out greedy accuracy", 1),
              ("eval", top, f"held-out {top} (T=1)", 1),
              ("train", "reward_mean", f"training reward (trailing mean of {window})", window))
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for ax, (kind, key, title, w) in zip(axes, panels):
        for i, arm in enumerate(spec.arms):
            mine = [r for r in runs if r.arm == arm]
            steps, mean, lo, hi = arm_curve(mine, kind, key, w)
            if steps:
                ax.plot(steps, mean, color=f"C{i}", marker="o" if kind == "eval" else None, markersize=3,
                        label=f"{arm} (n={len(mine)})")
                ax.fill_between(steps, lo, hi, color=f"C{i}", alpha=0.2, linewidth=0)
        ax.set_title(title)
        ax.set_xlabel("RL step")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:  # a panel no finished run has rows for stays empty
            ax.legend(loc="best", fontsize=8)
    fig.suptitle(f"{spec.path}: mean over seeds, band min..max")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def archive_run(spec: Spec, arm: str, seed: int) -> None:
    """Copy a finished run's record into the archive (no-op without one, or when the run is not finished)."""
    src, dst = spec.run_dir(arm, seed), spec.archived(arm, seed)
    if dst is None or not (src / DONE).is_file():
        return
    dst.mkdir(parents=True, exist_ok=True)
    for name in RECORD:
        tmp = dst / f".{name}.tmp"
        shutil.copyfile(src / name, tmp)
        tmp.replace(dst / name)  # the marker last: a half-copied record never counts as finished


def write_report(spec: Spec) -> list[Path]:
    for arm in spec.arms:
        for seed in spec.seeds:
            archive_run(spec, arm, seed)
    runs, missing = collect(spec)
    table = arm_table(spec, runs)
    written = []
    for folder in (spec.out_dir, spec.archive):
        if folder is None:
            continue
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "results.md").write_text(format_markdown(spec, table, runs, missing))
        (folder / "results.csv").write_text(format_csv(table))
        written += [folder / "results.md", folder / "results.csv"]
        if runs:
            plot_curves(spec, runs, folder / "curves.png")
            written.append(folder / "curves.png")
    return written


# -- running the grid ------------------------------------------------------------------------------
def log_tail(path: Path, lines: int = 15) -> str:
    text = path.read_text(errors="replace") if path.is_file() else ""
    return "\n".join("    " + ln.split("\r")[-1] for ln in text.rstrip().splitlines()[-lines:])


def _start(cmd, log_path: Path, label: str = "") -> subprocess.Popen:
    """Start `cmd` offline with its output appended to `log_path` after a header naming it."""
    with log_path.open("a") as log:
        log.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} tools/ablate.py{label}: {shlex.join(cmd)}\n")
        log.flush()
        return subprocess.Popen(list(cmd), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env={**os.environ, **OFFLINE_ENV})


@contextlib.contextmanager
def _forwarding(live):
    """While inside, SIGINT / SIGTERM are passed on as SIGTERM to the processes `live()` returns (a trainer
    checkpoints after its current step and exits); yields the list of signals received."""
    stopped: list[int] = []

    def forward(signum, frame):
        stopped.append(signum)
        for proc in live():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)

    old = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stopped
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


def _launch(spec: Spec, arm: str, seed: int) -> subprocess.Popen:
    run_dir = spec.run_dir(arm, seed)
    run_dir.mkdir(parents=True, exist_ok=True)
    return _start(spec.command(arm, seed), run_dir / LOG)


def run_prepare(spec: Spec) -> tuple[str | None, int | None]:
    """Run the spec's prepare commands whose path is missing, in order. Returns (what failed, signal)."""
    log_path = spec.out_dir / "prepare.log"
    for creates, argv in spec.prepare:
        if creates.exists():
            continue
        spec.out_dir.mkdir(parents=True, exist_ok=True)
        print(f"prepare: {shlex.join(argv)} (log: {log_path})", file=sys.stderr)
        proc = _start(argv, log_path, " prepare")
        with _forwarding(lambda: [proc]) as stopped:
            rc = proc.wait()
        if stopped:
            return None, stopped[0]
        if rc != 0 or not creates.exists():
            why = f"exit code {rc}" if rc != 0 else f"it exited 0 but did not create {creates}"
            return f"prepare command {shlex.join(argv)}: {why}; last lines of {log_path}:\n{log_tail(log_path)}", None
    return None, None


def run_grid(spec: Spec, todo: list[tuple[str, int]], parallel: int = 1, already: int = 0) -> tuple[list, int | None]:
    """Train the (arm, seed) runs of `todo`, `parallel` at a time; the progress bar also counts the
    `already` finished runs of the grid. Returns the failures as (arm, seed, why) and the signal that
    stopped the grid (None if it ran through)."""
    from tqdm import tqdm

    pending, running, failed = list(todo), {}, []
    bar = tqdm(total=len(todo) + already, initial=already, desc="ablation", unit="run")
    with _forwarding(lambda: list(running.values())) as stopped:
        try:
            while running or (pending and not stopped):
                while pending and not stopped and len(running) < parallel:
                    arm, seed = pending.pop(0)
                    running[arm, seed] = _launch(spec, arm, seed)
                    bar.set_description(", ".join(f"{a}/seed{s}" for a, s in running))
                time.sleep(0.2)
                for (arm, seed), proc in list(running.items()):
                    rc = proc.poll()
                    if rc is None:
                        continue
                    del running[arm, seed]
                    run_dir = spec.run_dir(arm, seed)
                    why = f"exit code {rc}" if rc != 0 else final_eval_problem(run_dir)
                    if why is None:
                        (run_dir / DONE).write_text(json.dumps(
                            {"arm": arm, "seed": seed, "steps": run_steps(run_dir), "exit_code": rc,
                             "command": spec.command(arm, seed), "finished": time.strftime("%Y-%m-%d %H:%M:%S")},
                            indent=1) + "\n")
                        archive_run(spec, arm, seed)
                    elif not stopped:
                        failed.append((arm, seed, why))
                        tqdm.write(f"FAILED: arm {arm}, seed {seed}: {why}; last lines of {run_dir / LOG}:\n"
                                   f"{log_tail(run_dir / LOG)}", file=sys.stderr)
                    if why is None or not stopped:
                        bar.update(1)
                        bar.set_postfix(failed=len(failed))
        finally:
            bar.close()
    return failed, (stopped[0] if stopped else None)


def _pick(text: str | None, known, what: str, parse=str) -> list:
    if text is None:
        return list(known)
    picked = [parse(t.strip()) for t in text.split(",") if t.strip()]
    unknown = [p for p in picked if p not in known]
    if unknown or not picked:
        raise SpecError(f"--{what} {text!r}: {unknown or 'nothing'} not in the spec's {what} "
                        f"({', '.join(map(str, known))})")
    return picked


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("spec", type=Path, help="ablation spec (YAML), e.g. configs/ablate/example.yaml")
    ap.add_argument("--arms", help="comma-separated arms to run (default: all); the report covers the whole spec")
    ap.add_argument("--seeds", help="comma-separated seeds to run (default: all in the spec)")
    ap.add_argument("--report-only", action="store_true", help="no runs: write the report from what finished")
    ap.add_argument("--dry-run", action="store_true", help="print the commands of the unfinished runs, run nothing")
    ap.add_argument("--parallel", type=int, default=1, help="runs at a time (each trainer uses every core)")
    args = ap.parse_args(argv)
    try:
        spec = load_spec(args.spec)
        if args.report_only and (args.arms or args.seeds or args.dry_run):
            raise SpecError("--report-only reports the whole spec; it takes no --arms, --seeds or --dry-run")
        if args.report_only:
            for path in write_report(spec):
                print(path)
            return 0
        if args.parallel < 1:
            raise SpecError(f"--parallel must be >= 1, got {args.parallel}")
        arms = _pick(args.arms, list(spec.arms), "arms")
        seeds = _pick(args.seeds, spec.seeds, "seeds", int)
        check_configs(spec, arms)
    except (SpecError, ValueError) as e:
        print(f"ablate: error: {e}", file=sys.stderr)
        return 2
    # seed-major order: after each pass over the arms the table compares them on equal seeds
    grid = [(arm, seed) for seed in seeds for arm in arms]
    todo = [(a, s) for a, s in grid if spec.record(a, s) is None]
    if args.dry_run:
        env = " ".join(f"{k}={v}" for k, v in OFFLINE_ENV.items())
        for creates, argv in spec.prepare if todo else ():
            print(f"# prepare ({'exists' if creates.exists() else 'missing'}: {creates}): {shlex.join(argv)}")
        for arm, seed in grid:
            d = spec.run_dir(arm, seed)
            if (arm, seed) in todo:
                print(f"{env} {shlex.join(spec.command(arm, seed))} >> {shlex.quote(str(d / LOG))} 2>&1")
            else:
                print(f"# done: {arm} seed {seed} ({spec.record(arm, seed) / DONE})")
        return 0
    print(f"{len(grid) - len(todo)} of {len(grid)} runs already finished; {len(todo)} to run", file=sys.stderr)
    problem, stopped = run_prepare(spec) if todo else (None, None)
    if problem is not None:
        print(f"ablate: error: {problem}", file=sys.stderr)
        return 1
    if stopped is not None:
        print(f"stopped by signal {stopped} while preparing; run the same command to resume.", file=sys.stderr)
        return 128 + stopped
    failed, stopped = run_grid(spec, todo, args.parallel, already=len(grid) - len(todo))
    if stopped is not None:
        print(f"stopped by signal {stopped}; the running trainer checkpointed. Run the same command to resume.",
              file=sys.stderr)
        return 128 + stopped
    for path in write_report(spec):
        print(path)
    for arm, seed, why in failed:
        print(f"failed: {arm} seed {seed}: {why} ({spec.run_dir(arm, seed) / LOG})", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
