"""Per-step success of a policy along its responses on a step-by-step task (data.worked: steps): how
often each line of the left-to-right solution is right, and where failed responses first go wrong.
RRL (issue #9) needs a task whose failures come late: a right prefix, then an error.

    .venv/bin/python tools/step_success.py --config configs/toy_steps.yaml --out OUT.json \
        [--samples 8] [a.b=value ...]

Loads the run in train.out_dir (its latest RL or SFT checkpoint), samples every training problem
(or eval.split=heldout's) `--samples` times at T = 1, scores the answers with the task's scorer, and
prints and writes jaxrl_llm.data.worked.step_profile of the responses.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import jax
import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main(argv=None) -> int:
    from jaxrl_llm.config import load_config
    from jaxrl_llm.data.worked import step_profile
    from jaxrl_llm.rewards.pool import RewardPool
    from jaxrl_llm.rewards.scoring import solved
    from jaxrl_llm.train.loop import Run
    from jaxrl_llm.train.evaluate import sample_scored

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--split", choices=("train", "heldout"), default="train")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args(argv)
    cfg = load_config(args.config, list(args.overrides) + ["train.tensorboard=false"])
    if cfg.data.worked != "steps":
        sys.exit(f"{args.config}: data.worked is {cfg.data.worked!r}; step_success needs data.worked: steps")
    run = Run(cfg, log=lambda m: print(m, file=sys.stderr), read_only=True)  # reads the run, never writes it
    if not run.try_resume():
        sys.exit(f"no checkpoint in {cfg.train.out_dir}: train or SFT it first")
    items = run.train_items if args.split == "train" else run.eval_items
    rows = np.repeat(np.arange(len(items)), args.samples)
    with RewardPool(cfg.reward.workers, cfg.reward.timeout_s) as pool:
        rewards, _, texts = sample_scored(run.sampler, run.sampling_params(), pool, run.tok, cfg, items, rows, 1.0,
                                          jax.random.key(cfg.train.seed), run.judge)
    run.ckpt.close()
    exprs = [json.loads(items[j][0].entry_json)["metadata"]["expression"] for j in rows]
    profile = {"split": args.split, "problems": len(items), "samples": args.samples, "step": run.state.step,
               **step_profile(texts, exprs, list(solved(rewards)))}
    text = json.dumps(profile, indent=2)
    print(text)
    with open(args.out, "w") as f:
        f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
