"""Scoring rows of texts: the built-in scorers and the reward functions in the pool, the judge's verdicts, and in
a multi-host run each process's share of the rows.

A row's reward is the task's built-in scorer's (reward.builtin) plus, for each reward.functions entry
(rewards/functions.py), its weight times the sum of its components. What counts as solved (accuracy, pass@k,
the evaluation's figures) is the built-in scorer's full marks, or with reward.correctness = a component's name,
that component (unweighted) >= 1; a row where it is missing (its function failed) is unsolved. `success` is what
the explorers average: the value `correct` is full marks of, clipped to [0, 1]; without reward functions that is
the reward itself.

Each process of a multi-host run checks only its share of the rows (parallel/hosts.py `share`) in its own pool,
and every process gets every row's Score: the rewards and the items met as arrays, a reward function's
components as JSON text, each gathered in one collective.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Callable, Sequence

import numpy as np

from jaxrl_llm.config import Config
from jaxrl_llm.parallel import hosts
from jaxrl_llm.rewards.functions import BUILTIN, call
from jaxrl_llm.rewards.judge import Judge, aligned, judge_items
from jaxrl_llm.rewards.pool import RewardPool
from jaxrl_llm.rewards.rubrics import rubric_items, weighted_score
from jaxrl_llm.rewards.types import FAILED, Score, ScoredTask

_PLAIN, _GRADED, _FAILED = 0, 1, 2  # a gathered Score's kind


def solved(rewards: np.ndarray) -> np.ndarray:
    """Rows whose reward is full marks: what accuracy, pass@k and strict rewards count."""
    return rewards >= 1.0 - 1e-6


@dataclasses.dataclass(frozen=True)
class Scores:
    """One scoring of N rows: the rewards, the rubric items met, which rows are solved, and with reward
    functions each component's unweighted value [N] (0 where its function failed; `builtin`: the built-in
    scorer's reward) and how many function calls failed (`fn_errors`; `fn_last_error` the last one's text)."""

    rewards: np.ndarray
    met: np.ndarray | None
    correct: np.ndarray
    components: dict = dataclasses.field(default_factory=dict)
    fn_errors: int = 0
    fn_last_error: str = ""

    @staticmethod
    def concat(parts: Sequence["Scores"]) -> "Scores":
        """Scores of consecutive calls as one (a component a call did not see is 0 on its rows; `met` left out)."""
        names = list(dict.fromkeys(k for p in parts for k in p.components))
        return Scores(np.concatenate([p.rewards for p in parts]), None, np.concatenate([p.correct for p in parts]),
                      {k: np.concatenate([p.components.get(k, np.zeros(len(p.rewards), np.float32)) for p in parts])
                       for k in names}, sum(p.fn_errors for p in parts),
                      next((p.fn_last_error for p in reversed(parts) if p.fn_last_error), ""))

    def metrics(self, prefix: str = "", rows=slice(None)) -> dict:
        """Each component's mean over `rows` as `{prefix}reward/<name>`, and the failed calls (all rows);
        nothing without reward functions."""
        if not self.components:
            return {}
        out = {f"{prefix}reward/{k}": float(v[rows].mean()) for k, v in self.components.items()}
        out[f"{prefix}reward_fn_errors"] = self.fn_errors
        if self.fn_last_error:
            out[f"{prefix}reward_fn_last_error"] = self.fn_last_error
        return out


def score_parts(pool: RewardPool, cfg: Config, items: Sequence[ScoredTask], texts: Sequence[str],
                row_item: np.ndarray, judge: Judge | None = None) -> Scores:
    """The Scores of texts[i] as an answer to items[row_item[i]]: the built-in scorer's reward (reward.builtin)
    plus each reward function's weighted components (the pool's `functions`)."""
    if len(pool.functions) != len(cfg.reward.functions):
        raise ValueError(f"the reward pool runs {len(pool.functions)} reward functions, reward.functions lists "
                         f"{len(cfg.reward.functions)}: start it with functions=cfg.reward.functions")
    n = len(row_item)
    builtin, met = _builtin_rows(pool, cfg, items, texts, row_item, judge) if cfg.reward.builtin else \
        (np.zeros(n, np.float32), None)
    if not pool.functions:
        return Scores(builtin, met, solved(builtin))
    suffix = f"\n{cfg.data.instruction}" if cfg.data.instruction else ""
    rows = [(items[j].question + suffix, texts[i], items[j].question, items[j].answer, items[j].extra)
            for i, j in enumerate(row_item)]
    jobs = [(f, *row) for f in range(len(pool.functions)) for row in rows]
    results = _gather_components(pool, jobs, lambda i: pool.functions[i // max(n, 1)].label)
    total = builtin.astype(np.float64)
    parts = {BUILTIN: builtin} if cfg.reward.builtin else {}
    owner, errors = {}, 0
    for k, fn in enumerate(pool.functions):
        for i in range(n):
            result = results[k * n + i]
            if result.failed:  # the pool counted it and kept its text
                errors += 1
                continue
            for name, value in result.components.items():
                if owner.setdefault(name, k) != k:
                    raise ValueError(f"{fn.label} and {pool.functions[owner[name]].label} both return a component "
                                     f"named {name!r}; rename one")
                parts.setdefault(name, np.zeros(n, np.float32))[i] = value
                total[i] += fn.weight * value
    name = cfg.reward.correctness
    correct = solved(builtin) if not name else solved(parts[name]) if name in parts else np.zeros(n, bool)
    return Scores(total.astype(np.float32), met, correct, parts, errors, pool.stats.last_error if errors else "")


def score_rows(pool: RewardPool, cfg: Config, items: Sequence[ScoredTask], texts: Sequence[str],
               row_item: np.ndarray, judge: Judge | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """(rewards [N], met [N, K] | None) of texts[i] as an answer to items[row_item[i]] (score_parts)."""
    s = score_parts(pool, cfg, items, texts, row_item, judge)
    return s.rewards, s.met


def score_texts(pool: RewardPool, cfg: Config, items: Sequence[ScoredTask], texts: Sequence[str],
                row_item: np.ndarray, judge: Judge | None = None) -> np.ndarray:
    """Rewards [N] of texts[i] as an answer to items[row_item[i]] (score_rows without the items met)."""
    return score_rows(pool, cfg, items, texts, row_item, judge)[0]


def success(cfg: Config, s: Scores, functions: bool) -> np.ndarray:
    """[N] float32 in [0, 1] whose full marks are `s.correct`: the reward itself without reward functions (the
    built-in scorer's, partial credit included); with them the built-in scorer's reward, or the
    reward.correctness component, clipped (the total's scale is the user's: bonuses, penalties)."""
    if not functions:
        return s.rewards
    source = s.components.get(cfg.reward.correctness or BUILTIN)
    return np.zeros(len(s.rewards), np.float32) if source is None else np.clip(source, 0.0, 1.0).astype(np.float32)


def _builtin_rows(pool: RewardPool, cfg: Config, items: Sequence[ScoredTask], texts: Sequence[str],
                 row_item: np.ndarray, judge: Judge | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """The built-in scorers' (rewards [N], met [N, K] | None): answer scorers give 0/1 (their partial credit with
    reward.partial_credit); rubric tasks give sum w m / sum w and the items met (K: the most items any row's
    rubric has; False past a rubric's end and where scoring failed). The pool checks the programmatic items;
    `judge` decides the 'judge' items (unmet without one)."""
    jobs = [(items[j].scorer, items[j].answer, items[j].entry_json, texts[i], cfg.data.answer_format)
            for i, j in enumerate(row_item)]
    results = _map_over_hosts(pool, jobs)
    if judge is not None:
        results = _with_verdicts(judge, items, texts, row_item, results)
    rewards = np.array([r.reward for r in results], np.float32)
    rubric = np.array([items[j].scorer == "rubric" for j in row_item], bool)
    if not cfg.reward.partial_credit:  # rubric rewards are fractions by definition
        rewards = np.where(rubric, rewards, solved(rewards).astype(np.float32))
    if not rubric.any():
        return rewards, None
    k = max((len(r.met) for r in results if r.met is not None), default=1)
    met = np.zeros((len(results), k), bool)
    for i, r in enumerate(results):
        if r.met is not None:
            met[i, :len(r.met)] = np.asarray(r.met, bool)
    return rewards, met


def _map_over_hosts(pool: RewardPool, jobs: list) -> list[Score]:
    """pool.map(jobs), each process of a multi-host run checking only its share of the rows in its own pool
    and every process getting every row's Score (reward, and the items met where a scorer returns them)."""
    if hosts.count() == 1:
        return pool.map(jobs)
    n, mine = len(jobs), hosts.share(len(jobs))
    local = pool.map(jobs[mine])
    k = hosts.max_int(max((len(r.met) for r in local if r.met is not None), default=0))
    reward = np.array([r.reward for r in local], np.float64)
    kind = np.array([_FAILED if r.failed else _GRADED if r.met is not None else _PLAIN for r in local], np.int8)
    met = np.full((len(local), k + 1), -1, np.int8)  # -1 past an item list's end
    for i, r in enumerate(local):
        if r.met is not None:
            met[i, :len(r.met)] = r.met
    reward, kind, met = (hosts.gather_rows(x, n) for x in (reward, kind, met))
    return [Score(float(reward[i]), tuple(int(m) for m in met[i] if m >= 0) if kind[i] == _GRADED else None,
                  failed=bool(kind[i] == _FAILED)) for i in range(n)]


def _gather_components(pool: RewardPool, jobs: list, label: Callable[[int], str]) -> list[Score]:
    """pool.map of reward-function jobs over hosts as _map_over_hosts does: each process scores its share, the
    components travel as JSON text (null where the call failed)."""
    if hosts.count() == 1:
        return pool.map(jobs, call, label)
    n, mine = len(jobs), hosts.share(len(jobs))
    local = [json.dumps(None if r.failed else dict(r.components)).encode() for r in
             pool.map(jobs[mine], call, lambda i: label(mine.start + i))]
    width = hosts.max_int(max(map(len, local), default=0))
    text = np.zeros((len(local), width), np.uint8)  # JSON never holds a NUL: trailing zeros are padding
    for i, b in enumerate(local):
        text[i, :len(b)] = np.frombuffer(b, np.uint8)
    text = hosts.gather_rows(text, n)
    values = [json.loads(bytes(row).rstrip(b"\0")) for row in text]
    return [FAILED if v is None else Score.of_components(v) for v in values]


def _with_verdicts(judge: Judge, items: Sequence[ScoredTask], texts: Sequence[str], row_item: np.ndarray,
                  results: Sequence[Score]) -> list[Score]:
    """Pool results of rubric rows with their judge items decided by `judge` (one batch for the call)."""
    requests, where = [], []
    for i, j in enumerate(row_item):
        if items[j].scorer != "rubric" or results[i].met is None:
            continue
        rubric = rubric_items(items[j].rubric)
        asked = judge_items(rubric)
        if asked:
            requests.append((items[j].question, texts[i], asked))
            where.append((i, rubric))
    results = list(results)
    if not requests:
        return results
    for (i, rubric), verdict in zip(where, judge(requests)):
        judged = aligned(rubric, verdict)
        met = tuple(int(m) if v is None else int(v) for m, v in zip(results[i].met, judged))
        results[i] = Score(weighted_score(rubric, met), met)
    return results
