"""HeRL on the exploration seam (ALGORITHMS.md §2): rubric-guided hindsight revisions.

After the step's rows are scored (`revise`), for the fresh groups whose best reward s* is below
`threshold`:

    candidates  the group's rows tied at s*, most rubric items met first; at most `candidate_limit`
                a step, taken round-robin over the failed groups (each group's best first)
    revise      a prompt from `revise_template`: the question, the items the draft meets and the
                ones it misses, the draft; `num_guided` revisions each, sampled by the same sampler
                at `guided_temperature` (one bucketed shape for the run: nothing compiles later)
    score       every revision against the ORIGINAL item and rubric
    bonus       each candidate's reward r <- r + alpha (best revision score - r)
    replace     per failed group the `replace_top_n` best revisions scoring above s* (keep=at_least:
                else at least s*) take the places of random members of the group, never all of them
                (`keep_best_original`: a copy of the best response over another member when none
                qualifies, in any failed group); they are flagged hindsight, so the update
                trains them with -A rho / (rho + gamma), unclipped (algo.hindsight_gamma)
    train_on    original: the revision is trained as a response to the original prompt, its old
                log-probs recomputed there by a teacher-forced pass of the current policy;
                revise_prompt: under the revise prompt
    temperature train_temperature=rollout (default): a kept revision is trained at the sampling
                temperature of the member it replaces, its old log-probs from a teacher-forced pass
                at that temperature (under the revise prompt too); guided: at guided_temperature,
                with the sampler's log-probs under revise_prompt

HeRL keeps no state across steps. Groups of replayed continuations (RRL) are left alone.

HeRL reads the reward as scored (Rollouts.scored), not the run's yes/no `correct` as E3 and RRL do: its
threshold, s*, the ties at s*, the bonus and the revisions kept above s* are all comparisons on one graded
scale, the one the update trains on, and a rubric's share of items met is what the revisions are guided to
raise (on `correct`, a threshold below 1 would mean nothing and wrong drafts meeting more items would tie
with the rest). With reward functions that scale is the total: set `threshold` on it. With a 0.5 format bonus,
threshold 1.5 revises every group whose best misses full marks plus the bonus (threshold 1 would skip a wrong
draft the bonus lifts to 1.2); under a length penalty a fully met rubric scoring 0.95 is revised under
threshold 1, and a revision is kept only when its total is higher.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import jax
import numpy as np
from flax import struct

from jaxrl_llm.config import HeRLSection
from jaxrl_llm.explore.base import Explorer, Footprint, LogprobFn, SampleFn, ScoreFn, Setup, StepInfo
from jaxrl_llm.explore.rows import RowPlan, Rollouts
from jaxrl_llm.rewards.rubrics import rubric_items
from jaxrl_llm.sampling.buckets import bucket
from jaxrl_llm.sampling.sampler import row_key_data

TIE = 1e-6


def _bullets(lines) -> str:
    return "\n".join(f"- {x}" for x in lines) if lines else "(none)"


def revise_text(template: str, question: str, met: list[str], unmet: list[str], draft: str) -> str:
    """The revise prompt: `template` (fields {question}, {draft}, {met}, {unmet}) filled with the question,
    the draft, and the descriptions of the rubric items the draft meets and misses as bulleted lists. The
    trainer's guided revisions and evaluation's revise rounds (train/revise_eval.py) share it."""
    return template.format(question=question, draft=draft, met=_bullets(met), unmet=_bullets(unmet))


def failed_groups(group: np.ndarray, scored: np.ndarray, eligible: np.ndarray, threshold: float
                  ) -> list[tuple[int, np.ndarray, float]]:
    """(group id, its eligible rows, best reward s*) of the groups whose best is below `threshold`, in
    group-id order."""
    out = []
    for g in np.unique(group[eligible]):
        rows = np.flatnonzero((group == g) & eligible)
        best = float(scored[rows].max())
        if best < threshold:
            out.append((int(g), rows, best))
    return out


def ranked_best(rows: np.ndarray, best: float, scored: np.ndarray, met_count: np.ndarray) -> np.ndarray:
    """A group's rows tied at its best reward, most items met first, then lower row."""
    tied = rows[np.abs(scored[rows] - best) < TIE]
    return tied[np.lexsort((tied, -met_count[tied]))]


def candidates(failed, scored: np.ndarray, met_count: np.ndarray, limit: int) -> list[tuple[int, int]]:
    """(index into `failed`, row) pairs: each failed group's `ranked_best` rows, taken round-robin over
    the groups (rank 0 of every group, then rank 1, ...), at most `limit`."""
    ranked = [ranked_best(rows, best, scored, met_count) for _, rows, best in failed]
    out, rank = [], 0
    while len(out) < limit and any(rank < len(r) for r in ranked):
        out += [(f, int(r[rank])) for f, r in enumerate(ranked) if rank < len(r)]
        rank += 1
    return out[:limit]


