"""RRL on the exploration seam (ALGORITHMS.md §3): a replay array of promising prefix states cut from
the responses of unsolved prompts, continued in later steps.

State (a pytree, checkpointed with the run): the replay array (explore/replay.py, laid out over the
mesh's batch axes) and per-prompt trackers over the training set (fresh rollouts solved and sampled,
the success of the prompt's last fresh group, how it was first solved). Each step:

    plan     after `warmup_steps`, k = floor(replay_ratio x u x N / continuations) states are drawn
             by priority (u: the share of the batch's prompts not yet solved, unseen ones counting as
             unsolved); k x continuations fresh slots are freed, one at a time from the largest
             group (never below two rows), and given to continuation rows: the state's prompt, its
             prefix as a given context, the freed slots' temperatures, one group per state, and the
             state's slot (RowPlan.replay_slot: observe reads the draw back from the rows, so nothing
             waits on the explorer between the phases). The response budget counts the prefix, so a
             continuation may add max_new_tokens - prefix.
    observe  continuation rewards update the replayed states' values, then backtracking; states of
             prompts whose fresh group reached `unsolved_below` are dropped (and stale ones, with
             `max_age`); every response of a still-unsolved prompt (fresh or continued) is cut at
             step boundaries (explore/cuts.py), `prefixes_per_response` cuts kept, prior = its success
             as scored (partial credit when on), or with prior=steps the prefix's own share of the
             reference solution's lines it has right (0 once a line is wrong: such prefixes are not
             kept under priority=uncertainty); optionally the reference solution too (prior 1, or its
             share with prior=steps).
    priority `uncertainty` (default) draws the states whose continuations are likeliest to differ
             (explore/replay.py), since a group of continuations that all succeed or all fail gives
             GRPO no gradient; `value` draws the most valuable ones (ALGORITHMS.md §3). The step's
             accuracy and pass@k are of its fresh rows; `replay_*` figures are the continuations'.

Solved is the run's (Rollouts.correct: the built-in scorer's full marks, or reward.correctness), never full
marks of a total that reward functions' bonuses or penalties move; what RRL averages (state values, priors,
the uncertainty rule's [0, 1] estimates) is Rollouts.success, the [0, 1] value whose full marks are `correct`
(the reward as scored without reward functions). Whether continuation groups are mixed (have a gradient)
is read from the rewards, which are what the update trains on.

Shapes are fixed for the run (states drawn: always k_max, candidates: N x prefixes per response),
and the trainer pads contexts to one length and count bucket, so nothing compiles after warm-up.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxrl_llm.config import RRLSection
from jaxrl_llm.explore.base import Explorer, Footprint, Setup, StepInfo
from jaxrl_llm.explore.cuts import boundary_table, cut_lengths, keep_best
from jaxrl_llm.explore.replay import Jitted, ReplayState, empty, jitted, state_shardings
from jaxrl_llm.explore.replay import value as replay_value
from jaxrl_llm.explore.rows import RowPlan, Rollouts
from jaxrl_llm.parallel import hosts
from jaxrl_llm.parallel.hosts import to_host
from jaxrl_llm.sampling.sampler import FINISH_STOP, row_key_data

MIN_FRESH_GROUP = 2  # freeing slots never leaves a fresh group below this (an advantage needs two rows)
NEVER, BY_FRESH, BY_REPLAY = 0, 1, 2  # RRLState.first_solved


def _lines(text: str) -> list[str]:
    """Non-blank lines of `text` with spaces removed (how prefixes and reference solutions are compared)."""
    return [ln.replace(" ", "") for ln in text.splitlines() if ln.strip()]


@dataclasses.dataclass(frozen=True)
class RRLRun:
    """What RRL takes from the run's Setup: RRLState's static field (explore/base.py)."""

    cfg: RRLSection
    num_items: int  # P
    rows: int  # N
    prompts_per_step: int  # B
    max_prefix: int  # T: the longest stored prefix
    k_max: int  # the most states a step draws
    num_candidates: int  # cuts offered to the replay array a step (padded to this)
    table: np.ndarray | None = dataclasses.field(default=None, compare=False)  # [V] cuts.py's boundary flags
    # [P] reference solutions' tokens (reference_prefixes), and their lines (prior=steps)
    references: tuple = dataclasses.field(default=(), compare=False)
    ref_lines: tuple = dataclasses.field(default=(), compare=False)
    tokenizer: Any = dataclasses.field(default=None, compare=False)
    ops: Jitted | None = dataclasses.field(default=None, compare=False)  # replay.py's functions, in the run's layout

    def step_prior(self, item: int, prefix) -> float:
        """prior=steps: m / L when the prefix's m complete lines (spaces ignored, blank lines skipped) are the
        first m of the item's L reference lines, else 0 (a prefix with a wrong line is not worth continuing)."""
        text = self.tokenizer.decode([int(t) for t in prefix], skip_special_tokens=True)
        done, ref = _lines(text.rsplit("\n", 1)[0] if "\n" in text else ""), self.ref_lines[item]
        return len(done) / len(ref) if len(done) <= len(ref) and done == ref[:len(done)] else 0.0


