"""E3 entropy-targeting temperature controller (ALGORITHMS.md §1): the update, its annealed target,
and optional per-difficulty row temperatures.

Pure jnp functions of jnp arrays or Python scalars, all jittable. Deviations from the released code:
the new temperature is clamped to [t_min, t_max]; entropies are floored at 1e-6 so a collapsed
policy (H = 0) raises T instead of producing inf or nan; per-row offsets by difficulty are new.
"""

from __future__ import annotations

import jax.numpy as jnp

_MIN_ENTROPY = 1e-6


def entropy_constant(vocab_size):
    """k = ln V + ln ln V, the controller's step-size constant (V >= 2)."""
    log_v = jnp.log(jnp.asarray(vocab_size, jnp.float32))
    return log_v + jnp.log(log_v)


def next_temperature(temperature, target, entropy, k, t_min, t_max):
    """T * (1 + T ln(H* / H) / k) clamped to [t_min, t_max]; H* and H are floored at 1e-6."""
    t = jnp.asarray(temperature, jnp.float32)
    ratio = jnp.maximum(target, _MIN_ENTROPY) / jnp.maximum(entropy, _MIN_ENTROPY)
    return jnp.clip(t * (1.0 + t * jnp.log(ratio) / k), t_min, t_max)


def annealed_target(initial, step, total_steps, anneal_ratio, anneal_factor):
    """Entropy target at 1-based `step` of `total_steps`.

    1.0 x `initial` up to step (1 - anneal_ratio) * total_steps, then a cosine from 1.0 x to
    `anneal_factor` x, reached exactly at step == total_steps (and kept after it). anneal_ratio 0
    disables annealing.
    """
    step = jnp.asarray(step, jnp.float32)
    window = jnp.asarray(anneal_ratio, jnp.float32) * total_steps
    progress = jnp.clip((step - (total_steps - window)) / jnp.maximum(window, 1e-9), 0.0, 1.0)
    scale = anneal_factor + (1.0 - anneal_factor) * 0.5 * (1.0 + jnp.cos(jnp.pi * progress))
    scale = jnp.where((window > 0) & (step >= total_steps), anneal_factor, scale)
    return initial * scale


def row_temperatures(temperature, rho_B, offset, t_min, t_max):
    """Per-row temperatures [B] float32: T * (1 + offset * (rho - 0.5)) clamped to [t_min, t_max].

    A positive offset samples harder prompts (rho > 0.5) hotter and easier ones cooler; offset 0
    gives T on every row (T itself already within the clamp).
    """
    rho = jnp.asarray(rho_B, jnp.float32)
    return jnp.clip(temperature * (1.0 + offset * (rho - 0.5)), t_min, t_max).astype(jnp.float32)
