"""One step's rollouts: sample groups for a batch of prompts, score them, and build the update batch."""

from __future__ import annotations

import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm.config import Config
from jaxrl_llm.data.tasks import TaskItem
from jaxrl_llm.rewards.pool import RewardPool
from jaxrl_llm.rl.advantages import group_advantages
from jaxrl_llm.sampling.sampler import FINISH_LENGTH, Sampler, SampleOutput
from jaxrl_llm.train.metrics import group_stats, solved

_advantages = jax.jit(group_advantages, static_argnames=("estimator", "num_groups"))


@dataclasses.dataclass
class Rollouts:
    out: SampleOutput
    group: np.ndarray  # [N] prompt index within the step
    rewards: np.ndarray  # [N]
    advantages: np.ndarray  # [N]
    texts: list[str]


def score_rollouts(pool: RewardPool, tok, cfg: Config, items: list[TaskItem], out: SampleOutput,
                   row_item: np.ndarray) -> tuple[np.ndarray, list[str]]:
    texts = [tok.decode(out.generated(i), skip_special_tokens=True) for i in range(len(row_item))]
    jobs = [(items[j].scorer, items[j].answer, items[j].entry_json, texts[i], cfg.data.answer_format)
            for i, j in enumerate(row_item)]
    rewards = np.asarray(pool.map(jobs), np.float32)
    if not cfg.reward.partial_credit:
        rewards = solved(rewards).astype(np.float32)
    return rewards, texts


def collect(sampler: Sampler, params, pool: RewardPool, tok, cfg: Config, batch: list[tuple[TaskItem, list[int]]],
            key: jax.Array) -> tuple[Rollouts, dict]:
    n = cfg.rollout.group_size
    items = [it for it, _ in batch]
    group = np.repeat(np.arange(len(batch)), n)
    prompts = [batch[g][1] for g in group]
    t0 = time.perf_counter()
    out = sampler(params, prompts, max_new_tokens=cfg.rollout.max_new_tokens, temperature=cfg.rollout.temperature,
                  top_p=cfg.rollout.top_p, top_k=cfg.rollout.top_k, key=key)
    t1 = time.perf_counter()
    rewards, texts = score_rollouts(pool, tok, cfg, items, out, group)
    t2 = time.perf_counter()
    adv = np.asarray(_advantages(jnp.asarray(rewards), jnp.asarray(group), jnp.ones(len(group), bool),
                                 estimator=cfg.algo.advantage, num_groups=len(group)))
    correct = solved(rewards)
    mask = out.response_mask
    metrics = {
        "reward_mean": float(rewards.mean()), "reward_std": float(rewards.std()), "accuracy": float(correct.mean()),
        **group_stats(correct, group),
        "response_len_mean": float(out.num_generated.mean()), "response_len_max": int(out.num_generated.max()),
        "truncated_share": float(np.mean(out.finish_reason == FINISH_LENGTH)),
        "entropy": float(out.entropy[mask].mean()) if mask.any() else 0.0,
        "temperature": float(np.mean(out.temperature)),
        "sample_tokens_per_s": float(out.num_generated.sum() / max(t1 - t0, 1e-9)),
        "time_sample_s": t1 - t0, "time_reward_s": t2 - t1,
    }
    return Rollouts(out, group, rewards, adv, texts), metrics


def update_batch(r: Rollouts) -> dict[str, np.ndarray]:
    """The rows of rl/layout.py: a row's context is its prompt plus any given prefix (never trained on)."""
    out = r.out
    return {"tokens": out.tokens, "context_len": out.context_len.astype(np.int32), "loss_mask": out.response_mask,
            "old_logp": out.logprobs, "advantages": r.advantages.astype(np.float32),
            "temperature": out.temperature.astype(np.float32), "valid": np.ones(len(r.rewards), bool)}
