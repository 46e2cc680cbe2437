"""The update program of a run of a config, abstract: its model, state and batch as ShapeDtypeStructs with
the trainer's shardings (nothing allocated), compiled (never run) through the trainer's own update
(rl/update.py make_update), for XLA's memory analysis."""

from __future__ import annotations

import dataclasses
import hashlib

from jaxrl_llm.config import Config

# Built-in model shapes, for configs whose model folder is not on this machine (no weights needed).
_QWEN2 = dict(architecture="qwen2", attention_bias=True, tie_embeddings=True, rope_theta=1e6, rms_norm_eps=1e-6,
              max_position_embeddings=32768, vocab_size=151936, num_kv_heads=2)
MODEL_SHAPES = {
    "qwen2.5-0.5b": dict(_QWEN2, hidden_size=896, intermediate_size=4864, num_layers=24, num_heads=14, head_dim=64),
    "qwen2.5-1.5b": dict(_QWEN2, hidden_size=1536, intermediate_size=8960, num_layers=28, num_heads=12,
                         head_dim=128),
    "qwen2.5-7b": dict(_QWEN2, hidden_size=3584, intermediate_size=18944, num_layers=28, num_heads=28,
                       num_kv_heads=4, head_dim=128, vocab_size=152064, tie_embeddings=False),
}


def model_config(cfg: Config, model_shape: str | None = None):
    """The ModelConfig a run of `cfg` would build: the config's HF folder when it is here (or its scratch
    model), else the built-in shape `model_shape`."""
    from jaxrl_llm.model.config import ModelConfig

    if cfg.model.name == "scratch":
        from jaxrl_llm.model.char_tokenizer import char_tokenizer

        tok = char_tokenizer()  # as train/policy.py build_policy
        return ModelConfig.from_scratch(cfg.model.scratch, vocab_size=len(tok), param_dtype=cfg.model.param_dtype,
                                        eos_token_ids=(tok.eos_token_id,))
    from jaxrl_llm.model.registry import resolve

    try:
        folder = resolve(cfg.model.name, auto_prepare=False)
    except (ValueError, FileNotFoundError) as e:
        if model_shape is None:
            raise ValueError(f"{e}; pass --model-shape with one of {', '.join(MODEL_SHAPES)}") from None
    else:
        return ModelConfig.from_hf_folder(folder, param_dtype=cfg.model.param_dtype)
    if model_shape not in MODEL_SHAPES:
        raise ValueError(f"unknown model shape {model_shape!r}; known: {', '.join(MODEL_SHAPES)}")
    return ModelConfig(**MODEL_SHAPES[model_shape], param_dtype=cfg.model.param_dtype)


def abstract_state(cfg: Config, model_cfg, mesh):
    """(graphdef, parameters, optimizer, optimizer state) of a run of `cfg` on `mesh` as ShapeDtypeStructs with
    the trainer's shardings (parameters by parallel/rules.py, Adam's moments like them): nothing allocated."""
    import jax
    from flax import nnx

    from jaxrl_llm.model.transformer import abstract_model
    from jaxrl_llm.parallel.rules import sharding_tree
    from jaxrl_llm.rl.spec import rl_optimizer
    from jaxrl_llm.rl.update import abstract_optimizer_state

    from jaxrl_llm.model.lora import LoraSpec

    model = abstract_model(model_cfg, LoraSpec.from_config(cfg.model.lora))
    model.remat, model.attention_block = cfg.model.remat, cfg.model.attention_block  # as train/policy.py
    graphdef, state = nnx.split(model)
    params = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), state,
                          sharding_tree(state, mesh))
    optimizer = rl_optimizer(cfg)
    return graphdef, params, optimizer, abstract_optimizer_state(optimizer, params, mesh)


def peak_bytes(analysis) -> int:
    """XLA's peak of a compiled program per device: arguments + temporaries + outputs - donated (aliased)."""
    return int(analysis.argument_size_in_bytes + analysis.temp_size_in_bytes + analysis.output_size_in_bytes
               - analysis.alias_size_in_bytes)


@dataclasses.dataclass(frozen=True)
class UpdateAnalysis:
    """XLA's memory analysis of one update program and the batch it was compiled for."""

    memory: object  # jax's CompiledMemoryStats
    micro_batches: int
    rows_per_micro_batch: int
    batch: object  # the update batch (numpy), the worst case of its shapes
    lower_s: float = 0.0
    compile_s: float = 0.0

    @property
    def peak(self) -> int:
        return peak_bytes(self.memory)


_COMPILED: dict = {}  # update programs compiled ahead, by their text (plan() then check() of one config: once)


def analyse_update(update, cfg: Config, params, opt_state, batch, shared: bool | None = None) -> UpdateAnalysis:
    """XLA's memory analysis of `update`'s (rl/update.py make_update) program for batches like `batch`,
    params / opt_state arrays or abstract with their shardings. Compiled ahead through the update itself, so a
    later call of that shape runs this program; a program compiled before (same text) is not compiled again."""
    import time

    from jaxrl_llm.rl.spec import loss_coefs, micro_shape

    t0 = time.perf_counter()
    lowered = update.lower(params, opt_state, batch, loss_coefs(cfg))
    t1 = time.perf_counter()
    import jax

    devices = [d.id for d in jax.tree.leaves(params)[0].sharding.device_set]  # a program runs on its own devices
    key = hashlib.sha256((lowered.as_text() + str(sorted(devices))).encode()).hexdigest()
    _COMPILED[key] = update.compile(lowered, batch, _COMPILED.get(key))
    t2 = time.perf_counter()
    return UpdateAnalysis(_COMPILED[key].memory_analysis(), *micro_shape(cfg, batch, shared), batch, t1 - t0, t2 - t1)


def config_update(cfg: Config, model_cfg, mesh) -> tuple[object, object, object, UpdateAnalysis]:
    """(graphdef, abstract params, abstract optimizer state, analysis) of the update a plain run of `cfg`
    compiles, for its largest minibatch (plan/shapes.py config_shapes)."""
    from jaxrl_llm.plan.shapes import config_shapes
    from jaxrl_llm.rl.spec import update_spec
    from jaxrl_llm.rl.update import make_update

    graphdef, params, optimizer, opt_state = abstract_state(cfg, model_cfg, mesh)
    update = make_update(graphdef, update_spec(cfg), optimizer, params, opt_state, mesh)
    batch = config_shapes(cfg, model_cfg).worst_case_minibatch(cfg)
    return graphdef, params, opt_state, analyse_update(update, cfg, params, opt_state, batch)
