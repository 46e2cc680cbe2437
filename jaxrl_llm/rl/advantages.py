"""Group-relative advantage estimators over variable-size groups (ALGORITHMS.md §0).

Rows carry a group id; groups of any size share one static batch, and every statistic is a
segment sum over group ids (no Python loop over groups). Rows with valid == False (batch padding)
belong to no group and get advantage 0.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxrl_llm.config.choices import ADVANTAGE_ESTIMATORS as ESTIMATORS


def group_advantages(rewards_N, group_N, valid_N, *, estimator: str, num_groups: int | None = None):
    """Advantages [N] (float32) of rewards [N] within the groups given by group ids [N]."""
    if estimator not in ESTIMATORS:
        raise ValueError(f"unknown advantage estimator {estimator!r}; choose from {ESTIMATORS}")
    num_groups = num_groups or rewards_N.shape[0]
    r = rewards_N.astype(jnp.float32)
    w = valid_N.astype(jnp.float32)
    seg = lambda x: jax.ops.segment_sum(x, group_N, num_segments=num_groups)  # noqa: E731
    count = seg(w)[group_N]
    total = seg(r * w)[group_N]
    mean = total / jnp.maximum(count, 1.0)
    if estimator == "drgrpo":
        adv = r - mean
    elif estimator == "rloo":
        adv = jnp.where(count > 1, r - (total - r) / jnp.maximum(count - 1.0, 1.0), 0.0)
    else:  # grpo, unbiased std; a group of one has no spread and gets 0
        var = seg(jnp.square(r - mean) * w)[group_N] / jnp.maximum(count - 1.0, 1.0)
        adv = jnp.where(count > 1, (r - mean) / (jnp.sqrt(var) + 1e-6), 0.0)
    return jnp.where(valid_N, adv, 0.0)
