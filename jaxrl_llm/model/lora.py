"""Low-rank adapters (LoRA) on a frozen base: y = x W + (alpha / rank) (x A) B for the projections named in
`targets`, A [in..., r] and B [r, out...] shaped so that A B has W's shape.

The adapters are `nnx.LoRAParam` variables on the module that owns W (`q_lora_a`, `q_lora_b`, ...), so one
parameter state holds base and adapters and everything that runs the model (the sampler, the update, the
evaluation, the judge) runs base + adapters with no merged copy. What trains is decided by the state alone:
when it holds adapters, only they get gradients, optimizer state and checkpoints (`trainable`, `frozen`).
Initialised as PEFT does (A uniform in +-1/sqrt(fan in), B zero), so a fresh adapter leaves the base's
outputs unchanged. Adapters are float32 whatever the base's dtype.

Why not qwix (the LoRA library tunix uses): it clones the model and runs it once on concrete inputs,
intercepting every einsum / dot_general of the matched modules and creating the adapters on the fly. This
project builds its graph abstract first (the memory plan runs before any weight is allocated, and the
initialiser is jitted into the sharded layout), shards every parameter by the logical-axis rule table
(parallel/rules.py) rather than by a concrete array's layout, and runs its own attention kernels inside the
same modules; a clone of a 7B base at set-up would also double its memory. Fifty lines of nnx do the job.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxrl_llm.config.sections import LORA_TARGETS

# target name (the Hugging Face / PEFT module name) -> (sub-module of a decoder layer, our weight's name, logical
# axes of the weight's input dims, of its output dims)
TARGETS = {
    "q_proj": ("attn", "q", ("embed",), ("heads", "head_dim")),
    "k_proj": ("attn", "k", ("embed",), ("kv_heads", "head_dim")),
    "v_proj": ("attn", "v", ("embed",), ("kv_heads", "head_dim")),
    "o_proj": ("attn", "o", ("heads", "head_dim"), ("embed",)),
    "gate_proj": ("mlp", "gate", ("embed",), ("mlp",)),
    "up_proj": ("mlp", "up", ("embed",), ("mlp",)),
    "down_proj": ("mlp", "down", ("mlp",), ("embed",)),
}
HF_MODULE = {"attn": "self_attn", "mlp": "mlp"}
_NAME_IDS = {name: i for i, (_, name, _, _) in enumerate(TARGETS.values())}  # our weight name -> dropout stream
assert tuple(TARGETS) == LORA_TARGETS


@dataclasses.dataclass(frozen=True)
class LoraSpec:
    rank: int
    alpha: float
    targets: tuple[str, ...]
    dropout: float = 0.0  # on the adapters' input, in a forward given a dropout key (the update's) only

    @classmethod
    def from_config(cls, section) -> "LoraSpec | None":
        """The spec of a config's model.lora section (None when rank is 0: full fine-tuning)."""
        return (cls(section.rank, float(section.alpha), tuple(section.targets), float(section.dropout))
                if section.rank else None)

    @property
    def scale(self) -> float:
        return self.alpha / self.rank

    def check(self) -> "LoraSpec":
        unknown = [t for t in self.targets if t not in TARGETS]
        if unknown or not self.targets:
            raise ValueError(f"model.lora.targets {list(self.targets)}: expected a non-empty list from "
                             f"{', '.join(TARGETS)}" + (f" (unknown: {', '.join(unknown)})" if unknown else ""))
        if self.rank < 1 or self.alpha <= 0:
            raise ValueError(f"model.lora: rank ({self.rank}) must be >= 1 and alpha ({self.alpha}) > 0")
        if not 0 <= self.dropout < 1:
            raise ValueError(f"model.lora.dropout ({self.dropout}) must be in [0, 1)")
        return self


def add_adapters(model, spec: LoraSpec, seed: int = 0):
    """Give `model` (a Transformer, concrete or under nnx.eval_shape) fresh adapters on spec.targets, in place;
    returns it. The new variables carry logical axes (A: W's input axes + `lora`, B: `lora` + W's output axes),
    so parallel/rules.py lays them out like every other parameter."""
    spec.check()
    key = jax.random.key(seed)
    for i, layer in enumerate(model.layers):
        for j, target in enumerate(spec.targets):
            sub, name, in_axes, out_axes = TARGETS[target]
            module = getattr(layer, sub)
            w = getattr(module, name)[...]
            n_in = len(in_axes)
            a_shape, b_shape = (*w.shape[:n_in], spec.rank), (spec.rank, *w.shape[n_in:])
            bound = 1.0 / np.sqrt(np.prod(w.shape[:n_in]))
            a = jax.random.uniform(jax.random.fold_in(key, i * len(TARGETS) + j), a_shape, jnp.float32, -bound, bound)
            setattr(module, f"{name}_lora_a", nnx.LoRAParam(a, logical_axes=(*in_axes, "lora")))
            setattr(module, f"{name}_lora_b", nnx.LoRAParam(jnp.zeros(b_shape, jnp.float32),
                                                            logical_axes=("lora", *out_axes)))
            module.lora_scale = spec.scale
            module.lora_dropout = spec.dropout
    return model