def choose_revisions(scores: np.ndarray, best: float, top_n: int, at_least: bool = False) -> np.ndarray:
    """Indices of up to `top_n` revisions (highest score first, lower index on ties): those strictly
    above `best`; with `at_least`, when none is, those at least `best` (within the tie tolerance)."""
    order = np.lexsort((np.arange(len(scores)), -scores))
    above = [i for i in order if scores[i] > best + TIE]
    pool = above if above or not at_least else [i for i in order if scores[i] >= best - TIE]
    return np.asarray(pool[:top_n], np.int64)


def at_temperature(r: Rollouts, temperature: np.ndarray) -> Rollouts:
    """The rows `r` trained at `temperature` [n] (the loss's and the old log-probs' softmax temperature)."""
    t = np.asarray(temperature, np.float32)
    return dataclasses.replace(r, plan=dataclasses.replace(r.plan, temperature=t),
                               out=dataclasses.replace(r.out, temperature=t))


@dataclasses.dataclass(frozen=True)
class HeRLRun:
    """What HeRL takes from the run's Setup: HeRLState's static field (explore/base.py)."""

    cfg: HeRLSection
    instruction: str  # data.instruction, after each question
    guided_rows: int  # the guided revisions' one sampler row count
    extra: int  # the most revisions kept a step (contexts of their own under train_on=revise_prompt)
    moved_rows: int  # the teacher-forced pass's one row count
    guided_context: int  # the guided revisions' one context bucket: the longest revise prompt and a full draft
    items: Sequence[Any] = dataclasses.field(default=(), compare=False)  # [P] the training TaskItems
    prompts: Sequence[Sequence[int]] = dataclasses.field(default=(), compare=False)  # [P] their prompt tokens
    encode: Callable[[str], list] | None = dataclasses.field(default=None, compare=False)

    def question(self, item: int) -> str:
        q = self.items[item].question
        return q + (f"\n{self.instruction}" if self.instruction else "")

    def rubric(self, item: int) -> tuple:
        text = self.items[item].rubric
        return rubric_items(text) if text else ()

    def met_of(self, met: np.ndarray, row: int, item: int) -> np.ndarray:
        """The row's met vector over its item's whole rubric: the step's `met` is as wide as the most
        items a scored row reported, so items past it (a rubric whose rows all failed to score) are unmet."""
        out = np.zeros(len(self.rubric(item)), bool)
        width = min(len(out), met.shape[1])
        out[:width] = met[row, :width]
        return out

    def revise_prompt(self, item: int, met: np.ndarray, draft: str) -> str:
        """The revise prompt of `item` for a draft meeting the rubric items `met`."""
        rubric = self.rubric(item)
        return revise_text(self.cfg.revise_template, self.question(item),
                           [r.description for k, r in enumerate(rubric) if met[k]],
                           [r.description for k, r in enumerate(rubric) if not met[k]], draft)


@struct.dataclass
class HeRLState:
    """HeRL keeps no arrays across steps: its state is the run's constants alone."""

    run: HeRLRun = struct.field(pytree_node=False)


