"""Summarise a finished run from its metrics.jsonl: held-out accuracy before and after, the phase
split of a step, update tokens/s, and the compilation counter per step.

    .venv/bin/python tools/report_run.py runs/toy
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from jaxrl_llm.train.metrics import read_rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dir", type=Path)
    args = ap.parse_args(argv)
    rows = read_rows(args.run_dir / "metrics.jsonl")
    evals = [r for r in rows if r["kind"] in ("eval_before_sft", "eval")]
    train = [r for r in rows if r["kind"] == "train"]
    print(f"run: {args.run_dir}")
    print("| when | step | greedy accuracy | sampled accuracy (T=1) | pass@k | never solved |")
    print("|---|---|---|---|---|---|")
    for r in evals:
        when = "before SFT" if r["kind"] == "eval_before_sft" else ("start of RL" if r["step"] == 0 else "RL")
        ks = sorted((int(k[5:]), v) for k, v in r.items() if k.startswith("pass@"))
        pk = f"pass@{ks[-1][0]} {ks[-1][1]:.3f}" if ks else ""
        print(f"| {when} | {r['step']} | {r['greedy_accuracy']:.3f} | {r['sampled_accuracy']:.3f} | {pk} | "
              f"{r['never_solved_share']:.3f} |")
    if train:
        later = train[1:] or train
        phases = {k: float(np.mean([r.get(f"time_{k}_s", 0.0) for r in later])) for k in ("sample", "reward", "revise",
                                                                                         "update")}
        total = float(np.mean([r["time_step_s"] for r in later]))
        phases["other"] = total - sum(phases.values())  # recomputed: older records counted revise in time_other_s
        print(f"\nstep time (mean over steps 2..{train[-1]['step']}): {total:.2f} s = "
              + ", ".join(f"{k} {v:.2f} s ({v / total:.0%})" for k, v in phases.items()))
        positions = [r["update_positions_per_s"] for r in later if "update_positions_per_s" in r]
        print(f"update: {np.mean([r['update_tokens_per_s'] for r in later]):.0f} loss tokens/s"
              + (f", {np.mean(positions):.0f} positions/s (forward + backward)" if positions else "")
              + f"; sampling new tokens/s: {np.mean([r['sample_tokens_per_s'] for r in later]):.0f}")
        counts = [r["compilations"] for r in train]
        flat = all(c == counts[1] for c in counts[1:])
        print(f"compilations after step 1, 2, last: {counts[0]}, {counts[min(1, len(counts) - 1)]}, {counts[-1]} "
              f"({'flat after step 2' if flat else 'NOT flat'})")
        print(f"skipped non-finite updates: {sum(r['skipped_nonfinite'] for r in train)}; reward errors: "
              f"{train[-1]['reward_errors']}, timeouts: {train[-1]['reward_timeouts']}; dropped prompts: "
              f"{train[-1]['dropped_prompts']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
