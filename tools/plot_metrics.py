"""Plot a run's metrics.jsonl to PNG: held-out accuracy, training reward/accuracy, entropy and
response length against the step.

    .venv/bin/python tools/plot_metrics.py runs/toy/metrics.jsonl -o runs/toy/curves.png
"""

from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from jaxrl_llm.train.metrics import read_rows  # noqa: E402


def series(rows, kind, key):
    pts = [(r["step"], r[key]) for r in rows if r.get("kind") == kind and key in r]
    return [p[0] for p in pts], [p[1] for p in pts]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("metrics", type=Path)
    ap.add_argument("-o", "--out", type=Path, default=None)
    ap.add_argument("--title", default=None)
    args = ap.parse_args(argv)
    try:
        rows = read_rows(args.metrics)
    except ValueError as e:
        raise SystemExit(str(e)) from None
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for key, label in (("greedy_accuracy", "held-out greedy"), ("sampled_accuracy", "held-out T=1"),
                       ("pass@4", "held-out pass@4")):
        xs, ys = series(rows, "eval", key)
        if xs:
            axes[0].plot(xs, ys, marker="o", label=label)
    before = series(rows, "eval_before_sft", "greedy_accuracy")
    if before[0]:
        axes[0].plot(*before, "kx", markersize=9, label="greedy, before SFT warm start")
    axes[0].set_title("held-out accuracy")
    for key, label in (("reward_mean", "reward"), ("accuracy", "accuracy")):
        axes[1].plot(*series(rows, "train", key), label=label)
    axes[1].set_title("training rollouts")
    axes[2].plot(*series(rows, "train", "entropy"), label="entropy (nats/token)")
    ax2 = axes[2].twinx()
    ax2.plot(*series(rows, "train", "response_len_mean"), color="tab:red", label="response length (tokens)")
    axes[2].set_title("entropy and response length")
    for ax in axes:
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    for ax in axes[:2]:
        ax.legend(loc="best", fontsize=8)
    handles = axes[2].get_legend_handles_labels()[0] + ax2.get_legend_handles_labels()[0]
    axes[2].legend(handles, [h.get_label() for h in handles], loc="best", fontsize=8)
    fig.suptitle(args.title or str(args.metrics.parent))
    fig.tight_layout()
    out = args.out or args.metrics.with_name("curves.png")
    fig.savefig(out, dpi=90)
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
