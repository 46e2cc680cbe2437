"""`jaxrl-llm ablate-ci --seeds-only`: each method arm's difference from its baseline on every held-out figure
of the runs' own final evaluation rows, with a 95 % Welch t interval over seeds.

For grids whose per-problem outcomes are gone (recorded before the trainer wrote held_out/step<N>.jsonl, their
checkpoints deleted with the machine), the paired bootstrap of intervals.py cannot run; the seeds' figures
can still be compared. Each figure of an arm is its runs' final evaluation values, one per seed; the interval
is Welch's (unequal variances, Welch-Satterthwaite degrees of freedom) for the difference of the two arms'
means, from scipy.stats.ttest_ind(equal_var=False). It treats the problem set as fixed and, with 3 seeds a
side, is wide: it says how far the seeds alone support a difference, not what a new problem set would give.
Mean rewards are included where rewards are graded (a rubric task's outcome is the share of items met).
Written to the spec's archive (else out_dir) as intervals_seeds.md (<reports>.intervals_seeds.md where the spec names
its reports) and printed.
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import numpy as np

from jaxrl_llm.ablate.intervals import (LEVEL, _signed, _stat, budget_sentence, figure_label, read_finished,
                                        unequal_steps)
from jaxrl_llm.ablate.records import (BUDGET_KEYS, EVAL_COLUMNS, REWARD_COLUMNS, aggregate, by_step, load_rows,
                                      run_steps, run_summary)
from jaxrl_llm.ablate.spec import Spec, SpecError

REWARD_NAMES = {"greedy_reward_mean": "greedy reward", "sampled_reward_mean": "sampled reward T=1",
                "rollout_t_sampled_reward_mean": "sampled reward T=run"}


def final_row(spec: Spec, arm: str, seed: int, record: Path) -> dict:
    """The run's evaluation row at its final step, with its budget (sampled tokens, wall s, CPU s)."""
    steps = run_steps(record)
    rows = load_rows(record / "metrics.jsonl")
    final = by_step(rows, "eval").get(steps)
    if final is None:
        raise SpecError(f"{arm} seed {seed}: {record / 'metrics.jsonl'} has no eval row at its final step {steps}")
    summary = run_summary(rows, steps)["final"]
    return {**final, "_budget": {k: summary.get(k) for k in BUDGET_KEYS}, "_steps": steps}


def welch_interval(a, b, level: float = LEVEL) -> dict:
    """mean(a) - mean(b), Welch's `level` interval and two-sided p, and the degrees of freedom; the interval
    and p are nan with fewer than 2 values a side or no spread on either side."""
    from scipy.stats import ttest_ind

    a, b = np.asarray(a, float), np.asarray(b, float)
    out = {"diff": float(a.mean() - b.mean()), "lo": math.nan, "hi": math.nan, "p": math.nan, "df": math.nan}
    if min(len(a), len(b)) < 2 or np.var(a, ddof=1) + np.var(b, ddof=1) == 0:
        return out
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # one side with no spread: scipy warns, the result holds
        res = ttest_ind(a, b, equal_var=False)
        ci = res.confidence_interval(confidence_level=level)
    return {**out, "lo": float(ci.low), "hi": float(ci.high), "p": float(res.pvalue), "df": float(res.df)}


def figures_of(runs: list[dict]) -> list[str]:
    """Figures every run has, in the report's order; T=run ones only where some run's rollout T is not 1."""
    keys = [k for k, _ in EVAL_COLUMNS if all(isinstance(r.get(k), (int, float)) for r in runs)]
    # a mean reward only where rewards are graded (some run's differs from its accuracy): else it repeats a row
    keys = [k for k in keys if k not in REWARD_COLUMNS or any(r[k] != r.get(REWARD_COLUMNS[k]) for r in runs)]
    if all(r.get("rollout_t", 1.0) == 1.0 for r in runs):
        keys = [k for k in keys if not k.startswith("rollout_t_")]
    return keys


def compare(arm: list[dict], base: list[dict]) -> list[dict]:
    lines = []
    for f in figures_of(arm + base):
        a, b = [r[f] for r in arm], [r[f] for r in base]
        lines.append({"figure": f, "arm": aggregate(a), "base": aggregate(b), **welch_interval(a, b)})
    return lines


def _table(a: str, b: str, lines: list[dict]) -> list[str]:
    out = [f"| figure | {a} | {b} | difference | {LEVEL:.0%} Welch interval | excludes 0 | Welch p | df |",
           "|---|---|---|---|---|---|---|---|"]
    for ln in lines:
        label = REWARD_NAMES.get(ln["figure"]) or figure_label(ln["figure"])
        if math.isnan(ln["lo"]):
            interval = excludes = p = df = "n/a"
        else:
            interval = f"[{_signed(ln['lo'])}, {_signed(ln['hi'])}]"
            excludes = "yes" if ln["lo"] > 0 or ln["hi"] < 0 else "no"
            p, df = f"{ln['p']:.4f}", f"{ln['df']:.1f}"
        out.append(f"| {label} | {_stat(ln['arm'])} | {_stat(ln['base'])} | {_signed(ln['diff'])} | {interval} "
                   f"| {excludes} | {p} | {df} |")
    return out


def run(spec: Spec, pairs, command_line: str) -> tuple[str, Path]:
    """Every pair's table from the records' final evaluation rows; written as intervals_seeds.md."""
    rows, missing = read_finished(spec, pairs, lambda arm, s, record: {**final_row(spec, arm, s, record), "_seed": s})
    out = [f"# Differences from the baseline over seeds: {spec.path}", "",
           f"Produced by `{command_line}`.", "",
           "Each figure is the runs' own final evaluation row (metrics.jsonl), one value per seed; arm columns: "
           f"mean ± sample std over seeds. Interval: Welch's {LEVEL:.0%} t interval for the difference of the means "
           "(unequal variances, Welch-Satterthwaite df; scipy.stats.ttest_ind(equal_var=False)), with its two-sided "
           "p. Mean rewards are shown where rewards are graded (some run's differs from its accuracy). The held-out "
           "problems are held fixed: this is the seeds' evidence alone, for records without per-problem outcomes "
           "(where they exist, `jaxrl-llm ablate-ci` without --seeds-only adds the problems' uncertainty by a paired "
           "bootstrap). n/a: fewer than 2 seeds a side, or no spread on either side."]
    done = 0
    for a, b in pairs:
        if not rows[a] or not rows[b]:
            missing.append((a if not rows[a] else b, "all", f"no finished run: {a} vs {b} left out"))
            continue
        unequal = unequal_steps(a, b, [r["_steps"] for r in rows[a]], [r["_steps"] for r in rows[b]])
        if unequal:
            missing.append(unequal)
            continue
        done += 1
        temps = sorted({r.get("rollout_t", 1.0) for r in rows[a] + rows[b]})
        out += ["", f"## {a} vs {b}", "",
                f"Seeds {', '.join(str(r['_seed']) for r in rows[a])} vs {', '.join(str(r['_seed']) for r in rows[b])}"
                f"; rollout T {', '.join(f'{t:g}' for t in temps)}. "
                + budget_sentence([r["_budget"] for r in rows[a]], [r["_budget"] for r in rows[b]]), "",
                *_table(a, b, compare(rows[a], rows[b]))]
    if not done:
        raise SpecError(f"{spec.path}: no pair with finished runs on both sides")
    if missing:
        out += ["", f"## Not in the tables: {len(missing)} runs", ""]
        out += [f"- {a} seed {s}: {why}" for a, s, why in missing]
    text = "\n".join(out) + "\n"
    return text, spec.write_table("intervals_seeds.md", text)
