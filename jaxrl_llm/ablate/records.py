"""Finished runs' records: which runs count as finished, each run's summary (start and final evaluation, budget,
explorer figures), their aggregate over seeds per arm, and the archive that keeps records beyond a machine.

With a spec's `archive`, every finished run's record (config.yaml, metrics.jsonl, ablation_done.json, and the
final evaluation's per-problem outcomes held_out/step<N>.jsonl where the trainer wrote them: tens of kB, no
checkpoints) is copied to <archive>/runs/<arm>/seed<S>. A run whose record is there counts as finished
even where out_dir is gone, so a grid longer than one machine's life continues on a fresh checkout: commit
the archive, rerun the same command.
"""

from __future__ import annotations

import math
import shutil
from dataclasses import dataclass
from pathlib import Path

import yaml

from jaxrl_llm.ablate.spec import DONE, LOG, Spec
from jaxrl_llm.train import outcomes
from jaxrl_llm.train.metrics import PASS_KS as EVAL_KS

RECORD = ("config.yaml", "metrics.jsonl", DONE)  # what the archive keeps of a finished run (no checkpoints)
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
BUDGET_COLUMNS = REPLAY_COLUMNS + (("sampled_tokens", "sampled tokens"), ("wall_s", "wall s"), ("cpu_s", "CPU s"),
                                   ("rl_steps", "RL steps"))
# a run's cost as ablate-ci's budget sentence gives it
BUDGET_KEYS = ("sampled_tokens", "wall_s", "cpu_s")
# shown when some arm has them
OPTIONAL = ({"cpu_s"} | {k for k, _ in REPLAY_COLUMNS} | {f"pass@{k}" for k in EVAL_KS} | set(REWARD_COLUMNS)
            | ROLLOUT_T_COLUMNS)
COLUMNS = EVAL_COLUMNS + BUDGET_COLUMNS
# what an explorer did over a whole run, from its train rows: (metric, label, weight): a step's count summed
# (weight None), or a per-step rate averaged with each step weighted by its count of `weight` (NaN steps skipped)
EXPLORER_COLUMNS = (("rrl_replay_rows", "replay rows", None),
                    ("rrl_continuation_success", "continuation success", "rrl_replay_rows"),
                    ("rrl_fresh_success_same_prompts", "fresh success, same prompts", "rrl_replay_rows"),
                    ("herl_revisions", "revisions", None),
                    ("herl_revision_success", "revision success", "herl_revisions"),
                    # revisions that replaced a group member (under keep: better, only those above the group's best)
                    ("herl_kept", "kept revisions", None),
                    ("herl_bonus_mean", "mean bonus", "herl_candidates"),
                    ("herl_sampled_tokens", "revision tokens", None))


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


def is_timing(key: str) -> bool:
    """Whether a metrics.jsonl key measures the machine rather than the policy (wall or CPU seconds, a rate per
    second): two runs of the same training differ in these alone."""
    return "time" in key or key.startswith("cpu_") or key.endswith("_per_s")


def run_summary(rows: list[dict], steps: int) -> dict | None:
    """A run's step-0 and final evaluation metrics and its budget; None without an eval row at `steps`.
    Tokens are the rollouts' (train rows' `sampled_tokens`); None when any train row lacks them.
    Wall time is the RL steps' time plus the evaluations' (SFT and start-up are not counted); CPU time (cpu_s) the
    trainer process's CPU seconds over the same steps and evaluations (absent from records made before it was
    logged)."""
    evals, train = by_step(rows, "eval"), by_step(rows, "train")
    if steps not in evals:
        return None
    tokens = [r.get("sampled_tokens") for r in train.values()]
    step_times = [r.get("time_step_s") for r in train.values()]
    cpu_times = [r.get("cpu_step_s") for r in train.values()] + [r.get("cpu_eval_s") for r in evals.values()]
    budget = {"sampled_tokens": None if None in tokens else float(sum(tokens)),
              "wall_s": None if None in step_times else
              float(sum(step_times) + sum(r.get("time_eval_s", 0.0) for r in evals.values())),
              "rl_steps": float(len(train))}
    if cpu_times and None not in cpu_times:
        budget["cpu_s"] = float(sum(cpu_times))
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


def archive_run(spec: Spec, arm: str, seed: int) -> None:
    """Copy a finished run's record into the archive (no-op without one, or when the run is not finished). A record
    another command trained is refused (SpecError) before anything is copied: the archived one stays."""
    src, dst = spec.run_dir(arm, seed), spec.archived(arm, seed)
    if dst is None or not (src / DONE).is_file():
        return
    spec.check_record(src, arm, seed)
    final = outcomes.path(".", run_steps(src))  # relative: the final evaluation's per-problem outcomes
    names = ([str(final)] if (src / final).is_file() else []) + list(RECORD)
    for name in names:
        (dst / name).parent.mkdir(parents=True, exist_ok=True)
        tmp = (dst / name).with_name(f".{Path(name).name}.tmp")
        shutil.copyfile(src / name, tmp)
        tmp.replace(dst / name)  # the marker last: a half-copied record never counts as finished

