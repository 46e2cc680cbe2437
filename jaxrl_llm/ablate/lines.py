"""Per-line success of step-by-step answers (`data.worked: steps`) and its difference between arms: the outcome
of RRL's positive control (issue 25) that held-out accuracy cannot show, namely whether the lines after a right
prefix get better, and whether prompts no sample of the starting policy solved become solvable.

Read from `jaxrl-llm eval` completions (one JSON line per sample: uid, completion, correct, temperature), so a
checkpoint is needed once, and the counts (`LineCounts.to_json`) keep the figures after it is gone:

- reach[p, k]: samples of problem p whose first k lines are all right (k = 0: every sample), as
  jaxrl_llm.data.worked.first_error reads a line;
- late line success: of the samples whose first h = n // 2 lines are right (n: the problem's lines), the share
  whose remaining lines are right too: P(lines h+1..n right | lines 1..h right), pooled over samples. A line is
  right when it is the reference's line (first_error); a sample can have every line right and still be scored
  wrong (text after the last line), so `late_lines_scored` counts in its numerator only samples that are both;
- pass@k on the problems the starting policy never solved (0 of its samples right): the unbiased estimator per
  problem, averaged over those problems.

`compare` resamples seeds within each arm and problems once for both arms (the hierarchical, paired bootstrap
of jaxrl_llm/ablate/intervals.py); a pooled share is resampled as a ratio of the resampled sums.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass

import numpy as np

from jaxrl_llm.ablate.intervals import LEVEL, draw_counts, welch_p
from jaxrl_llm.ablate.records import aggregate
from jaxrl_llm.data.worked import first_error, steps
from jaxrl_llm.train.metrics import pass_at_k


@dataclass(frozen=True)
class LineCounts:
    """One policy's samples on a problem set, counted per problem (problems in `uids` order)."""

    uids: tuple[str, ...]
    lines: np.ndarray  # [P] the worked solution's number of lines
    solved: np.ndarray  # [P] samples scored correct
    reach: np.ndarray  # [P, L + 1] samples whose first k lines are right (column 0: all samples)
    whole: np.ndarray  # [P] samples with every line right AND scored correct (text after the last line can fail)
    source: dict = dataclasses.field(default_factory=dict, compare=False)  # what was sampled: run, step, weights

    @property
    def samples(self) -> np.ndarray:
        return self.reach[:, 0]

    def late(self, scored: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """Per problem: (samples with every line right, samples with the first n // 2 lines right); `scored`:
        the first counts only samples the scorer also calls correct."""
        idx = np.arange(len(self.uids))
        num = self.whole if scored else self.reach[idx, self.lines]
        return num.astype(float), self.reach[idx, self.lines // 2].astype(float)

    def cond(self, k: int) -> float:
        """Pooled P(line k right | lines 1..k-1 right) over the problems that have a line k."""
        has = self.lines >= k
        den = self.reach[has, k - 1].sum()
        return float(self.reach[has, k].sum() / den) if den else float("nan")

    def to_json(self) -> str:
        return json.dumps({"source": self.source, "uids": list(self.uids), "lines": self.lines.tolist(),
                           "solved": self.solved.tolist(), "reach": self.reach.tolist(), "whole": self.whole.tolist()})

    @classmethod
    def from_json(cls, text: str, where: str = "counts") -> "LineCounts":
        try:
            d = json.loads(text)
            c = cls(tuple(d["uids"]), np.asarray(d["lines"], int), np.asarray(d["solved"], int),
                    np.asarray(d["reach"], int), np.asarray(d["whole"], int), dict(d["source"]))
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{where}: not line counts ({type(e).__name__}: {e})") from None
        p = len(c.uids)
        if (c.lines.shape != (p,) or c.solved.shape != (p,) or c.whole.shape != (p,) or c.reach.ndim != 2
                or c.reach.shape[0] != p):
            raise ValueError(f"{where}: shapes disagree (uids {p}, lines {c.lines.shape}, solved {c.solved.shape}, "
                             f"whole {c.whole.shape}, reach {c.reach.shape})")
        return c

    def reordered(self, uids: tuple[str, ...]) -> "LineCounts":
        o = np.array([self.uids.index(u) for u in uids], int)
        return LineCounts(uids, self.lines[o], self.solved[o], self.reach[o], self.whole[o], self.source)


def count_lines(completions: list[dict], expressions: dict[str, str], temperature: float = 1.0,
                where: str = "completions", source: dict | None = None) -> LineCounts:
    """Count the samples at `temperature` of `completions` (jaxrl-llm eval's completions.jsonl rows) per problem;
    `expressions`: each uid's arithmetic expression. A row whose uid has no expression is an error (the
    completions are of another task or problem set)."""
    rows = [r for r in completions if float(r["temperature"]) == temperature]
    if not rows:
        raise ValueError(f"{where}: no samples at temperature {temperature}")
    uids = tuple(dict.fromkeys(r["uid"] for r in rows))
    missing = [u for u in uids if u not in expressions]
    if missing:
        raise ValueError(f"{where}: {len(missing)} problems have no expression (e.g. uid {missing[0]!r}): "
                         f"not this config's training problems")
    where_p = {u: i for i, u in enumerate(uids)}
    lines = np.array([len(steps(expressions[u])) for u in uids])
    solved, whole = np.zeros(len(uids), int), np.zeros(len(uids), int)
    reach = np.zeros((len(uids), int(lines.max()) + 1), int)
    for r in rows:
        p = where_p[r["uid"]]
        right = first_error(r["completion"], expressions[r["uid"]])
        solved[p] += bool(r["correct"])
        whole[p] += bool(r["correct"]) and right == lines[p]
        reach[p, :right + 1] += 1
    return LineCounts(uids, lines, solved, reach, whole, dict(source or {}))


def unsolved(start: LineCounts) -> np.ndarray:
    """Indices of the problems none of the starting policy's samples solved."""
    return np.flatnonzero(start.solved == 0)


def pass_k_values(c: LineCounts, problems: np.ndarray, k: int) -> np.ndarray:
    """[len(problems)] unbiased pass@k of each problem from its samples."""
    return np.array([pass_at_k(int(c.samples[p]), int(c.solved[p]), k) for p in problems])


def aligned(runs: list[LineCounts], uids: tuple[str, ...], where: str) -> list[LineCounts]:
    """The runs' counts in the order `uids` (every run must have sampled exactly those problems)."""
    out = []
    for i, c in enumerate(runs):
        if set(c.uids) != set(uids):
            raise ValueError(f"{where}: run {i} sampled another problem set ({len(c.uids)} problems, "
                             f"{len(set(c.uids) ^ set(uids))} differ from the start's)")
        out.append(c.reordered(uids))
    return out


def figures(c: LineCounts, base_unsolved: np.ndarray, ks=(1, 2, 4, 8)) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Each figure as per-problem (numerator, denominator) arrays: the figure is sum(num) / sum(den)."""
    out = {"accuracy": (c.solved.astype(float), c.samples.astype(float)), "late_lines": c.late(),
           "late_lines_scored": c.late(scored=True)}
    ones, fewest = np.ones(len(base_unsolved)), int(c.samples.min()) if len(c.uids) else 0
    for k in ks:
        if k <= fewest:
            out[f"pass@{k} unsolved at start"] = (pass_k_values(c, base_unsolved, k), ones)
    return out


def value(num: np.ndarray, den: np.ndarray) -> float:
    return float(num.sum() / den.sum()) if den.sum() else float("nan")


def resample_ratio_differences(arm_num_SxPxF, arm_den_SxPxF, base_num_SxPxF, base_den_SxPxF, resamples: int,
                               rng) -> np.ndarray:
    """[resamples, F] bootstrap distribution of arm - baseline where each run's figure is sum(num) / sum(den)
    over problems and an arm's figure the mean of its runs': problems drawn once per resample for both arms,
    seeds drawn within each arm (the draws in the order of intervals.resample_differences, so with den = 1 it
    gives the same numbers)."""
    p = arm_num_SxPxF.shape[1]
    if base_num_SxPxF.shape[1:] != arm_num_SxPxF.shape[1:]:
        raise ValueError(f"arm {arm_num_SxPxF.shape} and baseline {base_num_SxPxF.shape}: not the same problems "
                         f"and figures")
    weights_BxP = draw_counts(p, resamples, rng) / p

    def arm_means(num_SxPxF, den_SxPxF):
        s, _, f = num_SxPxF.shape
        seeds_BxS = draw_counts(s, resamples, rng) / s
        per = [(weights_BxP @ v.transpose(1, 0, 2).reshape(p, s * f)).reshape(resamples, s, f)
               for v in (num_SxPxF, den_SxPxF)]
        with np.errstate(invalid="ignore", divide="ignore"):
            ratio = per[0] / per[1]
        drawn = (seeds_BxS > 0)[:, :, None]
        # a seed not drawn counts for nothing (0 x NaN would be NaN); a drawn seed whose resampled denominator is 0
        # has no figure, and neither has the resample (NaN: compare() counts and leaves it out)
        value = np.einsum("bs,bsf->bf", seeds_BxS, np.where(drawn, np.nan_to_num(ratio), 0.0))
        return np.where((drawn & np.isnan(ratio)).any(axis=1), np.nan, value)

    return arm_means(arm_num_SxPxF, arm_den_SxPxF) - arm_means(base_num_SxPxF, base_den_SxPxF)


def compare(arm: list[dict], base: list[dict], resamples: int = 10000, seed: int = 0) -> list[dict]:
    """One line per figure of arm (its runs' `figures`) against base: each side's mean ± std over runs, the
    difference, its 95 % interval and Welch's p over the runs' figures. Figures cover different problems (all of
    them, or those unsolved at start), so each is resampled on its own."""
    names = [f for f in base[0] if all(f in r for r in arm + base)]
    lines = []
    for f in names:
        stack = [[np.stack([r[f][i] for r in runs])[:, :, None] for i in (0, 1)] for runs in (arm, base)]
        diffs = resample_ratio_differences(stack[0][0], stack[0][1], stack[1][0], stack[1][1], resamples,
                                           np.random.default_rng(seed))[:, 0]
        kept = diffs[~np.isnan(diffs)]
        lo, hi = np.percentile(kept, [50 * (1 - LEVEL), 50 * (1 + LEVEL)]) if len(kept) else (math.nan, math.nan)
        per_run = [np.array([value(*r[f]) for r in runs]) for runs in (arm, base)]
        lines.append({"figure": f, "arm": aggregate(per_run[0].tolist()), "base": aggregate(per_run[1].tolist()),
                      "diff": float(per_run[0].mean() - per_run[1].mean()), "lo": float(lo), "hi": float(hi),
                      "welch_p": welch_p(*per_run), "dropped": int(len(diffs) - len(kept))})
    return lines
