"""Model configuration: one frozen dataclass for the Llama / Qwen2 / Mistral decoder family.

Built from (and exported back to) a Hugging Face `config.json`, so a local HF folder is all a
run needs to describe its model.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

SUPPORTED_ARCHITECTURES = ("llama", "qwen2", "mistral")

_HF_CLASS = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "mistral": "MistralForCausalLM"}


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
    attention_bias: bool = False  # Qwen2: biases on the q, k, v projections
    sliding_window: int | None = None  # Mistral: attend to at most this many previous positions
    max_position_embeddings: int = 2048
    param_dtype: str = "float32"
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()

    def __post_init__(self):
        if self.architecture not in SUPPORTED_ARCHITECTURES:
            raise UnsupportedModelError(
                f"unsupported architecture {self.architecture!r}; supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}")
        if self.param_dtype not in ("float32", "bfloat16"):
            raise ValueError(f"param_dtype must be float32 or bfloat16, got {self.param_dtype!r}")

    @classmethod
    def from_hf_dict(cls, hf: dict[str, Any], *, source: str = "config.json", param_dtype: str | None = None):
        model_type = hf.get("model_type")
        if model_type not in SUPPORTED_ARCHITECTURES:
            raise UnsupportedModelError(
                f"{source}: unsupported model_type {model_type!r} "
                f"(architectures {hf.get('architectures')}); supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        scaling = hf.get("rope_scaling") or {}
        if scaling and scaling.get("rope_type", scaling.get("type")) not in (None, "default"):
            raise UnsupportedModelError(f"{source}: rope_scaling {scaling} is not supported (only default RoPE)")
        try:
            heads = int(hf["num_attention_heads"])
            hidden = int(hf["hidden_size"])
            window = None
            if model_type == "mistral" or (model_type == "qwen2" and hf.get("use_sliding_window")):
                window = hf.get("sliding_window")
            eos = hf.get("eos_token_id")
            eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
            return cls(
                architecture=model_type,
                vocab_size=int(hf["vocab_size"]),
                hidden_size=hidden,
                intermediate_size=int(hf["intermediate_size"]),
                num_layers=int(hf["num_hidden_layers"]),
                num_heads=heads,
                num_kv_heads=int(hf.get("num_key_value_heads") or heads),
                head_dim=int(hf.get("head_dim") or hidden // heads),
                rope_theta=float(hf.get("rope_theta", (hf.get("rope_parameters") or {}).get("rope_theta", 10000.0))),
                rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
                tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
                attention_bias=model_type == "qwen2" or bool(hf.get("attention_bias", False)),
                sliding_window=int(window) if window else None,
                max_position_embeddings=int(hf.get("max_position_embeddings", 2048)),
                param_dtype=param_dtype or _dtype_name(hf.get("torch_dtype") or hf.get("dtype")),
                bos_token_id=hf.get("bos_token_id"),
                eos_token_ids=eos_ids,
            )
        except KeyError as e:
            raise UnsupportedModelError(f"{source}: missing required key {e.args[0]!r}") from None

    @classmethod
    def from_hf_folder(cls, folder: str | Path, *, param_dtype: str | None = None) -> "ModelConfig":
        path = Path(folder) / "config.json"
        if not path.is_file():
            raise FileNotFoundError(f"{folder}: no config.json (expected a Hugging Face model folder)")
        return cls.from_hf_dict(json.loads(path.read_text()), source=str(path), param_dtype=param_dtype)

    def to_hf_dict(self) -> dict[str, Any]:
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
            "rope_theta": self.rope_theta,
            "rms_norm_eps": self.rms_norm_eps,
            "tie_word_embeddings": self.tie_embeddings,
            "max_position_embeddings": self.max_position_embeddings,
            "torch_dtype": self.param_dtype,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": list(self.eos_token_ids) if len(self.eos_token_ids) > 1 else
            (self.eos_token_ids[0] if self.eos_token_ids else None),
        }
        if self.architecture == "llama":
            hf["attention_bias"] = self.attention_bias
            hf["mlp_bias"] = False
        if self.architecture == "mistral":
            hf["sliding_window"] = self.sliding_window
        if self.architecture == "qwen2":
            hf["use_sliding_window"] = self.sliding_window is not None
            hf["sliding_window"] = self.sliding_window
        return hf

    def replace(self, **changes) -> "ModelConfig":
        return dataclasses.replace(self, **changes)


def _dtype_name(torch_dtype: Any) -> str:
    return "bfloat16" if str(torch_dtype) in ("bfloat16", "torch.bfloat16") else "float32"
