"""Held-out evaluation: greedy accuracy, sampled accuracy at T = 1, unbiased pass@k, mean response
length, and the share of problems no sample solved."""

from __future__ import annotations

import time

import jax
import numpy as np

from jaxrl_llm.config import Config
from jaxrl_llm.train.metrics import pass_at_k, solved
from jaxrl_llm.train.rollout import response_texts, score_texts

EVAL_KS = (1, 2, 4, 8, 16)


def sample_scored(sampler, params, pool, tok, cfg, items, rows, temperature, key, judge=None):
    """(rewards, lengths, texts) for rows (indices into items, (item, prompt ids) pairs), sampled with
    fold_in(key, c) in chunks c of the rollout batch size so evaluation reuses the training step's
    compiled programs."""
    max_new = cfg.eval.max_new_tokens or cfg.rollout.max_new_tokens
    chunk = cfg.rollout.prompts_per_step * cfg.rollout.group_size
    tasks = [it for it, _ in items]
    rewards, lengths, texts = [], [], []
    for c, start in enumerate(range(0, len(rows), chunk)):
        part = rows[start:start + chunk]
        out = sampler(params, [items[j][1] for j in part], max_new_tokens=max_new, temperature=temperature,
                      key=jax.random.fold_in(key, c))
        t = response_texts(tok, out)
        rewards.append(score_texts(pool, cfg, tasks, t, np.asarray(part), judge))
        lengths.append(out.num_generated)
        texts += t
    return np.concatenate(rewards), np.concatenate(lengths), texts


def evaluate(sampler, params, pool, tok, cfg: Config, items, key: jax.Array, judge=None) -> dict:
    if not items:
        return {}
    t0 = time.perf_counter()
    n = len(items)
    greedy, greedy_len, _ = sample_scored(sampler, params, pool, tok, cfg, items, np.arange(n), 0.0,
                                          jax.random.fold_in(key, 0), judge)
    k = cfg.eval.samples
    rows = np.repeat(np.arange(n), k)
    sampled, sampled_len, _ = sample_scored(sampler, params, pool, tok, cfg, items, rows, 1.0,
                                            jax.random.fold_in(key, 1), judge)
    correct = solved(sampled).reshape(n, k)
    solved_count = correct.sum(axis=1)
    # rubric tasks: the reward is the weighted share of items met, accuracy the share fully satisfied
    out = {"greedy_accuracy": float(np.mean(solved(greedy))), "sampled_accuracy": float(correct.mean()),
           "greedy_reward_mean": float(np.mean(greedy)), "sampled_reward_mean": float(np.mean(sampled)),
           "never_solved_share": float(np.mean(solved_count == 0)),
           "response_len_mean": float(np.concatenate([greedy_len, sampled_len]).mean()), "problems": n,
           "sampled_tokens": int(greedy_len.sum() + sampled_len.sum())}
    for kk in EVAL_KS:
        if kk <= k:
            out[f"pass@{kk}"] = float(np.mean([pass_at_k(k, int(c), kk) for c in solved_count]))
    out["time_eval_s"] = time.perf_counter() - t0
    return out
