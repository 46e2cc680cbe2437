"""The training update on random weights, allocated: what the update benchmarks time (tools/bench_long_update.py,
tools/bench_explorer_layout.py). An update's cost does not depend on the weights' values."""

from __future__ import annotations

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