@struct.dataclass
class RRLState:
    replay: ReplayState
    fresh_solved: jax.Array  # [P] float32 solved fresh rollouts of each training prompt so far
    fresh_count: jax.Array  # [P] float32 fresh rollouts so far
    last_success: jax.Array  # [P] float32 success rate of the prompt's last fresh group; -1: never sampled
    first_solved: jax.Array  # [P] int32 NEVER, BY_FRESH or BY_REPLAY (a continuation of a replayed state)
    run: RRLRun = struct.field(pytree_node=False)


def _unsolved_share(state: RRLState, info: StepInfo, unsolved_below: float) -> float:
    """The share of the step's prompts not yet solved (never-sampled ones count as unsolved)."""
    return float(np.mean(to_host(state.last_success)[np.asarray(info.prompt_ids)] < unsolved_below))


def free_slots(group: np.ndarray, count: int, floor: int = MIN_FRESH_GROUP) -> np.ndarray:
    """Indices of `count` rows to free from the groups `group` [N]: one at a time from the currently
    largest group (ties: the higher group id), each group's last rows first, no group below `floor`.
    Fewer when the groups cannot give that many."""
    ids, inverse = np.unique(group, return_inverse=True)
    left = np.bincount(inverse).astype(np.int64)
    take = np.zeros_like(left)
    for _ in range(count):
        room = left - take
        if room.max() <= floor:
            break
        g = len(room) - 1 - int(np.argmax(room[::-1]))
        take[g] += 1
    freed = []
    for g in range(len(ids)):
        if take[g]:
            freed.extend(np.flatnonzero(inverse == g)[-take[g]:].tolist())
    return np.sort(np.asarray(freed, np.int64))


