"""Model configuration: one frozen dataclass for the Llama / Qwen2 / Qwen3 / Mistral decoder family.

Built from (and exported back to) a Hugging Face `config.json`, so a local HF folder is all a
run needs to describe its model. Every switch of those configs that changes the computation is
either honoured here or refused by name: a model must never load silently as a different one.
"""

from __future__ import annotations

import dataclasses
import json
import warnings
from pathlib import Path
from typing import Any

SUPPORTED_ARCHITECTURES = ("llama", "qwen2", "qwen3", "mistral")

_HF_CLASS = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
             "mistral": "MistralForCausalLM"}

# rope_type -> the keys it needs; "default" (plain RoPE) is stored as rope_scaling=None
_ROPE_KEYS = {"llama3": ("factor", "high_freq_factor", "low_freq_factor", "original_max_position_embeddings")}

# keys transformers' class for the architecture does not read although they look meaningful: we ignore
# them as it does, but say so
_IGNORED_BY_TRANSFORMERS = {
    "llama": ("sliding_window", "use_sliding_window", "layer_types"),
    "mistral": ("use_sliding_window", "max_window_layers", "layer_types", "attention_bias"),
    "qwen2": ("attention_bias",),
    "qwen3": (),
}


class UnsupportedModelError(ValueError):
    """A checkpoint or config describes a model this package cannot run."""


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    architecture: str = "llama"
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    tie_embeddings: bool = False
    # biases on the q, k, v projections (Qwen2 always; Llama / Qwen3 `attention_bias`, which also
    # puts one on o: see `out_bias`)
    attention_bias: bool = False
    sliding_window: int | None = None  # attend to at most this many previous positions ...
    sliding_layers: tuple[int, ...] | None = None  # ... in these layers (None: every layer, as Mistral)
    max_position_embeddings: int = 2048
    param_dtype: str = "float32"
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    # RoPE frequency scaling as sorted (key, value) pairs with a "rope_type" entry, or None for plain
    # RoPE; a tuple, not a dict, because the config sits in jit's static graphdef and must hash
    rope_scaling: tuple[tuple[str, Any], ...] | None = None

    def __post_init__(self):
        if self.architecture not in SUPPORTED_ARCHITECTURES:
            raise UnsupportedModelError(
                f"unsupported architecture {self.architecture!r}; supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}")
        if self.param_dtype not in ("float32", "bfloat16"):
            raise ValueError(f"param_dtype must be float32 or bfloat16, got {self.param_dtype!r}")
        if self.architecture == "mistral" and self.attention_bias:
            raise UnsupportedModelError("transformers' Mistral has no attention biases; attention_bias must be False")
        if self.sliding_layers is not None:
            object.__setattr__(self, "sliding_layers", tuple(sorted({int(i) for i in self.sliding_layers})))
            if any(not 0 <= i < self.num_layers for i in self.sliding_layers):
                raise ValueError(f"sliding_layers {self.sliding_layers} not all in [0, {self.num_layers})")
        object.__setattr__(self, "rope_scaling", _normalise_rope_scaling(self.rope_scaling))

    @property
    def out_bias(self) -> bool:
        """A bias on the o projection: transformers' Llama and Qwen3 put one there with attention_bias
        (Qwen2's fixed q/k/v biases leave o without one)."""
        return self.attention_bias and self.architecture in ("llama", "qwen3")

    @property
    def qk_norm(self) -> bool:
        """Qwen3: RMSNorm over the head dim of each query and key head, before RoPE."""
        return self.architecture == "qwen3"

    def layer_window(self, layer: int) -> int | None:
        """The sliding window of one layer, None where it attends to every previous position."""
        if self.sliding_window is None or (self.sliding_layers is not None and layer not in self.sliding_layers):
            return None
        return self.sliding_window

    @classmethod
    def from_hf_dict(cls, hf: dict[str, Any], *, source: str = "config.json", param_dtype: str | None = None):
        model_type = hf.get("model_type")
        if model_type not in SUPPORTED_ARCHITECTURES:
            raise UnsupportedModelError(
                f"{source}: unsupported model_type {model_type!r} "
                f"(architectures {hf.get('architectures')}); supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        _refuse_unsupported_switches(hf, model_type, source)
        try:
            heads = int(hf["num_attention_heads"])
            hidden = int(hf["hidden_size"])
            num_layers = int(hf["num_hidden_layers"])
            max_pos = int(hf.get("max_position_embeddings", 2048))
            window, sliding_layers = _sliding_window(hf, model_type, num_layers, source)
            rope_theta, rope_scaling = _rope(hf, max_pos, source)
            eos = hf.get("eos_token_id")
            eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
            return cls(
                architecture=model_type,
                vocab_size=int(hf["vocab_size"]),
                hidden_size=hidden,
                intermediate_size=int(hf["intermediate_size"]),
                num_layers=num_layers,
                num_heads=heads,
                num_kv_heads=int(hf.get("num_key_value_heads") or heads),
                # Qwen3Config's head_dim defaults to 128, the others' to hidden / heads
                head_dim=int(hf.get("head_dim") or (128 if model_type == "qwen3" else hidden // heads)),
                rope_theta=rope_theta,
                rope_scaling=rope_scaling,
                rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
                tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
                attention_bias=model_type == "qwen2" or (model_type != "mistral" and bool(hf.get("attention_bias"))),
                sliding_window=window,
                sliding_layers=sliding_layers,
                max_position_embeddings=max_pos,
                param_dtype=param_dtype or _dtype_name(hf.get("torch_dtype") or hf.get("dtype")),
                bos_token_id=hf.get("bos_token_id"),
                eos_token_ids=eos_ids,
            )
        except KeyError as e:
            raise UnsupportedModelError(f"{source}: missing required key {e.args[0]!r}") from None

    @classmethod
    def from_scratch(cls, scratch: dict, *, vocab_size: int, param_dtype: str, eos_token_ids) -> "ModelConfig":
        """A model from random weights (config `model.scratch`): its shape keys, checked by name."""
        known = {f.name for f in dataclasses.fields(cls)} - {"vocab_size", "param_dtype", "eos_token_ids"}
        unknown = sorted(set(scratch) - known)
        if unknown:
            raise UnsupportedModelError(f"model.scratch: unknown keys {unknown}; known: {', '.join(sorted(known))}")
        return cls(**{"vocab_size": vocab_size, **scratch, "param_dtype": param_dtype,
                      "eos_token_ids": tuple(eos_token_ids)})

    @classmethod
    def from_hf_folder(cls, folder: str | Path, *, param_dtype: str | None = None) -> "ModelConfig":
        path = Path(folder) / "config.json"
        if not path.is_file():
            raise FileNotFoundError(f"{folder}: no config.json (expected a Hugging Face model folder)")
        try:
            hf = json.loads(path.read_text())
        except (ValueError, UnicodeDecodeError) as e:  # JSONDecodeError is a ValueError
            raise UnsupportedModelError(f"{path}: not a JSON config ({e})") from None
        if not isinstance(hf, dict):
            raise UnsupportedModelError(f"{path}: a model config is a JSON object, got {type(hf).__name__}")
        return cls.from_hf_dict(hf, source=str(path), param_dtype=param_dtype)

    def to_hf_dict(self) -> dict[str, Any]:
        rope = {"rope_type": "default", **dict(self.rope_scaling or ())}
        hf = {
            "architectures": [_HF_CLASS[self.architecture]],
            "model_type": self.architecture,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            # transformers 5 reads rope_parameters; older readers rope_theta + rope_scaling (which
            # transformers 5 prefers when both are there: they agree)
            "rope_theta": self.rope_theta,
            "rope_parameters": {**rope, "rope_theta": self.rope_theta},
            "rope_scaling": rope if self.rope_scaling else None,
            "rms_norm_eps": self.rms_norm_eps,
            "tie_word_embeddings": self.tie_embeddings,
            "max_position_embeddings": self.max_position_embeddings,
            "torch_dtype": self.param_dtype,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": list(self.eos_token_ids) if len(self.eos_token_ids) > 1 else
            (self.eos_token_ids[0] if self.eos_token_ids else None),
        }
        if self.architecture in ("llama", "qwen3"):
            hf["attention_bias"] = self.attention_bias
        if self.architecture == "llama":
            hf["mlp_bias"] = False
        if self.architecture == "mistral":
            hf["sliding_window"] = self.sliding_window
            if self.sliding_window is not None and self.sliding_layers is not None:
                raise UnsupportedModelError("transformers' Mistral applies its sliding window to every layer; "
                                            f"sliding_layers={self.sliding_layers} cannot be exported")
        if self.architecture in ("qwen2", "qwen3"):
            sliding = [self.layer_window(i) is not None for i in range(self.num_layers)]
            hf["use_sliding_window"] = any(sliding)
            hf["sliding_window"] = self.sliding_window if any(sliding) else None
            # layer_types is what transformers 5 reads; max_window_layers (first sliding layer) for older readers
            hf["max_window_layers"] = sliding.index(True) if any(sliding) else self.num_layers
            hf["layer_types"] = ["sliding_attention" if s else "full_attention" for s in sliding]
        return hf

    def replace(self, **changes) -> "ModelConfig":
        return dataclasses.replace(self, **changes)


def _dtype_name(torch_dtype: Any) -> str:
    return "bfloat16" if str(torch_dtype) in ("bfloat16", "torch.bfloat16") else "float32"


def _normalise_rope_scaling(scaling) -> tuple[tuple[str, Any], ...] | None:
    """Sorted (key, value) pairs of a supported RoPE scaling, None for plain RoPE."""
    if not scaling:
        return None
    params = dict(scaling)
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type == "default":
        return None
    if rope_type not in _ROPE_KEYS:
        raise UnsupportedModelError(f"RoPE type {rope_type!r} is not supported (only 'default' and "
                                    f"{', '.join(repr(t) for t in _ROPE_KEYS)})")
    missing = [k for k in _ROPE_KEYS[rope_type] if params.get(k) is None]
    if missing:
        raise UnsupportedModelError(f"RoPE type {rope_type!r} needs {', '.join(missing)}")
    out = {k: float(params[k]) for k in _ROPE_KEYS[rope_type]}
    out["original_max_position_embeddings"] = int(params["original_max_position_embeddings"])
    out["rope_type"] = rope_type
    return tuple(sorted(out.items()))


def _rope(hf: dict[str, Any], max_pos: int, source: str) -> tuple[float, tuple | None]:
    """(rope_theta, rope_scaling) as transformers 5 reads them: `rope_scaling` (older folders) wins over
    `rope_parameters` (folders saved by transformers 5); rope_theta inside the dict over the top-level key."""
    key = "rope_scaling" if hf.get("rope_scaling") else "rope_parameters"
    params = dict(hf.get(key) or {})
    if any(isinstance(v, dict) for v in params.values()):
        raise UnsupportedModelError(f"{source}: per-layer-type {key} {params} is not supported")
    partial = params.get("partial_rotary_factor", hf.get("partial_rotary_factor"))
    if partial not in (None, 1, 1.0):
        raise UnsupportedModelError(f"{source}: partial_rotary_factor={partial} is not supported (only 1.0)")
    theta = float(params.get("rope_theta", hf.get("rope_theta", 10000.0)))
    if params.get("rope_type", params.get("type", "default")) != "default":
        # transformers fills a missing original_max_position_embeddings with max_position_embeddings
        params.setdefault("original_max_position_embeddings", max_pos)
    try:
        return theta, _normalise_rope_scaling(params)
    except UnsupportedModelError as e:
        raise UnsupportedModelError(f"{source}: {key}: {e}") from None


TRANSFORMERS_DEFAULT_WINDOW = 4096  # MistralConfig / Qwen2Config / Qwen3Config's sliding_window default


def _sliding_window(hf: dict[str, Any], model_type: str, num_layers: int, source: str):
    """(sliding_window, sliding_layers) as transformers 5 decides them for the architecture. A config.json without
    the key gets the config class's default (4096 for Mistral, Qwen2 and Qwen3), as transformers gives it; an
    explicit null means no window."""
    window = hf.get("sliding_window", TRANSFORMERS_DEFAULT_WINDOW)
    if model_type == "mistral":  # every layer (MistralModel ignores layer_types)
        return (int(window) if window else None), None
    if model_type == "llama" or not hf.get("use_sliding_window") or not window:
        return None, None
    # Qwen2 / Qwen3: layer_types when given, else the layers from max_window_layers on slide
    layer_types = hf.get("layer_types") or ["sliding_attention" if i >= int(hf.get("max_window_layers", 28))
                                            else "full_attention" for i in range(num_layers)]
    unknown = sorted(set(layer_types) - {"sliding_attention", "full_attention"})
    if unknown or len(layer_types) != num_layers:
        raise UnsupportedModelError(f"{source}: layer_types {layer_types} is not supported (need {num_layers} of "
                                    f"'full_attention' / 'sliding_attention')")
    sliding = tuple(i for i, t in enumerate(layer_types) if t == "sliding_attention")
    return (int(window), sliding) if sliding else (None, None)


def _refuse_unsupported_switches(hf: dict[str, Any], model_type: str, source: str) -> None:
    act = hf.get("hidden_act", "silu")
    if act not in ("silu", "swish"):
        raise UnsupportedModelError(f"{source}: hidden_act={act!r} is not supported (only 'silu')")
    if model_type == "llama" and hf.get("mlp_bias"):
        raise UnsupportedModelError(f"{source}: mlp_bias=true is not supported (MLP projections without biases only)")
    ignored = [k for k in _IGNORED_BY_TRANSFORMERS[model_type] if hf.get(k)]
    if ignored:
        warnings.warn(f"{source}: ignoring {', '.join(ignored)}, which transformers' {_HF_CLASS[model_type]} "
                      f"does not read either", stacklevel=3)
