"""The ablation report: results.md (per arm: held-out evaluation at step 0 and at the last step, mean ± sample
std over seeds, sampled-token budget, wall time; per run; explorers), results.csv and curves.png, written to
the spec's out_dir and to its archive. An exploration method is credited only by such a table (ALGORITHMS.md
section 5)."""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path

from jaxrl_llm.ablate.records import (COLUMNS, EVAL_KS, EXPLORER_COLUMNS, OPTIONAL, RunData, Stat, archive_run,
                                      arm_table, by_step, collect, explorer_summary, run_summary)
from jaxrl_llm.ablate.spec import Spec


def _cell(key: str, stat: Stat | None, n_arm: int) -> str:
    if stat is None:
        return ""
    fmt = {"sampled_tokens": "{:,.0f}", "wall_s": "{:.1f}", "cpu_s": "{:.1f}", "rl_steps": "{:.0f}",
           "rrl_solved_first_via_replay": "{:.1f}"}.get(key, "{:.3f}")
    text = fmt.format(stat.mean)
    if stat.n > 1 and key != "rl_steps":
        text += " ± " + fmt.format(stat.std)
    return text + (f" (n={stat.n})" if stat.n != n_arm else "")


def format_markdown(spec: Spec, table: list[dict], runs: list[RunData], missing: list) -> str:
    shown = [(k, label) for k, label in COLUMNS if k not in OPTIONAL or any(k in line["stats"] for line in table)]
    # the command as the committed reports name it (tools/ablate.py is `jaxrl-llm ablate`): a regenerated one matches
    out = [f"# Ablation: {spec.path}", "",
           f"Produced by `python tools/ablate.py {spec.path}` (rerun it to resume, `--report-only` to redo this).", "",
           f"- base: `{spec.base}`",
           f"- overrides (all arms): `{' '.join(spec.overrides) or '(none)'}`",
           f"- seeds (train.seed): {', '.join(map(str, spec.seeds))}",
           f"- runs: `{spec.out_dir}/<arm>/seed<S>`",
           "- arms:", *[f"  - **{arm}**: `{' '.join(ov) or '(base + overrides only)'}`"
                        for arm, ov in spec.arms.items()],
           "", "Held-out evaluation at step 0 (the starting policy) and at the last RL step: mean ± sample std "
           "over seeds. Sampled tokens are the rollouts' (the budget); wall s = RL step time + evaluation time"
           + ("; CPU s = the trainer process's CPU seconds over the same steps and evaluations."
              if any("cpu_s" in line["stats"] for line in table) else "."),
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
        finals = [{k: Stat(v, math.nan, 1) for k, v in run_summary(r.rows, r.steps)["final"].items() if v is not None}
                  for r in runs]
        keys = ["greedy_accuracy", "sampled_accuracy", "never_solved_share", "sampled_tokens", "wall_s"]
        keys += ["cpu_s"] if any("cpu_s" in f for f in finals) else []
        out += ["", "## Per run (final evaluation)", "", "| arm | seed | greedy | sampled T=1 | never solved | "
                "sampled tokens | wall s |" + (" CPU s |" if "cpu_s" in keys else ""), "|---" * (2 + len(keys)) + "|"]
        for r, f in zip(runs, finals):
            out.append(f"| {r.arm} | {r.seed} | " + " | ".join(_cell(k, f.get(k), 1) for k in keys) + " |")
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
        md, csv, png = (spec.report_file(folder, n) for n in ("results.md", "results.csv", "curves.png"))
        md.write_text(format_markdown(spec, table, runs, missing))
        csv.write_text(format_csv(table))
        written += [md, csv]
        if runs:
            plot_curves(spec, runs, png)
            written.append(png)
    return written
