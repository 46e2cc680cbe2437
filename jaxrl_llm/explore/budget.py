"""E3 difficulty-aware rollout budget (ALGORITHMS.md §1): difficulty ranks, budget bounds, allocation.

Pure functions. `difficulty_ranks` and `allocate` are jittable; `allocate` keeps the total N static
so the rollout batch never changes shape, while n_min / n_max may be traced.

Deviations from the released E3 code, as ALGORITHMS.md decides:
- n_max is enforced in the proportional step too (clip, then redistribute the excess among the
  unclipped prompts), not only when the rounding remainder is handed out;
- prompts may be ranked from a data-set difficulty before they are seen.

`allocate` computes in int32 on rho quantised to multiples of 1/Q (Q a power of two fixed by
`total` and B, 2**20 for typical sizes) so that the result is exact, identical on every host and
backend, and never off by one where the spec's quotient is an integer.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

_INT32_MAX = 2**31 - 1


def difficulty_ranks(reward_sum_P, count_P, seed_rank_P=None):
    """Rank rho [P] float32 in [0, 1] of every prompt by mean reward (E3 sums Rollouts.success, in [0, 1]
    whatever reward functions add): easiest 0, hardest 1.

    Unseen prompts (count 0) sort as hardest (below every seen one), or, given `seed_rank_P` (a
    data-set rank in [0, 1], 1 hardest), as if their mean reward were 1 - seed_rank (rewards are
    assumed in [0, 1]). Ties share the average of their positions, and rank = position / (P - 1):
    a full tie gives 0.5 to all, which `allocate` turns into n each; P == 1 is a full tie.
    """
    count = count_P.astype(jnp.float32)
    mean = reward_sum_P.astype(jnp.float32) / jnp.maximum(count, 1.0)
    unseen = -jnp.inf if seed_rank_P is None else 1.0 - seed_rank_P.astype(jnp.float32)
    key = -jnp.where(count > 0, mean, unseen)  # ascending key = easiest first
    sorted_key = jnp.sort(key)
    first = jnp.searchsorted(sorted_key, key, side="left")
    last = jnp.searchsorted(sorted_key, key, side="right") - 1
    num = key.shape[0]
    if num == 1:
        return jnp.full((1,), 0.5, jnp.float32)
    return ((first + last).astype(jnp.float32) / (2.0 * (num - 1))).astype(jnp.float32)


def bounds(epoch, n: int, delta: int, n_low: int, n_high: int):
    """(n_min, n_max) int32 after `epoch` completed epochs (may be traced): both n at epoch 0,
    widened by delta each epoch down to n_low and up to n_high."""
    return (jnp.maximum(n - delta * epoch, n_low).astype(jnp.int32),
            jnp.minimum(n + delta * epoch, n_high).astype(jnp.int32))


def budget_bounds(epoch: int, n: int, delta: int, n_low: int, n_high: int) -> tuple[int, int]:
    """`bounds` for concrete arguments, checked, as Python ints."""
    if epoch < 0 or delta < 0 or not n_low <= n <= n_high:
        raise ValueError(f"budget bounds need epoch >= 0, delta >= 0 and n_low <= n <= n_high; got "
                         f"epoch={epoch}, delta={delta}, n_low={n_low}, n={n}, n_high={n_high}")
    n_min, n_max = bounds(epoch, n, delta, n_low, n_high)
    return int(n_min), int(n_max)


def _rho_scale(total: int, batch: int) -> int:
    """Largest power of two Q <= 2**24 with total * B * Q < 2**31 (no int32 product overflows)."""
    q = min(2**24, _INT32_MAX // (total * batch))
    if q < 1:
        raise ValueError(f"allocate: total * B = {total * batch} is too large for int32 arithmetic")
    return 1 << (q.bit_length() - 1)


def allocate(rho_B, n_min, n_max, total: int):
    """Group sizes c [B] int32 summing to `total`, each in [n_min, n_max], non-decreasing in rho.

    c_i = floor(n_min + (total - B n_min) rho_i / sum_j rho_j), where prompts whose share would
    exceed n_max are clipped to n_max and the excess is shared by the others in proportion to rho,
    repeated until none exceeds. The remainder then goes one each to the hardest prompts first
    (decreasing rho, ties by index) that are below n_max, in as many rounds as needed (more than one
    only when every unclipped prompt has rho 0). If sum rho == 0 every prompt gets total // B and
    the first total % B get one more.

    `total` is static; n_min, n_max may be traced. Concrete bounds with B n_min <= total <= B n_max
    violated raise ValueError; traced ones are widened to the nearest feasible pair instead.
    """
    batch = rho_B.shape[0]
    if isinstance(n_min, (int, np.integer)) and isinstance(n_max, (int, np.integer)):
        if not (0 <= n_min <= n_max and batch * n_min <= total <= batch * n_max):
            raise ValueError(f"allocate: need 0 <= n_min <= n_max and B*n_min <= total <= B*n_max; got "
                             f"B={batch}, n_min={n_min}, n_max={n_max}, total={total}")
    scale = _rho_scale(total, batch)
    n_min = jnp.clip(jnp.asarray(n_min, jnp.int32), 0, total // batch)
    n_max = jnp.clip(jnp.asarray(n_max, jnp.int32), -(-total // batch), total)
    rho = jnp.clip(rho_B.astype(jnp.float32), 0.0, 1.0)
    weight = jnp.round(rho * scale).astype(jnp.int32)
    extra = total - batch * n_min
    cap = n_max - n_min

    def clip_step(_, clipped):
        free = ~clipped
        left = extra - cap * jnp.sum(clipped)
        free_weight = jnp.sum(jnp.where(free, weight, 0))
        return clipped | (free & (left * weight > cap * free_weight))

    clipped = jax.lax.fori_loop(0, batch, clip_step, jnp.zeros(batch, bool))
    left = extra - cap * jnp.sum(clipped)
    free_weight = jnp.sum(jnp.where(clipped, 0, weight))
    share = (left * weight) // jnp.maximum(free_weight, 1)
    counts = n_min + jnp.where(clipped, cap, share)

    order = jnp.argsort(rho, descending=True, stable=True)  # hardest first, ties by index

    def give_round(state):
        counts, remainder = state
        room = counts[order] < n_max
        give = room & (jnp.cumsum(room) <= remainder)
        return counts.at[order].add(give.astype(jnp.int32)), remainder - jnp.sum(give)

    counts, _ = jax.lax.while_loop(lambda s: s[1] > 0, give_round, (counts, total - jnp.sum(counts)))
    even = total // batch + (jnp.arange(batch) < total % batch)
    return jnp.where(jnp.sum(weight) > 0, counts, even).astype(jnp.int32)
