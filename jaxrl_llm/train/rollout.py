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
import time
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm.config import Config
from jaxrl_llm.data.types import TaskItem
from jaxrl_llm.explore.rows import RowPlan, Rollouts
from jaxrl_llm.rewards.judge import Judge
from jaxrl_llm.rewards.pool import RewardPool
from jaxrl_llm.rewards.scoring import Scores, score_parts, success
from jaxrl_llm.rl.advantages import group_advantages
from jaxrl_llm.rl.batch import RowBatch
from jaxrl_llm.sampling.sampler import FINISH_LENGTH, Sampler, SampleOutput
from jaxrl_llm.train.metrics import group_stats

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
                          success=success(cfg, s, len(pool.functions) > 0), scores=s)


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
    fresh = r.plan.fresh
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
