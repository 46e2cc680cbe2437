"""Per-problem outcomes of every RL-stage evaluation: `<out_dir>/held_out/step<N>.jsonl`, one row per problem.

metrics.jsonl holds an evaluation's figures only; an interval over held-out problems (`jaxrl-llm ablate-ci`)
needs each problem's outcomes. The trainer writes them as it evaluates (nothing sampled again), so they travel
with a run's record (the ablation archive keeps the final step's) and no checkpoint has to outlive a machine
for an interval to be computed. A row:

    {"uid": ..., "question": ..., "samples": {"0.0": {"reward": [r], "correct": [c]},
                                              "1.0": {"reward": [r1, ..., rk], "correct": [...]}, ...}}

one entry per temperature the evaluation sampled (0 greedy, 1, the run's rollout temperature when it is not 1),
every sample's reward and correct flag (the evaluation's `accuracy`) in sample order; first answers only (any
revise rounds count in the figures). Process 0 writes; a step's file is replaced whole, so a resumed run that
evaluates a step again rewrites it.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from jaxrl_llm.train.metrics import replace_text

FOLDER = "held_out"


def path(out_dir, step: int) -> Path:
    return Path(out_dir) / FOLDER / f"step{step}.jsonl"


def write(out_dir, step: int, items, outcomes: dict) -> Path:
    """`items`: the evaluation's (TaskItem, prompt ids) pairs; `outcomes`: temperature -> (rewards, correct),
    each [n * k] with problem i's k samples at [i * k, (i + 1) * k)."""
    n = len(items)
    per_t = {}
    for t, (rewards, correct) in outcomes.items():
        rewards, correct = np.asarray(rewards, np.float64), np.asarray(correct, bool)
        if n == 0 or rewards.shape != correct.shape or rewards.size % n:
            raise ValueError(f"held-out outcomes at T={t}: {rewards.size} rewards and {correct.size} flags for "
                             f"{n} problems")
        per_t[str(float(t))] = (rewards.reshape(n, -1), correct.reshape(n, -1))
    lines = [json.dumps({"uid": item.uid, "question": item.question,
                         "samples": {t: {"reward": r[i].tolist(), "correct": c[i].tolist()}
                                     for t, (r, c) in per_t.items()}}, ensure_ascii=False) + "\n"
             for i, (item, _) in enumerate(items)]
    target = path(out_dir, step)
    target.parent.mkdir(parents=True, exist_ok=True)
    replace_text(target, "".join(lines))
    return target


def completion_rows(file: Path) -> list[dict]:
    """The file's outcomes as completions.jsonl rows (uid, question, temperature, sample, reward, correct: the
    fields `jaxrl-llm eval` writes that a bootstrap reads), problems in file order."""
    rows = []
    for n, line in enumerate(Path(file).read_text().splitlines(), 1):
        try:
            problem = json.loads(line)
            for t, got in problem["samples"].items():
                if len(got["reward"]) != len(got["correct"]):
                    raise ValueError(f"{len(got['reward'])} rewards but {len(got['correct'])} correct flags")
                rows += [{"uid": problem["uid"], "question": problem["question"], "temperature": float(t),
                          "sample": j, "reward": float(r), "correct": bool(c)}
                         for j, (r, c) in enumerate(zip(got["reward"], got["correct"]))]
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"{file}, line {n}: not a held-out outcome row ({type(e).__name__}: {e})") from e
    return rows
