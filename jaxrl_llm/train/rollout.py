"""One step's rollouts, phase by phase: plan -> sample -> score -> (explorers revise) -> advantages.

Each phase is a function of the previous one's output (explore/rows.py types), so explorers
(explore/) can change the plan before sampling and the rows after scoring, and the advantages are
computed last, over whatever rows the step ended with (groups of any size, by segment sums).

A row's reward is the task's built-in scorer's (reward.builtin) plus, for each reward.functions entry
(rewards/functions.py), its weight times the sum of its components. What counts as solved (accuracy, pass@k,
the evaluation's figures) is the built-in scorer's full marks, or with reward.correctness = a component's name,
that component (unweighted) >= 1; a row where it is missing (its function failed) is unsolved. The explorers read
the same: `score` hands each row's `correct` to them (E3's accuracy figures, RRL's solved prompts), and its
`success`, the value `correct` is full marks of clipped to [0, 1], to what they average (E3's difficulty ranks,
RRL's state values and priors); without reward functions that is the reward itself, so nothing changes. HeRL
stays on the reward (explore/herl.py says why).
"""

from __future__ import annotations

import dataclasses
import json
import time
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm.config import Config
from jaxrl_llm.data.tasks import TaskItem
from jaxrl_llm.explore.rows import RowPlan, Rollouts
from jaxrl_llm.parallel import hosts
from jaxrl_llm.rewards.functions import BUILTIN, call
from jaxrl_llm.rewards.judge import Judge, aligned, judge_items
from jaxrl_llm.rewards.pool import RewardPool
from jaxrl_llm.rewards.rubrics import rubric_items, weighted_score
from jaxrl_llm.rl.advantages import group_advantages
from jaxrl_llm.rl.batch import RowBatch
from jaxrl_llm.sampling.sampler import FINISH_LENGTH, Sampler, SampleOutput
from jaxrl_llm.train.metrics import group_stats, solved

_advantages = jax.jit(group_advantages, static_argnames=("estimator", "num_groups"))


def plan_rows(cfg: Config, prompt_ids: np.ndarray, key: jax.Array) -> RowPlan:
    """Plain GRPO's plan: every prompt (training-set indices) rollout.group_size times at
    rollout.temperature."""
    return RowPlan.groups([cfg.rollout.group_size] * len(prompt_ids), cfg.rollout.temperature, key, prompt_ids)


def sample_plan(sampler: Sampler, params, cfg: Config, prompts: Sequence[Sequence[int]], plan: RowPlan,
                contexts: Sequence[Sequence[int]] | None = None, **shape) -> SampleOutput:
    """One sampler call for the plan's rows: row i continues prompts[plan.prompt[i]] (prompts of the
    whole training set; or contexts[i] when given, e.g. a revise prompt) plus its given prefix, at its
    temperature, with its key, for rollout.max_new_tokens less the prefix. `shape`: the sampler's
    min_rows / min_context floors."""
    ctx = [prompts[i] for i in plan.prompt] if contexts is None else contexts
    # a given prefix counts against the response's budget
    budget = np.maximum(cfg.rollout.max_new_tokens - np.array([len(p) for p in plan.prefix], np.int64), 1)
    return sampler(params, ctx, max_new_tokens=budget, temperature=plan.temperature,
                   top_p=cfg.rollout.top_p, top_k=cfg.rollout.top_k, row_keys=jax.random.wrap_key_data(plan.row_keys),
                   prefixes=plan.prefix, **shape)


def response_texts(tok, out: SampleOutput) -> list[str]:
    """Each row's response as scored: its given prefix (if any) and the tokens it generated."""
    start, stop = out.prompt_len, out.context_len + out.num_generated
    return [tok.decode(out.tokens[i, start[i]:stop[i]].tolist(), skip_special_tokens=True) for i in range(out.rows)]


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