def min_group_size(continuations: int, rows: int, prompts: int, k_max: int) -> int:
    """The smallest group replay can leave. Continuation groups have `continuations` rows. Fresh groups lose
    at most F = k_max x continuations rows in all, one at a time from the largest: a group last cut at size
    s + 1 was the largest then, so every group ends at most s + 1 and N - F <= B (s + 1): no cut group ends
    below ceil((N - F) / B) - 1 (nor below MIN_FRESH_GROUP). The update's shared layout holds micro-batch
    rows / this many contexts, so a tight bound is a smaller update."""
    cut_floor = -(-(rows - k_max * continuations) // prompts) - 1
    return min(continuations, max(MIN_FRESH_GROUP, cut_floor))


class RRL(Explorer):
    name = "rrl"

    def __init__(self, cfg: RRLSection):
        self.cfg = cfg

    # -- state --------------------------------------------------------------------------------------
    def init(self, setup: Setup) -> tuple[RRLState, Footprint]:
        c = self.cfg
        max_prefix = max(1, min(c.max_prefix_tokens, setup.max_new_tokens - 1))
        k_max = int(c.replay_ratio * setup.rows) // c.continuations
        if k_max == 0:  # RRL would only collect states, every step, with nothing to say so but a zero metric
            raise ValueError(f"explore.rrl: replay_ratio x rows per step ({c.replay_ratio} x {setup.rows}) is below "
                             f"continuations ({c.continuations}): no state could ever be replayed; raise "
                             f"explore.rrl.replay_ratio or the rows per step, or lower explore.rrl.continuations")
        if c.boundary != "tokens" and setup.tokenizer is None:
            raise ValueError(f"explore.rrl.boundary={c.boundary!r} needs the run's tokenizer")
        references = ()
        if c.reference_prefixes:
            references = tuple(np.asarray(setup.tokenizer(it.reference, add_special_tokens=False)["input_ids"]
                                          if it.reference else [], np.int32) for it in setup.items)
        ref_lines = ()
        if c.prior == "steps":
            if setup.tokenizer is None:
                raise ValueError("explore.rrl.prior=steps needs the run's tokenizer")
            for i, it in enumerate(setup.items):
                if not (it.reference or "").strip():
                    raise ValueError(f"explore.rrl.prior=steps needs a reference solution for every training item "
                                     f"(data.worked, or the data's reference field); item {i} (uid {it.uid}) has none")
            ref_lines = tuple(_lines(it.reference) for it in setup.items)
        shardings = state_shardings(setup.mesh, c.capacity) if setup.mesh is not None else None
        run = RRLRun(cfg=c, num_items=setup.num_items, rows=setup.rows, prompts_per_step=setup.prompts_per_step,
                     max_prefix=max_prefix, k_max=k_max,
                     num_candidates=(setup.rows + (setup.prompts_per_step if c.reference_prefixes else 0))
                     * c.prefixes_per_response,
                     table=boundary_table(setup.tokenizer, setup.vocab_size, c.boundary), references=references,
                     ref_lines=ref_lines, tokenizer=setup.tokenizer, ops=jitted(shardings))
        replay = empty(c.capacity, max_prefix)
        if shardings is not None:
            replay = hosts.put_tree(replay, shardings)
        p = setup.num_items
        state = RRLState(replay=replay, fresh_solved=jnp.zeros((p,), jnp.float32),
                         fresh_count=jnp.zeros((p,), jnp.float32), last_success=jnp.full((p,), -1.0, jnp.float32),
                         first_solved=jnp.zeros((p,), jnp.int32), run=run)
        footprint = Footprint(extra_contexts=k_max, prefix_tokens=max_prefix,
                              min_group_size=min_group_size(c.continuations, setup.rows, setup.prompts_per_step, k_max))
        return state, footprint

    # -- before sampling ----------------------------------------------------------------------------
    def plan(self, state: RRLState, plan: RowPlan, info: StepInfo) -> RowPlan:
        c, run = self.cfg, state.run
        if info.step <= c.warmup_steps or run.k_max == 0:
            return plan
        unsolved = _unsolved_share(state, info, c.unsolved_below)
        k = min(run.k_max, int(c.replay_ratio * unsolved * plan.rows) // c.continuations)
        slots, valid = run.ops.sample(state.replay, jax.random.fold_in(info.key, 0), k=run.k_max, c_ucb=c.c_ucb,
                                       temperature=c.priority_temperature, now=info.step - 1,
                                       age_penalty=c.age_penalty, rule=c.priority)
        slots = np.asarray(slots)[:k][np.asarray(valid)[:k]]  # the k best draws (top-k order), occupied ones
        fresh = np.flatnonzero(plan.fresh)
        freed = fresh[free_slots(plan.group[fresh], len(slots) * c.continuations)]
        slots = slots[:len(freed) // c.continuations]
        k = len(slots)
        if k == 0:
            return plan
        freed = freed[:k * c.continuations]
        r = state.replay
        # gathers and keys at the most states a step can draw, cut on the host: one program whatever k
        at = np.zeros(run.k_max, np.int32)
        at[:k] = slots
        length, tokens, drawn_prompt = (to_host(x[at])[:k] for x in (r.length, r.tokens, r.prompt))
        n = k * c.continuations
        first_group = int(plan.group.max()) + 1
        state_of_row = np.repeat(np.arange(k), c.continuations)
        replay_plan = RowPlan(prompt=drawn_prompt[state_of_row].astype(plan.prompt.dtype),
                              group=(first_group + state_of_row).astype(plan.group.dtype),
                              temperature=plan.temperature[freed].copy(),
                              prefix=tuple(tuple(int(t) for t in tokens[j, :length[j]]) for j in state_of_row),
                              replayed=np.ones(n, bool), hindsight=np.zeros(n, bool),
                              row_keys=np.asarray(row_key_data(jax.random.fold_in(info.key, 1),
                                                               run.k_max * c.continuations))[:n],
                              # observe reads the drawn states back from the rows, in draw order (group order)
                              replay_slot=slots[state_of_row].astype(np.int32))
        keep = np.setdiff1d(np.arange(plan.rows), freed)
        return RowPlan.concat([plan.take(keep), replay_plan])

    # -- after the update ---------------------------------------------------------------------------
    def _candidates(self, run: RRLRun, rollouts: Rollouts, unsolved_P: np.ndarray, batch_unsolved: np.ndarray):
        """Padded insert arguments: cuts of the responses of unsolved prompts (and their references)."""
        c, plan, out = self.cfg, rollouts.plan, rollouts.out
        k, t = run.num_candidates, run.max_prefix
        tokens = np.zeros((k, t), np.int32)
        length, prompt = np.zeros(k, np.int32), np.zeros(k, np.int32)
        prior, valid = np.zeros(k, np.float32), np.zeros(k, bool)
        j = 0
        # prior=steps under the uncertainty rule: only right-so-far prefixes. A prefix with a wrong line (prior 0)
        # would score as uncertain as any unvisited state, yet its continuations almost surely all fail
        skip_wrong = c.prior == "steps" and c.priority == "uncertainty"

        def add(item, response, p):
            nonlocal j
            cuts = cut_lengths(response, run.table, c.boundary, c.every_tokens, t)
            priors = np.array([p if c.prior == "response" else run.step_prior(item, response[:cut]) for cut in cuts],
                              np.float32)
            for i in keep_best(cuts, priors, c.prefixes_per_response):
                if skip_wrong and priors[i] <= 0.0:
                    continue
                cut = cuts[i]
                tokens[j, :cut] = response[:cut]
                length[j], prompt[j], valid[j], prior[j] = cut, item, True, priors[i]
                j += 1

        stop = out.context_len + out.num_generated
        for i in range(plan.rows):
            if plan.hindsight[i] or not unsolved_P[plan.prompt[i]]:
                continue
            end = int(stop[i]) - (1 if out.finish_reason[i] == FINISH_STOP and out.num_generated[i] > 0 else 0)
            add(int(plan.prompt[i]), out.tokens[i, int(out.prompt_len[i]):end], float(rollouts.success[i]))
        for item in batch_unsolved if run.references else ():
            if len(run.references[item]):
                add(int(item), run.references[item], 1.0)
        return tokens, length, prompt, prior, valid

    def observe(self, state: RRLState, rollouts: Rollouts, info: StepInfo) -> tuple[RRLState, dict]:
        c, run, plan = self.cfg, state.run, rollouts.plan
        p = run.num_items
        unsolved_share = _unsolved_share(state, info, c.unsolved_below)  # as plan() saw it: the state is the same
        cont = plan.replayed
        # the states plan() drew: one group each, numbered in draw order
        from_plan = cont & (plan.replay_slot >= 0)
        groups, first_row = np.unique(plan.group[from_plan], return_index=True)
        drawn = plan.replay_slot[from_plan][first_row]
        ok = rollouts.correct
        fresh = plan.fresh
        step_solved = np.bincount(plan.prompt[fresh], weights=ok[fresh], minlength=p)
        step_count = np.bincount(plan.prompt[fresh], minlength=p).astype(np.float64)
        seen = step_count > 0
        last = to_host(state.last_success).copy()
        last[seen] = step_solved[seen] / step_count[seen]
        fresh_solved = to_host(state.fresh_solved) + step_solved
        fresh_count = to_host(state.fresh_count) + step_count
        first = to_host(state.first_solved).copy()
        by_fresh = np.bincount(plan.prompt, weights=ok & fresh, minlength=p) > 0
        by_replay = np.bincount(plan.prompt, weights=ok & plan.replayed, minlength=p) > 0
        first[(first == NEVER) & by_fresh] = BY_FRESH
        first[(first == NEVER) & by_replay] = BY_REPLAY

        replay, metrics = state.replay, {}
        k = len(groups)
        if k:
            drawn_value = to_host(replay_value(replay))[drawn]  # before the donating updates below
            sums, counts = np.zeros(run.k_max, np.float32), np.zeros(run.k_max, np.float32)
            # also: replay groups on prompts whose latest fresh group was all wrong (GRPO's gradient there is
            # exactly zero), and how many of those are mixed (their continuations' rewards differ: a gradient)
            on_wrong = mixed = 0
            for j, g in enumerate(groups):
                rows = plan.group == g
                sums[j], counts[j] = rollouts.success[rows].sum(), rows.sum()
                if last[plan.prompt[rows][0]] == 0.0:
                    on_wrong += 1
                    mixed += int(np.ptp(rollouts.scored[rows]) > 1e-6)
            slots = np.zeros(run.k_max, np.int32)
            slots[:k] = drawn
            valid = np.arange(run.k_max) < k
            replay = run.ops.update_values(replay, jnp.asarray(slots), jnp.asarray(sums), jnp.asarray(counts),
                                            jnp.asarray(valid))
            replay, bt = run.ops.backtrack(replay, jnp.asarray(slots), jnp.asarray(valid), float(c.min_visits),
                                            float(c.backtrack_margin))
            same = fresh_count[plan.prompt[cont]] > 0
            metrics.update({
                "rrl_replay_groups_all_wrong_prompts": on_wrong, "rrl_replay_mixed_all_wrong_prompts": mixed,
                "rrl_replay_value": float(np.mean(drawn_value)), "rrl_demoted": int(to_host(bt["demoted"])),
                "rrl_continuation_success": float(ok[cont].mean()),
                "rrl_fresh_success_same_prompts": float(np.mean(fresh_solved[plan.prompt[cont]][same]
                                                               / fresh_count[plan.prompt[cont]][same]))
                if same.any() else float("nan")})
        drops_before = int(to_host(replay.drops))
        now_solved = seen & (last >= c.unsolved_below)
        replay = run.ops.drop_prompts(replay, jnp.asarray(now_solved))
        if c.max_age:
            # the next draw (step + 1) has now = step: keep versions whose age there is at most max_age
            replay = run.ops.drop_older(replay, jnp.int32(info.step - c.max_age))
        unsolved_P = last < c.unsolved_below  # never-sampled prompts only appear here through replay
        batch = np.asarray(info.prompt_ids)
        cand = self._candidates(run, rollouts, unsolved_P, batch[seen[batch] & unsolved_P[batch]])
        replay, ins = run.ops.insert(replay, *map(jnp.asarray, cand), jnp.int32(info.step), jnp.int32(info.step - 1),
                                      jnp.float32(c.c_ucb), rule=c.priority)
        new = RRLState(replay=replay, fresh_solved=jnp.asarray(fresh_solved, jnp.float32),
                       fresh_count=jnp.asarray(fresh_count, jnp.float32), last_success=jnp.asarray(last, jnp.float32),
                       first_solved=jnp.asarray(first, jnp.int32), run=run)
        metrics.update({
            "rrl_fill": int((to_host(replay.length) > 0).sum()), "rrl_candidates": int(cand[4].sum()),
            "rrl_inserted": int(ins["inserted"]), "rrl_evicted": int(ins["evicted"]),
            "rrl_duplicates": int(ins["duplicates"]), "rrl_dropped": int(to_host(replay.drops)) - drops_before,
            "rrl_replayed_states": int(k), "rrl_replay_rows": int(cont.sum()),
            "rrl_unsolved_share": unsolved_share,
            "rrl_solved_first_via_replay": int((first == BY_REPLAY).sum()),
            "rrl_prompts_solved": int((first != NEVER).sum())})
        return new, metrics
