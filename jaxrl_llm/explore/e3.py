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

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxrl_llm.config import E3Section
from jaxrl_llm.explore.base import Explorer, Setup, StepInfo
from jaxrl_llm.explore.budget import allocate, bounds, difficulty_ranks
from jaxrl_llm.explore.rows import RowPlan, Rollouts
from jaxrl_llm.explore.temperature import annealed_target, entropy_constant, next_temperature, row_temperatures
from jaxrl_llm.parallel.hosts import to_host

QUINTILES = 5


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


class E3(Explorer):
    name = "e3"

    def __init__(self, cfg: E3Section):
        self.cfg = cfg

    def min_group_size(self) -> int | None:
        return self.cfg.n_low if self.cfg.budget else None

    # -- state --------------------------------------------------------------------------------------
    def init(self, setup: Setup) -> E3State:
        c = self.cfg
        self.setup = setup
        self.rank_every = c.rank_every or setup.steps_per_epoch
        diff = setup.item_difficulty
        self.seed_rank = None  # items without a data-set difficulty rank as unseen: hardest
        if c.data_rank and diff is not None and np.isfinite(diff).any():
            self.seed_rank = jnp.asarray(np.where(np.isfinite(diff), diff, 1.0), jnp.float32)
        p = setup.num_items
        zeros = jnp.zeros((p,), jnp.float32)
        n = setup.group_size
        self._allocate = jax.jit(functools.partial(allocate, total=setup.rows))
        self._observe = jax.jit(self._observe_fn)
        return E3State(reward_sum=zeros, count=zeros, rank=difficulty_ranks(zeros, zeros, self.seed_rank),
                       n_min=jnp.int32(n), n_max=jnp.int32(n), temperature=jnp.float32(setup.temperature),
                       initial_target=jnp.float32(c.target_entropy), entropy=jnp.float32(0.0))

    # -- before sampling ----------------------------------------------------------------------------
    def plan(self, state: E3State, plan: RowPlan, info: StepInfo) -> RowPlan:
        c, setup = self.cfg, self.setup
        rank_b = state.rank[jnp.asarray(info.prompt_ids)]
        if c.budget:
            sizes = np.asarray(self._allocate(rank_b, state.n_min, state.n_max))
        else:
            sizes = np.full(len(info.prompt_ids), setup.group_size)
        temp = state.temperature if c.temperature else jnp.float32(setup.temperature)
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
    def _observe_fn(self, state: E3State, item_N, reward_N, fresh_N, entropy, step):
        c, setup = self.cfg, self.setup
        w = fresh_N.astype(jnp.float32)
        reward_sum = state.reward_sum.at[item_N].add(reward_N * w)
        count = state.count.at[item_N].add(w)
        rank = jnp.where(step % self.rank_every == 0, difficulty_ranks(reward_sum, count, self.seed_rank), state.rank)
        n_min, n_max = bounds(step // setup.steps_per_epoch, setup.group_size, c.delta, c.n_low, c.n_high)
        initial = jnp.where(state.initial_target > 0, state.initial_target, entropy)
        target = annealed_target(initial, step, setup.total_steps, c.anneal_ratio, c.anneal_factor) if c.anneal \
            else initial
        temperature = state.temperature
        if c.temperature:
            k = entropy_constant(setup.vocab_size)
            temperature = next_temperature(state.temperature, target, entropy, k, c.t_min, c.t_max)
        new = E3State(reward_sum=reward_sum, count=count, rank=rank, n_min=n_min, n_max=n_max,
                      temperature=jnp.asarray(temperature, jnp.float32), initial_target=initial,
                      entropy=jnp.asarray(entropy, jnp.float32))
        return new, target

    def observe(self, state: E3State, rollouts: Rollouts, info: StepInfo) -> tuple[E3State, dict]:
        plan, out = rollouts.plan, rollouts.out
        fresh = ~plan.replayed & ~plan.hindsight
        mask = out.response_mask & fresh[:, None]
        entropy = float(out.entropy[mask].mean()) if mask.any() else float(state.entropy)
        item = plan.prompt
        rank = to_host(state.rank)  # the ranks this step was planned with
        rank_rows = rank[item]
        # success as scored (not the rewards as another explorer adjusted them) feeds the difficulty tracker
        new, target = self._observe(state, jnp.asarray(item, jnp.int32), jnp.asarray(rollouts.success, jnp.float32),
                                    jnp.asarray(fresh), jnp.float32(entropy), jnp.int32(info.step))
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
