"""Held-out evaluation: greedy accuracy, sampled accuracy, unbiased pass@k, mean response length, and
the share of problems no sample solved. Solved is what rewards/scoring.py's Scores say (the built-in scorer's full
marks, or reward.correctness); with reward functions each component's mean is `greedy_reward/<name>` and
`sampled_reward/<name>`, beside `greedy_reward_fn_errors` / `sampled_reward_fn_errors` (failed calls).

Sampled figures are measured twice: at T = 1 (`sampled_accuracy`, `pass@k`, ...) and as the rollouts sample,
at the configured rollout temperature with rollout.top_p / top_k (the same names prefixed `rollout_t_`). A
method that moves its training temperature toward 1 (E3's controller) would otherwise look better at T = 1
merely for training closer to it; the configured temperature bounds that confound from the other side (it is
GRPO's training temperature, not the controller's). When the rollouts sample the full distribution at T = 1
the second set is a copy of the first (no second sampling pass).

With eval.revise_rounds = k > 0 and rubric-graded problems, each pass's answers then go through k
test-time self-revision rounds (train/revise_eval.py: an answer not solved is sent back with the
revise prompt, its met and unmet rubric items and itself as the draft; greedy rounds greedy, sampled ones at
their pass's temperature). Figures, round r = 1..k (revise_eval.py says what each counts):
    revise_r{r}_accuracy, revise_r{r}_reward_mean, revise_r{r}_sent, revise_r{r}_improved,
    revise_r{r}_worse, revise_r{r}_tokens, revise_best_accuracy, revise_best_reward_mean   greedy
    revise_sampled_r{r}_... and revise_sampled_best_...                                    T = 1 samples
    rollout_t_revise_sampled_...                                                           run-T samples
Without rubric-graded problems (answer tasks) the option does nothing and no revise_* figure is written.
`sampled_tokens` counts the rounds' tokens too; `response_len_mean` covers first answers only. Random
keys: pass p (0 greedy, 1 T = 1, 2 run T) samples with fold_in(key, p), its rounds with
fold_in(fold_in(key, 3 + p), round), each chunk c of a call folding in c."""

from __future__ import annotations

import time

import jax
import numpy as np

from jaxrl_llm.config import Config
from jaxrl_llm.rewards.scoring import Scores, score_parts
from jaxrl_llm.rl.spec import rows_per_step
from jaxrl_llm.train.metrics import PASS_KS as EVAL_KS
from jaxrl_llm.train.metrics import pass_at_k
from jaxrl_llm.train.policy import encode_text
from jaxrl_llm.train.revise_eval import Answers, RevisePrompts, call_shape, eval_prompts, run_rounds, widen
from jaxrl_llm.train.rollout import response_texts


def sample_scored(sampler, params, pool, tok, cfg, items, rows, temperature, key, judge=None):
    """(rewards, lengths, texts) for rows (indices into items, (item, prompt ids) pairs), sampled with
    fold_in(key, c) in chunks c of the rollout batch size so evaluation reuses the training step's
    compiled programs."""
    rewards, _, lengths, texts = sample_graded(sampler, params, pool, tok, cfg, items, rows, temperature, key, judge)
    return rewards, lengths, texts