def add(module, name: str, x, y, dropout_key=None):
    """y (= x W for `module`'s weight `name`) plus the adapter's term when the module has one. With a
    `dropout_key` (raw uint32 key data; the update's forward passes one, nothing else does) and a dropout rate,
    the adapter sees x with each element zeroed with that probability and the rest scaled by 1 / (1 - rate),
    PEFT's lora_dropout; the mask differs per projection (the key folded with the weight's name)."""
    a = getattr(module, f"{name}_lora_a", None)
    if a is None:
        return y
    rate = getattr(module, "lora_dropout", 0.0)
    if dropout_key is not None and rate > 0:
        key = jax.random.fold_in(jax.random.wrap_key_data(dropout_key), _NAME_IDS[name])
        keep = jax.random.bernoulli(key, 1.0 - rate, x.shape)
        x = jnp.where(keep, x / (1.0 - rate), jnp.zeros((), x.dtype)).astype(x.dtype)
    a, b = a[...].astype(x.dtype), getattr(module, f"{name}_lora_b")[...].astype(x.dtype)
    xa = jnp.tensordot(x, a, axes=a.ndim - 1)
    return y + (module.lora_scale * jnp.tensordot(xa, b, axes=1)).astype(y.dtype)


def adapter_state(params) -> nnx.State:
    return nnx.filter_state(params, nnx.LoRAParam)


def has_adapters(params) -> bool:
    return isinstance(params, nnx.State) and bool(jax.tree.leaves(adapter_state(params)))


def trainable(params):
    """What an update changes: the adapters when `params` holds any, else all of it."""
    return adapter_state(params) if has_adapters(params) else params


def frozen(params):
    """The frozen base of a state with adapters (None without adapters)."""
    return nnx.filter_state(params, nnx.Not(nnx.LoRAParam)) if has_adapters(params) else None


def combine(trainable_part, frozen_part):
    """The whole state from `trainable` and `frozen` parts (the trainable part alone when nothing is frozen)."""
    return trainable_part if frozen_part is None else nnx.merge_state(frozen_part, trainable_part)


def spec_of(model) -> LoraSpec | None:
    """The LoRA spec a model's adapters were made with (None without adapters)."""
    layer = model.layers[0]
    targets = tuple(t for t, (sub, name, _, _) in TARGETS.items() if hasattr(getattr(layer, sub), f"{name}_lora_a"))
    if not targets:
        return None
    sub, name = TARGETS[targets[0]][:2]
    module = getattr(layer, sub)
    rank = getattr(module, f"{name}_lora_a").shape[-1]
    return LoraSpec(rank, float(module.lora_scale * rank), targets, float(getattr(module, "lora_dropout", 0.0)))


def adapted(model):
    """(layer index, target, module, weight name) of every adapted projection."""
    spec = spec_of(model)
    for i, layer in enumerate(model.layers):
        for target in (spec.targets if spec else ()):
            sub, name = TARGETS[target][:2]
            yield i, target, getattr(layer, sub), name


def _host(module, name: str) -> np.ndarray:
    return np.asarray(jax.device_get(getattr(module, name)[...]), np.float32)


def merged_weight(module, name: str) -> np.ndarray:
    """W + scale A B of one adapted projection, in float32 (host memory)."""
    a, b = _host(module, f"{name}_lora_a"), _host(module, f"{name}_lora_b")
    return _host(module, name) + module.lora_scale * np.tensordot(a, b, axes=1)


def merged_weights(model) -> dict:
    """{(layer, sub-module, weight name): merged float32 weight} for every adapted projection of `model`."""
    return {(i, TARGETS[t][0], name): merged_weight(module, name) for i, t, module, name in adapted(model)}


def save_peft_adapter(model, folder: str | Path, base_model: str = "") -> Path:
    """The adapters alone in PEFT's layout: adapter_config.json + adapter_model.safetensors, keys
    `base_model.model.model.layers.{i}.{self_attn|mlp}.{target}.lora_{A|B}.weight`, A as [r, in] and B as
    [out, r] (torch Linear layout), float32. `peft.PeftModel.from_pretrained(<transformers base>, folder)` loads it."""
    from safetensors.numpy import save_file

    spec = spec_of(model)
    if spec is None:
        raise ValueError("this policy has no LoRA adapters to save (model.lora.rank is 0)")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for i, target, module, name in adapted(model):
        prefix = f"base_model.model.model.layers.{i}.{HF_MODULE[TARGETS[target][0]]}.{target}"
        a, b = _host(module, f"{name}_lora_a"), _host(module, f"{name}_lora_b")
        tensors[f"{prefix}.lora_A.weight"] = np.ascontiguousarray(a.reshape(-1, spec.rank).T)
        tensors[f"{prefix}.lora_B.weight"] = np.ascontiguousarray(b.reshape(spec.rank, -1).T)
    save_file(tensors, str(folder / "adapter_model.safetensors"), metadata={"format": "pt"})
    config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": spec.rank, "lora_alpha": spec.alpha,
              "target_modules": list(spec.targets), "lora_dropout": spec.dropout, "bias": "none",
              "fan_in_fan_out": False,
              "init_lora_weights": True, "use_rslora": False, "use_dora": False, "inference_mode": True,
              "modules_to_save": None, "base_model_name_or_path": base_model}
    (folder / "adapter_config.json").write_text(json.dumps(config, indent=2))
    return folder
