"""Held-out evaluation: greedy accuracy, sampled accuracy, unbiased pass@k, mean response length, and
the share of problems no sample solved.

Sampled figures are measured twice: at T = 1 (`sampled_accuracy`, `pass@k`, ...) and at the run's own
rollout temperature (the same names prefixed `rollout_t_`). A method that moves its training
temperature toward 1 (E3's controller) would otherwise look better at T = 1 merely for training closer
to it; comparing arms at their training temperature removes that confound. When the rollout
temperature is 1 the second set is a copy of the first (no second sampling pass)."""

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
    out = {"greedy_accuracy": float(np.mean(solved(greedy))), "greedy_reward_mean": float(np.mean(greedy)),
           "problems": n}
    lengths, tokens = [greedy_len], int(greedy_len.sum())
    rollout_t = float(cfg.rollout.temperature)
    for prefix, temperature, phase in (("", 1.0, 1), ("rollout_t_", rollout_t, 2)):
        if prefix and rollout_t == 1.0:
            out.update({f"{prefix}{k}": v for k, v in list(out.items()) if _is_sampled(k)})
            break
        figures, sampled_len = _sampled_figures(sampler, params, pool, tok, cfg, items, temperature,
                                                jax.random.fold_in(key, phase), judge)
        out.update({f"{prefix}{k}": v for k, v in figures.items()})
        lengths.append(sampled_len)
        tokens += int(sampled_len.sum())
    out["rollout_t"] = rollout_t
    # rubric tasks: the reward is the weighted share of items met, accuracy the share fully satisfied
    out["response_len_mean"] = float(np.concatenate(lengths).mean())
    out["sampled_tokens"] = tokens
    out["time_eval_s"] = time.perf_counter() - t0
    return out


def _is_sampled(name: str) -> bool:
    return name.startswith(("sampled_", "pass@", "never_solved"))


def _sampled_figures(sampler, params, pool, tok, cfg, items, temperature, key, judge):
    """eval.samples samples of every item at `temperature`: accuracy, mean reward, never-solved share,
    unbiased pass@k; and the samples' lengths."""
    n, k = len(items), cfg.eval.samples
    rows = np.repeat(np.arange(n), k)
    sampled, sampled_len, _ = sample_scored(sampler, params, pool, tok, cfg, items, rows, temperature, key, judge)
    correct = solved(sampled).reshape(n, k)
    solved_count = correct.sum(axis=1)
    out = {"sampled_accuracy": float(correct.mean()), "sampled_reward_mean": float(np.mean(sampled)),
           "never_solved_share": float(np.mean(solved_count == 0))}
    for kk in EVAL_KS:
        if kk <= k:
            out[f"pass@{kk}"] = float(np.mean([pass_at_k(k, int(c), kk) for c in solved_count]))
    return out, sampled_len