def sample_graded(sampler, params, pool, tok, cfg, items, rows, temperature, key, judge=None, contexts=None,
                  scores: list | None = None, filters: dict | None = None, **shape):
    """sample_scored's (rewards, met [len(rows), K] | None (no rubric row), lengths, texts); `contexts`:
    each row's prompt ids instead of its item's prompt (revise prompts, still scored against the item);
    `scores`: a list that gets each chunk's Scores; `filters`: the sampler's top_p / top_k (none: the full
    distribution); `shape`: the sampler's min_rows / min_context floors."""
    max_new = cfg.eval.max_new_tokens or cfg.rollout.max_new_tokens
    chunk = rows_per_step(cfg)
    tasks = [it for it, _ in items]
    rewards, mets, lengths, texts = [], [], [], []
    for c, start in enumerate(range(0, len(rows), chunk)):
        part = rows[start:start + chunk]
        prompts = [items[j][1] for j in part] if contexts is None else contexts[start:start + chunk]
        out = sampler(params, prompts, max_new_tokens=max_new, temperature=temperature,
                      key=jax.random.fold_in(key, c), **(filters or {}), **shape)
        t = response_texts(tok, out)
        s = score_parts(pool, cfg, tasks, t, np.asarray(part), judge)
        r, met = s.rewards, s.met
        if scores is not None:
            scores.append(s)
        rewards.append(r)
        mets.append(met)
        lengths.append(out.num_generated)
        texts += t
    width = max((m.shape[1] for m in mets if m is not None), default=0)
    met = None if not width else np.concatenate([widen(m, len(r), width) for m, r in zip(mets, rewards)])
    return np.concatenate(rewards), met, np.concatenate(lengths), texts


def evaluate(sampler, params, pool, tok, cfg: Config, items, key: jax.Array, judge=None,
             outcomes: dict | None = None) -> dict:
    """The evaluation's figures; with `outcomes` (a dict), also each sample's reward and correct flag per
    temperature, problem-major (train/outcomes.py writes them)."""
    if not items:
        return {}
    t0, c0 = time.perf_counter(), time.process_time()
    n = len(items)
    rounds = Rounds.of(sampler, params, pool, tok, cfg, items, judge)
    parts: list = []  # accuracy is what the Scores call solved (the built-in scorer's, or reward.correctness)
    greedy, greedy_met, greedy_len, greedy_texts = sample_graded(sampler, params, pool, tok, cfg, items, np.arange(n),
                                                                 0.0, jax.random.fold_in(key, 0), judge, scores=parts)
    scored = Scores.concat(parts)
    if outcomes is not None:
        outcomes[0.0] = (greedy, scored.correct)
    out = {"greedy_accuracy": float(np.mean(scored.correct)), "greedy_reward_mean": float(np.mean(greedy)),
           "problems": n, **scored.metrics("greedy_")}
    lengths, tokens = [greedy_len], int(greedy_len.sum())
    if rounds is not None:
        figures = rounds(np.arange(n), greedy, greedy_met, greedy_texts, 0.0, jax.random.fold_in(key, 3),
                         scored.correct)
        out.update({f"revise_{k}": v for k, v in figures.items()})
        tokens += _round_tokens(figures)
    rollout_t = float(cfg.rollout.temperature)
    # the second pass samples as the rollouts do: their temperature, top_p and top_k
    filters = {**({"top_p": cfg.rollout.top_p} if cfg.rollout.top_p < 1.0 else {}),
               **({"top_k": cfg.rollout.top_k} if cfg.rollout.top_k > 0 else {})}
    for prefix, temperature, phase in (("", 1.0, 1), ("rollout_t_", rollout_t, 2)):
        if prefix and rollout_t == 1.0 and not filters:
            out.update({f"{prefix}{k}": v for k, v in list(out.items()) if _is_sampled(k)})
            break
        figures, sampled_len, round_tokens = _sampled_figures(sampler, params, pool, tok, cfg, items, temperature,
                                                              key, phase, judge, rounds, outcomes,
                                                              filters if prefix else None)
        out.update({f"{prefix}{k}": v for k, v in figures.items()})
        lengths.append(sampled_len)
        tokens += int(sampled_len.sum()) + round_tokens
    out["rollout_t"] = rollout_t
    # rubric tasks: the reward is the weighted share of items met, accuracy the share fully satisfied
    out["response_len_mean"] = float(np.concatenate(lengths).mean())
    out["sampled_tokens"] = tokens
    out["time_eval_s"] = time.perf_counter() - t0
    out["cpu_eval_s"] = time.process_time() - c0
    return out