def score_rows(pool: RewardPool, cfg: Config, items: Sequence[TaskItem], texts: Sequence[str],
               row_item: np.ndarray, judge: Judge | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """(rewards [N], met [N, K] | None) of texts[i] as an answer to items[row_item[i]] (score_parts)."""
    s = score_parts(pool, cfg, items, texts, row_item, judge)
    return s.rewards, s.met


def score_parts(pool: RewardPool, cfg: Config, items: Sequence[TaskItem], texts: Sequence[str],
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
    results = _gather_dicts(pool, jobs, lambda i: pool.functions[i // max(n, 1)].label)
    total = builtin.astype(np.float64)
    parts = {BUILTIN: builtin} if cfg.reward.builtin else {}
    owner, errors = {}, 0
    for k, fn in enumerate(pool.functions):
        for i in range(n):
            result = results[k * n + i]
            if not isinstance(result, dict):  # the call failed: the pool counted it and kept its text
                errors += 1
                continue
            for name, value in result.items():
                if owner.setdefault(name, k) != k:
                    raise ValueError(f"{fn.label} and {pool.functions[owner[name]].label} both return a component "
                                     f"named {name!r}; rename one")
                parts.setdefault(name, np.zeros(n, np.float32))[i] = value
                total[i] += fn.weight * value
    name = cfg.reward.correctness
    correct = solved(builtin) if not name else solved(parts[name]) if name in parts else np.zeros(n, bool)
    return Scores(total.astype(np.float32), met, correct, parts, errors, pool.stats.last_error if errors else "")


def _builtin_rows(pool: RewardPool, cfg: Config, items: Sequence[TaskItem], texts: Sequence[str],
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
    rewards = np.array([r[0] if isinstance(r, tuple) else r for r in results], np.float32)
    rubric = np.array([items[j].scorer == "rubric" for j in row_item], bool)
    if not cfg.reward.partial_credit:  # rubric rewards are fractions by definition
        rewards = np.where(rubric, rewards, solved(rewards).astype(np.float32))
    if not rubric.any():
        return rewards, None
    k = max(len(r[1]) for r in results if isinstance(r, tuple)) if any(isinstance(r, tuple) for r in results) else 1
    met = np.zeros((len(results), k), bool)
    for i, r in enumerate(results):
        if isinstance(r, tuple):
            met[i, :len(r[1])] = np.asarray(r[1], bool)
    return rewards, met


def _map_over_hosts(pool: RewardPool, jobs: list) -> list:
    """pool.map(jobs), each process of a multi-host run checking only its share of the rows in its own pool
    and every process getting every result (rewards, and the items met where a scorer returns them)."""
    if hosts.count() == 1:
        return pool.map(jobs)
    n, mine = len(jobs), hosts.share(len(jobs))
    local = pool.map(jobs[mine])
    k = hosts.max_int(max((len(r[1]) for r in local if isinstance(r, tuple)), default=0))
    reward = np.array([r[0] if isinstance(r, tuple) else r for r in local], np.float64)
    graded = np.array([isinstance(r, tuple) for r in local], bool)
    met = np.full((len(local), k + 1), -1, np.int8)  # -1 past an item list's end
    for i, r in enumerate(local):
        if isinstance(r, tuple):
            met[i, :len(r[1])] = r[1]
    reward, graded, met = (hosts.gather_rows(x, n) for x in (reward, graded, met))
    return [(float(reward[i]), [int(m) for m in met[i] if m >= 0]) if graded[i] else float(reward[i])
            for i in range(n)]


def _gather_dicts(pool: RewardPool, jobs: list, label) -> list:
    """pool.map of reward-function jobs ({component: value}, or 0.0 where the call failed) over hosts as
    _map_over_hosts does: each process scores its share, the results travel as JSON text."""
    if hosts.count() == 1:
        return pool.map(jobs, call, label)
    n, mine = len(jobs), hosts.share(len(jobs))
    local = [json.dumps(r if isinstance(r, dict) else None).encode() for r in
             pool.map(jobs[mine], call, lambda i: label(mine.start + i))]
    width = hosts.max_int(max(map(len, local), default=0))
    text = np.zeros((len(local), width), np.uint8)  # JSON never holds a NUL: trailing zeros are padding
    for i, b in enumerate(local):
        text[i, :len(b)] = np.frombuffer(b, np.uint8)
    text = hosts.gather_rows(text, n)
    return [json.loads(bytes(row).rstrip(b"\0")) or 0.0 for row in text]


def _with_verdicts(judge: Judge, items, texts, row_item, results) -> list:
    """Pool results of rubric rows with their judge items decided by `judge` (one batch for the call)."""
    requests, where = [], []
    for i, j in enumerate(row_item):
        if items[j].scorer != "rubric" or not isinstance(results[i], tuple):
            continue
        rubric = rubric_items(items[j].rubric)
        asked = judge_items(rubric)
        if asked:
            requests.append((items[j].question, texts[i], asked))
            where.append((i, rubric))
    if not requests:
        return results
    results = list(results)
    for (i, rubric), verdict in zip(where, judge(requests)):
        judged = aligned(rubric, verdict)
        met = [int(m) if v is None else int(v) for m, v in zip(results[i][1], judged)]
        results[i] = (weighted_score(rubric, met), met)
    return results


def score_texts(pool: RewardPool, cfg: Config, items: Sequence[TaskItem], texts: Sequence[str],
                row_item: np.ndarray, judge: Judge | None = None) -> np.ndarray:
    """Rewards [N] of texts[i] as an answer to items[row_item[i]] (score_rows without the items met)."""
    return score_rows(pool, cfg, items, texts, row_item, judge)[0]


@dataclasses.dataclass(frozen=True)
class ScoredRollouts(Rollouts):
    """Rollouts as `score` made them, with their Scores (what is solved, the reward functions' components) for
    the step's metrics; rows an explorer takes, joins or replaces are plain Rollouts again."""

    scores: Scores | None = None


def score(pool: RewardPool, tok, cfg: Config, items: Sequence[TaskItem], plan: RowPlan,
          out: SampleOutput, judge: Judge | None = None) -> Rollouts:
    """Rewards of the sampled plan against the ORIGINAL items of its rows (items of the whole
    training set), and for rubric tasks the items each row met."""
    texts = response_texts(tok, out)
    s = score_parts(pool, cfg, items, texts, plan.prompt, judge)
    return ScoredRollouts(plan, out, s.rewards, tuple(texts), s.met, correct=s.correct,
                          success=_success(cfg, s, len(pool.functions) > 0), scores=s)


def _success(cfg: Config, s: Scores, functions: bool) -> np.ndarray:
    """[N] float32 in [0, 1] whose full marks are `s.correct`: the reward itself without reward functions (the
    built-in scorer's, partial credit included); with them the built-in scorer's reward, or the
    reward.correctness component, clipped (the total's scale is the user's: bonuses, penalties)."""
    if not functions:
        return s.rewards
    source = s.components.get(cfg.reward.correctness or BUILTIN)
    return np.zeros(len(s.rewards), np.float32) if source is None else np.clip(source, 0.0, 1.0).astype(np.float32)


def with_advantages(r: Rollouts, estimator: str) -> Rollouts:
    """Advantages within the plan's groups, over every row the step ended with."""
    group = r.plan.group
    adv = _advantages(jnp.asarray(r.rewards), jnp.asarray(group), jnp.ones(r.rows, bool), estimator=estimator,
                      num_groups=r.rows)
    return dataclasses.replace(r, advantages=np.asarray(adv, np.float32))


def rollout_metrics(r: Rollouts) -> dict:
    """The step's sampled rows. Reward, accuracy and the group figures (pass@k, all-wrong / all-right
    shares) are over the fresh rows only, so they measure the policy on the step's prompts whatever an
    explorer adds; replayed continuations (RRL) are reported apart as `replay_*`, with the share of their
    groups whose rewards are all equal (zero variance: no group-relative advantage, no gradient).
    Rubric tasks add `rubric_item_met`: the share of fresh rows meeting each rubric item, by position.
    Accuracy and the group figures count the rows' `correct` (the Scores'); with reward functions each
    component's mean over the fresh rows is `reward/<name>`, beside `reward_fn_errors` (failed calls this
    scoring) and `reward_fn_last_error`.
    Lengths, entropy and temperature cover every sampled row (what sampling cost)."""
    out, rewards = r.out, r.rewards
    fresh = ~r.plan.replayed & ~r.plan.hindsight
    scores, correct = getattr(r, "scores", None), r.correct
    mask = out.response_mask
    metrics = {
        "reward_mean": float(rewards[fresh].mean()), "reward_std": float(rewards[fresh].std()),
        "accuracy": float(correct[fresh].mean()), **group_stats(correct[fresh], r.plan.group[fresh]),
        "rows_in_mixed_groups": _mixed_share(rewards[fresh], r.plan.group[fresh]),
        "response_len_mean": float(out.num_generated.mean()), "response_len_max": int(out.num_generated.max()),
        "truncated_share": float(np.mean(out.finish_reason == FINISH_LENGTH)),
        "entropy": float(out.entropy[mask].mean()) if mask.any() else 0.0,
        "temperature": float(np.mean(out.temperature)),
        "sampled_tokens": int(out.num_generated.sum()),
    }
    if scores is not None:
        metrics.update(scores.metrics(rows=fresh))
    if r.met is not None and r.met.shape[1]:  # rubric tasks: how often each item position is met (fresh rows)
        metrics["rubric_item_met"] = [round(float(x), 6) for x in r.met[fresh].mean(axis=0)]
    replay = r.plan.replayed
    if replay.any():
        groups = [rewards[replay & (r.plan.group == g)] for g in np.unique(r.plan.group[replay])]
        metrics.update({"replay_reward_mean": float(rewards[replay].mean()),
                        "replay_accuracy": float(correct[replay].mean()),
                        "replay_groups_zero_variance": float(np.mean([np.ptp(g) < 1e-6 for g in groups]))})
    return metrics


def _mixed_share(rewards: np.ndarray, group: np.ndarray) -> float:
    """The share of rows whose group's rewards differ (the rows a group-relative advantage can move)."""
    mixed = {g: np.ptp(rewards[group == g]) > 1e-6 for g in np.unique(group)}
    return float(np.mean([mixed[g] for g in group]))


def update_rows(r: Rollouts) -> RowBatch:
    """The rows of rl/layout.py: a row's context is its prompt plus any given prefix (never trained on)."""
    out = r.out
    return RowBatch.make(out.tokens, out.response_mask, context_len=out.context_len, old_logp=out.logprobs,
                         advantages=r.advantages, temperature=out.temperature, hindsight=r.plan.hindsight)


def collect(sampler: Sampler, params, pool: RewardPool, tok, cfg: Config, batch, key: jax.Array
            ) -> tuple[Rollouts, dict]:
    """Plain GRPO's rollouts for (item, prompt ids) pairs, the phases back to back, with their times
    (benchmarks; the trainer runs the phases itself, with its explorers between them)."""
    items, prompts = [it for it, _ in batch], [ids for _, ids in batch]
    plan = plan_rows(cfg, np.arange(len(batch)), key)
    t0 = time.perf_counter()
    out = sample_plan(sampler, params, cfg, prompts, plan)
    t1 = time.perf_counter()
    r = with_advantages(score(pool, tok, cfg, items, plan, out), cfg.algo.advantage)
    t2 = time.perf_counter()
    return r, {**rollout_metrics(r), "time_sample_s": t1 - t0, "time_reward_s": t2 - t1}