class HeRL(Explorer):
    name = "herl"

    def __init__(self, cfg: HeRLSection, instruction: str = ""):
        self.cfg = cfg
        self.instruction = instruction

    def init(self, setup: Setup) -> tuple[HeRLState, Footprint]:
        c = self.cfg
        if setup.encode is None:
            raise ValueError("HeRL needs the run's prompt encoder (Setup.encode) to build revise prompts")
        guided_rows = c.candidate_limit * c.num_guided
        extra = setup.prompts_per_step * c.replace_top_n
        sized = HeRLRun(cfg=c, instruction=self.instruction, guided_rows=guided_rows, extra=extra,
                        moved_rows=min(setup.rows, bucket(extra)), guided_context=0, items=setup.items,
                        prompts=setup.prompts, encode=setup.encode)
        # the longest revise prompt: the question and every rubric item listed, plus a draft of a full response
        longest = max((len(setup.encode(sized.revise_prompt(i, np.ones(len(sized.rubric(i)), bool), "")))
                       for i in range(setup.num_items)), default=0)
        run = dataclasses.replace(sized, guided_context=bucket(longest + setup.max_new_tokens, 16))
        own = c.train_on == "revise_prompt"
        footprint = Footprint(extra_contexts=run.extra if own else 0, context_tokens=run.guided_context if own else 0,
                              sampling_calls=((run.guided_rows, run.guided_context),))  # padded to these floors
        return HeRLState(run=run), footprint

    def revise(self, state, rollouts: Rollouts, info: StepInfo, sample: SampleFn, score: ScoreFn,
               logprobs: LogprobFn | None = None) -> tuple[Rollouts, dict]:
        c, run, plan = self.cfg, state.run, rollouts.plan
        scored = rollouts.scored
        met = rollouts.met if rollouts.met is not None else np.zeros((rollouts.rows, 0), bool)
        failed = failed_groups(plan.group, scored, plan.fresh, c.threshold)
        met_count = met.sum(axis=1)
        cands = candidates(failed, scored, met_count, c.candidate_limit)
        metrics = {"herl_failed_groups": len(failed), "herl_candidates": len(cands), "herl_revisions": 0,
                   "herl_kept": 0, "herl_sampled_tokens": 0}
        if not cands:
            return rollouts, metrics
        rows = np.repeat([r for _, r in cands], c.num_guided)
        contexts = []
        for r in rows:
            item = int(plan.prompt[r])
            contexts.append(run.encode(run.revise_prompt(item, run.met_of(met, r, item), rollouts.texts[r])))
        n = len(rows)
        guided = RowPlan(prompt=plan.prompt[rows], group=plan.group[rows],
                         temperature=np.full(n, c.guided_temperature, np.float32), prefix=((),) * n,
                         replayed=np.zeros(n, bool), hindsight=np.ones(n, bool),
                         # keys for the call's fixed row count, cut on the host: no program per n
                         row_keys=np.asarray(row_key_data(jax.random.fold_in(info.key, 0), run.guided_rows))[:n])
        out = sample(guided, contexts, min_rows=run.guided_rows, min_context=run.guided_context)
        revised = score(guided, out)  # against the ORIGINAL items and rubrics
        rev = revised.scored
        best_rev = rev.reshape(len(cands), c.num_guided).max(axis=1)
        cand_rows = np.array([r for _, r in cands])
        bonus = c.alpha * (best_rev - scored[cand_rows])
        rewards = rollouts.rewards.copy()
        rewards[cand_rows] += bonus

        rng = np.random.default_rng(np.asarray(jax.random.key_data(jax.random.fold_in(info.key, 1))))
        cand_of = np.repeat([f for f, _ in cands], c.num_guided)  # failed-group index of each revision
        victims, kept = [], []
        copies = []  # (victim row, original row) for keep_best_original
        for f, (_, grows, best) in enumerate(failed):
            mine = np.flatnonzero(cand_of == f)
            pick = mine[choose_revisions(rev[mine], best, c.replace_top_n, c.keep == "at_least")] \
                if len(mine) else np.zeros(0, int)
            pick = pick[:len(grows) - 1]  # a sampled row stays in every group (E3 / RRL can make groups small)
            places = rng.permutation(grows)
            if len(pick):
                victims += places[:len(pick)].tolist()
                kept += pick.tolist()
            elif c.keep_best_original and len(grows) > 1:  # any failed group, with candidates or past the limit
                top = int(ranked_best(grows, best, scored, met_count)[0])
                copies.append((int(next(p for p in places if p != top)), top))
        result = dataclasses.replace(rollouts, rewards=rewards, advantages=None)
        if kept:
            new = revised.take(np.asarray(kept))
            if c.train_temperature == "rollout":  # the temperature of the group member it replaces
                new = at_temperature(new, rollouts.plan.temperature[np.asarray(victims)])
            # old log-probs: the sampler's only when the row is trained where and how it was sampled; otherwise
            # a teacher-forced pass of the current policy over the context and temperature it is trained at
            teacher = c.train_on == "original" or c.train_temperature == "rollout"
            if teacher:
                moved = new.out.with_prompts([run.prompts[int(p)] for p in new.plan.prompt]) \
                    if c.train_on == "original" else new.out
                if logprobs is None:
                    raise ValueError(f"HeRL train_on={c.train_on} train_temperature={c.train_temperature} needs the "
                                     f"trainer's log-prob pass")
                lp = np.asarray(logprobs(moved, min_rows=run.moved_rows), np.float32)
                moved = dataclasses.replace(moved, logprobs=np.where(moved.response_mask, lp, 0.0).astype(np.float32))
                new = dataclasses.replace(new, out=moved)
            result = result.replace_rows(np.asarray(victims), new)
        if copies:
            copy = result.take(np.array([o for _, o in copies]))
            copy = dataclasses.replace(copy, plan=dataclasses.replace(copy.plan, copied=np.ones(len(copies), bool)))
            result = result.replace_rows(np.array([v for v, _ in copies]), copy)
        metrics.update({
            "herl_revisions": n, "herl_kept": len(kept) + len(copies),
            "herl_revision_success": float(np.mean(rev > np.array([failed[f][2] for f in cand_of]) + TIE)),
            # kept revisions that beat their group's best (the rest: ties under keep=at_least)
            "herl_kept_above_best": int(sum(rev[i] > failed[cand_of[i]][2] + TIE for i in kept)),
            "herl_revision_reward": float(rev.mean()), "herl_bonus_mean": float(bonus.mean()),
            "herl_sampled_tokens": int(out.num_generated.sum()),
            # what the update trains on: revisions swapped in, candidates' bonus (the step's reward_mean and
            # accuracy are the sampled rows' own)
            "herl_trained_reward_mean": float(result.rewards.mean())})
        return result, metrics
