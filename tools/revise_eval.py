"""Test-time self-revision (issue 30): `jaxrl-llm eval` of a run's latest checkpoint with eval.revise_rounds,
written as the eval's JSON and a table of the figures round by round (round 0: the first answers).

    .venv/bin/python tools/revise_eval.py --config RUN/config.yaml --rounds 2 --out tools/results/NAME
    .venv/bin/python tools/revise_eval.py --base --config configs/rubric_smollm2.yaml --rounds 2 \\
        --out tools/results/revise_eval_smollm2_base eval.size=16 train.out_dir=/tmp/empty

write OUT.json and OUT.md. `jaxrl-llm eval` evaluates the initial weights when train.out_dir holds no
checkpoint, so a run without one is refused unless --base says the base model is what is meant (and then a
folder with checkpoints is refused). The eval only reads the run folder.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# (column, first-answer figure, round figure), per pass: the greedy answers and the T = 1 samples
PASSES = (("greedy", "greedy_", "revise_"), ("sampled T=1", "sampled_", "revise_sampled_"))


def table(result: dict, rounds: int) -> str:
    lines = ["| pass | round | accuracy | reward mean | sent back | improved | worse | tokens |",
             "|---|---|---|---|---|---|---|---|"]
    for name, first, rev in PASSES:
        lines.append(f"| {name} | 0 | {result[first + 'accuracy']:.3f} | {result[first + 'reward_mean']:.3f} "
                     f"| | | | |")
        for r in range(1, rounds + 1):
            f = {k: result[f"{rev}r{r}_{k}"] for k in ("accuracy", "reward_mean", "sent", "improved", "worse",
                                                      "tokens")}
            lines.append(f"| {name} | {r} | {f['accuracy']:.3f} | {f['reward_mean']:.3f} | {f['sent']:.3f} "
                         f"| {f['improved']:.3f} | {f['worse']:.3f} | {f['tokens']} |")
        lines.append(f"| {name} | best | {result[rev + 'best_accuracy']:.3f} | {result[rev + 'best_reward_mean']:.3f} "
                     f"| | | | |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", required=True)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--base", action="store_true", help="evaluate the initial weights (train.out_dir has no checkpoint)")
    ap.add_argument("--out", required=True, help="path without suffix: OUT.json and OUT.md are written")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args(argv)
    if args.rounds < 1:
        sys.exit(f"--rounds {args.rounds}: at least 1 round (round 0 is the plain evaluation)")
    from jaxrl_llm.config import load_config

    out_dir = Path(load_config(args.config, args.overrides).train.out_dir)
    saved = [p for name in ("checkpoints", "sft_checkpoints") for p in (out_dir / name).glob("*") if p.name.isdigit()]
    if args.base and saved:
        sys.exit(f"--base evaluates the initial weights, but {out_dir} holds checkpoints ({saved[0]})")
    if not args.base and not saved:
        sys.exit(f"no checkpoint in {out_dir}: `jaxrl-llm eval` would score the initial weights (say --base for that)")
    cmd = [str(ROOT / ".venv/bin/jaxrl-llm"), "eval", "--config", args.config, f"eval.revise_rounds={args.rounds}",
           *args.overrides]
    done = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=True)
    result = json.loads(done.stdout)
    if "revise_r1_accuracy" not in result:
        sys.exit(f"{args.config}: no revise figures (no rubric-graded held-out task?)")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    Path(f"{out}.json").write_text(json.dumps(result, indent=2) + "\n")
    text = (f"`{' '.join(['jaxrl-llm', *cmd[1:]])}`: step {result['step']}, {result['problems']} problems, "
            f"{result['time_eval_s']:.0f} s\n\n{table(result, args.rounds)}\n")
    Path(f"{out}.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