def _is_sampled(name: str) -> bool:
    return name.startswith(("sampled_", "pass@", "never_solved", "revise_sampled_"))


def _round_tokens(figures: dict) -> int:
    return sum(v for k, v in figures.items() if k.endswith("_tokens"))


def _sampled_figures(sampler, params, pool, tok, cfg, items, temperature, key, phase, judge, rounds, outcomes=None,
                     filters=None):
    """eval.samples samples of every item at `temperature` (with `filters`: top_p / top_k): accuracy, mean
    reward, never-solved share, unbiased pass@k, and any revise rounds' figures; the samples' lengths; the
    rounds' tokens."""
    n, k = len(items), cfg.eval.samples
    rows = np.repeat(np.arange(n), k)
    parts: list = []
    sampled, met, sampled_len, texts = sample_graded(sampler, params, pool, tok, cfg, items, rows, temperature,
                                                     jax.random.fold_in(key, phase), judge, scores=parts,
                                                     filters=filters)
    scored = Scores.concat(parts)
    if outcomes is not None:
        outcomes[float(temperature)] = (sampled, scored.correct)
    correct = scored.correct.reshape(n, k)
    solved_count = correct.sum(axis=1)
    out = {"sampled_accuracy": float(correct.mean()), "sampled_reward_mean": float(np.mean(sampled)),
           "never_solved_share": float(np.mean(solved_count == 0)), **scored.metrics("sampled_")}
    for kk in EVAL_KS:
        if kk <= k:
            out[f"pass@{kk}"] = float(np.mean([pass_at_k(k, int(c), kk) for c in solved_count]))
    round_tokens = 0
    if rounds is not None:
        figures = rounds(rows, sampled, met, texts, temperature, jax.random.fold_in(key, 3 + phase), scored.correct,
                         filters)
        out.update({f"revise_sampled_{name}": v for name, v in figures.items()})
        round_tokens = _round_tokens(figures)
    return out, sampled_len, round_tokens


class Rounds:
    """Revise rounds of one evaluation's answers (revise_eval.py), sampled by the evaluation's sampler in
    calls of one shape: the rollout batch's rows and the items' revise-prompt context floor."""

    @classmethod
    def of(cls, sampler, params, pool, tok, cfg, items, judge) -> "Rounds | None":
        """None when eval.revise_rounds is 0 or no item has a rubric (nothing would be sent back)."""
        prompts = eval_prompts(cfg, [it for it, _ in items], lambda text: encode_text(tok, cfg, text))
        return None if prompts is None else cls(sampler, params, pool, tok, cfg, items, judge, prompts)

    def __init__(self, sampler, params, pool, tok, cfg, items, judge, prompts: RevisePrompts):
        self.args = (sampler, params, pool, tok, cfg, items)
        self.cfg, self.judge, self.prompts = cfg, judge, prompts
        rows, context = call_shape(cfg, prompts, sampler.max_cache_len)
        self.shape = {"min_rows": rows, "min_context": context}

    def __call__(self, row_item, rewards, met, texts, temperature, key, correct=None, filters=None) -> dict:
        """The rounds' figures from the first answers; `correct`: which are solved (their Scores' `correct`;
        None: full marks of `rewards`, what it is without reward functions)."""
        p = self.prompts

        def revise(r, rows, drafts: Answers):
            items = row_item[rows]
            contexts = [p.ids(int(i), drafts.met[j], drafts.texts[j]) for j, i in enumerate(items)]
            parts: list = []
            new, new_met, lengths, new_texts = sample_graded(*self.args, items, temperature, jax.random.fold_in(key, r),
                                                             self.judge, contexts, parts, filters, **self.shape)
            return Answers(new, widen(new_met, len(rows), p.width), tuple(new_texts), Scores.concat(parts).correct), \
                lengths

        first = Answers(rewards, widen(met, len(rewards), p.width), tuple(texts), correct)
        return run_rounds(first, p.graded[row_item], self.cfg.eval.revise_rounds, revise)
