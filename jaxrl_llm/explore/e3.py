"""E3 on the exploration seam (ALGORITHMS.md §1): difficulty-aware rollout budgets and an
entropy-targeting temperature. The math is in explore/budget.py and explore/temperature.py; this
file keeps the state and says when each piece runs.

State (a pytree, checkpointed with the run): per-prompt reward sums and counts over the whole
training set, the current difficulty ranks, the budget bounds, the temperature and the target
entropy. Each step:

    plan     group sizes from the ranks of the step's prompts (total fixed at N = n x B, so the
             batch shape never changes), every row at the controller's temperature (optionally
             offset by its prompt's rank)
    observe  add the step's fresh rows' success to the tracker (Rollouts.success: the reward as scored,
             or with reward functions the [0, 1] value whose full marks are `correct`, so a bonus or a
             penalty in the total never moves a rank); re-rank every `rank_every` steps (0: once
             an epoch); widen the bounds after each epoch; T <- T (1 + T ln(H*/H) / k), clamped,
             with H the mean tempered entropy of the step's generated tokens and H* the entropy
             of step 1 (or `target_entropy`), cosine-annealed over the last steps

Both are one jitted program each, compiled once: nothing recompiles when allocations or
temperatures change.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxrl_llm.config import E3Section
from jaxrl_llm.explore.base import Explorer, Footprint, Setup, StepInfo
from jaxrl_llm.explore.budget import allocate, bounds, difficulty_ranks
from jaxrl_llm.explore.rows import RowPlan, Rollouts
from jaxrl_llm.explore.temperature import annealed_target, entropy_constant, next_temperature, row_temperatures
from jaxrl_llm.parallel.hosts import to_host

QUINTILES = 5


@dataclasses.dataclass(frozen=True)
class E3Run:
    """What E3 takes from the run's Setup: E3State's static field (explore/base.py)."""

    cfg: E3Section
    rows: int  # N, the total every allocation keeps
    group_size: int
    temperature: float  # the configured sampling temperature
    steps_per_epoch: int
    total_steps: int
    vocab_size: int
    rank_every: int  # steps between re-ranks (the config's 0: once an epoch)
    # [P] data-set difficulty ranks of unseen items (None: unseen items rank hardest); an argument of the jitted
    # observe, never read inside it from here
    seed_rank: jax.Array | None = dataclasses.field(default=None, compare=False)


@struct.dataclass
class E3State:
    reward_sum: jax.Array  # [P] over the training prompts, fresh rollouts only: sums of Rollouts.success
    count: jax.Array  # [P]
    rank: jax.Array  # [P] difficulty rank in [0, 1], 1 hardest (as of the last re-rank)
    n_min: jax.Array  # () int32
    n_max: jax.Array  # () int32
    temperature: jax.Array  # () the controller's T for the next step
    initial_target: jax.Array  # () H* before annealing; 0 until measured at step 1
    entropy: jax.Array  # () the last step's measured entropy
    run: E3Run = struct.field(pytree_node=False)


_allocate = jax.jit(allocate, static_argnames="total")


@jax.jit
def _observe(state: E3State, seed_rank, item_N, reward_N, fresh_N, entropy, step):
    """The tracker, ranks, bounds and temperature after a step; the run's sizes come static with the state."""
    run = state.run
    c = run.cfg
    w = fresh_N.astype(jnp.float32)
    reward_sum = state.reward_sum.at[item_N].add(reward_N * w)
    count = state.count.at[item_N].add(w)
    rank = jnp.where(step % run.rank_every == 0, difficulty_ranks(reward_sum, count, seed_rank), state.rank)
    n_min, n_max = bounds(step // run.steps_per_epoch, run.group_size, c.delta, c.n_low, c.n_high)
    initial = jnp.where(state.initial_target > 0, state.initial_target, entropy)
    target = annealed_target(initial, step, run.total_steps, c.anneal_ratio, c.anneal_factor) if c.anneal \
        else initial
    temperature = state.temperature
    if c.temperature:
        k = entropy_constant(run.vocab_size)
        temperature = next_temperature(state.temperature, target, entropy, k, c.t_min, c.t_max)
    new = state.replace(reward_sum=reward_sum, count=count, rank=rank, n_min=n_min, n_max=n_max,
                        temperature=jnp.asarray(temperature, jnp.float32), initial_target=initial,
                        entropy=jnp.asarray(entropy, jnp.float32))
    return new, target


class E3(Explorer):
    name = "e3"

    def __init__(self, cfg: E3Section):
        self.cfg = cfg

    # -- state --------------------------------------------------------------------------------------
    def init(self, setup: Setup) -> tuple[E3State, Footprint]:
        c = self.cfg
        diff = setup.item_difficulty
        seed_rank = None  # items without a data-set difficulty rank as unseen: hardest
        if c.data_rank and diff is not None and np.isfinite(diff).any():
            seed_rank = jnp.asarray(np.where(np.isfinite(diff), diff, 1.0), jnp.float32)
        run = E3Run(cfg=c, rows=setup.rows, group_size=setup.group_size, temperature=setup.temperature,
                    steps_per_epoch=setup.steps_per_epoch, total_steps=setup.total_steps,
                    vocab_size=setup.vocab_size, rank_every=c.rank_every or setup.steps_per_epoch, seed_rank=seed_rank)
        p = setup.num_items
        zeros = jnp.zeros((p,), jnp.float32)
        n = setup.group_size
        state = E3State(reward_sum=zeros, count=zeros, rank=difficulty_ranks(zeros, zeros, seed_rank),
                        n_min=jnp.int32(n), n_max=jnp.int32(n), temperature=jnp.float32(setup.temperature),
                        initial_target=jnp.float32(c.target_entropy), entropy=jnp.float32(0.0), run=run)
        return state, Footprint(min_group_size=c.n_low if c.budget else None)

    # -- before sampling ----------------------------------------------------------------------------
    def plan(self, state: E3State, plan: RowPlan, info: StepInfo) -> RowPlan:
        c, run = self.cfg, state.run
        rank_b = state.rank[jnp.asarray(info.prompt_ids)]
        if c.budget:
            sizes = np.asarray(_allocate(rank_b, state.n_min, state.n_max, total=run.rows))
        else:
            sizes = np.full(len(info.prompt_ids), run.group_size)
        temp = state.temperature if c.temperature else jnp.float32(run.temperature)
        if c.difficulty_temperature:
            per_prompt = np.asarray(row_temperatures(temp, rank_b, c.difficulty_temperature, c.t_min, c.t_max))
        else:
            per_prompt = np.full(len(sizes), float(temp), np.float32)
        group = np.repeat(np.arange(len(sizes)), sizes)
        if len(group) != plan.rows or plan.replayed.any() or plan.hindsight.any() or any(plan.prefix):
            raise ValueError("E3 plans the step's fresh rows and runs first: it expects a plain plan of N rows")
        return RowPlan(prompt=np.asarray(info.prompt_ids)[group], group=group,
                       temperature=per_prompt[group].astype(np.float32), prefix=plan.prefix, replayed=plan.replayed,
                       hindsight=plan.hindsight, row_keys=plan.row_keys)

    # -- after the update ---------------------------------------------------------------------------
    def observe(self, state: E3State, rollouts: Rollouts, info: StepInfo) -> tuple[E3State, dict]:
        plan, out = rollouts.plan, rollouts.out
        fresh = plan.fresh
        mask = out.response_mask & fresh[:, None]
        entropy = float(out.entropy[mask].mean()) if mask.any() else float(state.entropy)
        item = plan.prompt
        rank = to_host(state.rank)  # the ranks this step was planned with
        rank_rows = rank[item]
        # success as scored (not the rewards as another explorer adjusted them) feeds the difficulty tracker
        new, target = _observe(state, state.run.seed_rank, jnp.asarray(item, jnp.int32),
                               jnp.asarray(rollouts.success, jnp.float32), jnp.asarray(fresh), jnp.float32(entropy),
                               jnp.int32(info.step))
        sizes = np.bincount(plan.group[fresh], minlength=len(info.prompt_ids))
        correct = rollouts.correct
        quint = np.minimum((rank_rows * QUINTILES).astype(int), QUINTILES - 1)
        metrics = {"e3_temperature": float(new.temperature), "e3_target_entropy": float(target),
                   "e3_entropy": entropy, "e3_n_min": int(state.n_min), "e3_n_max": int(state.n_max),
                   "e3_group_size_min": int(sizes.min()), "e3_group_size_max": int(sizes.max()),
                   # groups with 0, 1, 2, ... rollouts this step (index = group size)
                   "e3_group_size_hist": np.bincount(sizes, minlength=self.cfg.n_high + 1).tolist(),
                   "e3_prompts_seen": int((to_host(new.count) > 0).sum())}
        quint_b = np.minimum((rank[np.asarray(info.prompt_ids)] * QUINTILES).astype(int), QUINTILES - 1)
        for q in range(QUINTILES):  # quintile 1 easiest
            rows = fresh & (quint == q)
            if rows.any():
                metrics[f"e3_accuracy_q{q + 1}"] = float(correct[rows].mean())
            if (quint_b == q).any():  # the rollouts each of the quintile's prompts got this step
                metrics[f"e3_group_size_q{q + 1}"] = float(sizes[quint_b == q].mean())
        return new, metrics
