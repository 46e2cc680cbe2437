"""The training update on random weights, allocated, and one timed call of it: what the update benchmarks time
(tools/bench_long_update.py, tools/bench_explorer_layout.py). An update's cost does not depend on the weights'
values."""

from __future__ import annotations

import gc
import time
from pathlib import Path

from jaxrl_llm.config import Config


def random_update(cfg: Config, model_cfg, mesh):
    """(update, parameters, optimizer state) of a run of `cfg` on `mesh` with random weights."""
    from flax import nnx

    from jaxrl_llm.model.lora import LoraSpec
    from jaxrl_llm.model.transformer import new_model
    from jaxrl_llm.parallel.rules import shard_state
    from jaxrl_llm.rl.spec import rl_optimizer, update_spec
    from jaxrl_llm.rl.update import init_optimizer, make_update
    from jaxrl_llm.train.policy import with_options

    graphdef, state = nnx.split(new_model(model_cfg, 0, LoraSpec.from_config(cfg.model.lora)))
    params = shard_state(state, mesh)
    graphdef = with_options(graphdef, params, cfg)
    optimizer = rl_optimizer(cfg)
    opt_state = init_optimizer(optimizer, params, mesh)
    return make_update(graphdef, update_spec(cfg), optimizer, params, opt_state, mesh), params, opt_state


def _rss(key: str) -> int:
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024
    return 0


def timed_call(update, params, opt_state, batch, coefs) -> tuple[float, int]:
    """(wall seconds, RSS growth in bytes) of one call of `update` on fresh copies of params / opt_state (Linux:
    peak RSS reset through /proc/self/clear_refs; 0 elsewhere)."""
    import jax
    import jax.numpy as jnp

    args = jax.tree.map(jnp.copy, (params, opt_state))
    jax.block_until_ready(args)
    gc.collect()
    before = _rss("VmRSS")
    if Path("/proc/self/clear_refs").exists():
        open("/proc/self/clear_refs", "w").write("5")
    t0 = time.perf_counter()
    jax.block_until_ready(update(*args, batch, coefs))
    return time.perf_counter() - t0, _rss("VmHWM") - before
