"""GGUF import (llama architecture) with the `gguf` package.

Quantised tensors are dequantised to float32; the Q/K row permutation that llama.cpp's converter
applies is undone so weights come back in the Hugging Face layout; the tokenizer and chat template
come from the GGUF metadata through transformers' GGUF tokenizer converter.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize

from jaxrl_llm.model.config import ModelConfig, UnsupportedModelError
from jaxrl_llm.model.hf_io import CheckpointError, build_model

_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_GLOBAL_NAMES = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
                 "output.weight": "lm_head.weight"}


def hf_name(gguf_name: str) -> str | None:
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    parts = gguf_name.split(".", 2)
    if len(parts) == 3 and parts[0] == "blk" and parts[2] in _LAYER_NAMES:
        return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}"
    return None


def permute_qk(w: np.ndarray, n_heads: int) -> np.ndarray:
    """llama.cpp's converter order: within each head, interleave the two rotary halves."""
    return w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def unpermute_qk(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Inverse of `permute_qk`: back to the Hugging Face rotate-half layout."""
    return w.reshape(n_heads, w.shape[0] // n_heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _field(reader: GGUFReader, key: str, default=None):
    field = reader.fields.get(key)
    return default if field is None else field.contents()


def gguf_config(reader: GGUFReader, *, source: str, param_dtype: str = "float32") -> ModelConfig:
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise UnsupportedModelError(f"{source}: GGUF architecture {arch!r} is not supported (only 'llama')")
    names = {t.name for t in reader.tensors}

    def need(key):
        value = _field(reader, f"llama.{key}")
        if value is None:
            raise UnsupportedModelError(f"{source}: GGUF metadata lacks 'llama.{key}'")
        return value

    scaling = _field(reader, "llama.rope.scaling.type")
    if scaling not in (None, "none"):
        raise UnsupportedModelError(f"{source}: GGUF RoPE scaling {scaling!r} is not supported (only plain RoPE)")
    hidden, heads = int(need("embedding_length")), int(need("attention.head_count"))
    tokens = _field(reader, "tokenizer.ggml.tokens")
    vocab = _field(reader, "llama.vocab_size") or (len(tokens) if tokens else None)
    eos = _field(reader, "tokenizer.ggml.eos_token_id")
    return ModelConfig(
        architecture="llama",
        vocab_size=int(vocab),
        hidden_size=hidden,
        intermediate_size=int(need("feed_forward_length")),
        num_layers=int(need("block_count")),
        num_heads=heads,
        num_kv_heads=int(_field(reader, "llama.attention.head_count_kv", heads)),
        head_dim=int(_field(reader, "llama.rope.dimension_count", hidden // heads)),
        rope_theta=float(_field(reader, "llama.rope.freq_base", 10000.0)),
        rms_norm_eps=float(_field(reader, "llama.attention.layer_norm_rms_epsilon", 1e-6)),
        tie_embeddings="output.weight" not in names,
        max_position_embeddings=int(_field(reader, "llama.context_length", 2048)),
        param_dtype=param_dtype,
        bos_token_id=_field(reader, "tokenizer.ggml.bos_token_id"),
        eos_token_ids=() if eos is None else (int(eos),),
    )


def gguf_hf_arrays(reader: GGUFReader, cfg: ModelConfig, *, source: str) -> dict[str, np.ndarray]:
    """Every tensor dequantised to float32, renamed and laid out as in a Hugging Face checkpoint."""
    # a tensor we cannot name (e.g. llama3's rope_freqs.weight) would change the model: refuse it
    unknown = sorted(t.name for t in reader.tensors if hf_name(t.name) is None)
    if unknown:
        shown = ", ".join(repr(n) for n in unknown[:5]) + (", ..." if len(unknown) > 5 else "")
        raise UnsupportedModelError(f"{source}: {len(unknown)} GGUF tensor(s) this importer does not map: {shown}")
    out = {}
    for t in reader.tensors:
        name = hf_name(t.name)
        try:
            arr = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
        except NotImplementedError:
            raise UnsupportedModelError(
                f"{source}: tensor {t.name!r} has GGUF type {t.tensor_type.name}, which the gguf package "
                f"cannot dequantise") from None
        arr = arr.reshape(tuple(int(d) for d in reversed(t.shape)))
        if name.endswith("q_proj.weight"):
            arr = unpermute_qk(arr, cfg.num_heads)
        elif name.endswith("k_proj.weight"):
            arr = unpermute_qk(arr, cfg.num_kv_heads)
        out[name] = arr
    return out


def load_gguf(path: str | Path, *, mesh=None, param_dtype: str = "float32"):
    """(Transformer, ModelConfig) from a llama-architecture GGUF file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such GGUF file")
    try:  # a short or damaged file fails deep inside the reader (numpy reshape, mmap, index errors)
        reader = GGUFReader(str(path))
    except Exception as e:
        raise CheckpointError(f"{path}: not a readable GGUF file, truncated or corrupt? ({type(e).__name__}: {e})") \
            from None
    cfg = gguf_config(reader, source=str(path), param_dtype=param_dtype)
    arrays = gguf_hf_arrays(reader, cfg, source=str(path))
    return build_model(cfg, arrays, source=str(path), mesh=mesh), cfg


def load_gguf_tokenizer(path: str | Path):
    """A transformers fast tokenizer (with the chat template) built from the GGUF metadata."""
    from transformers import AutoTokenizer

    path = Path(path)
    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name, local_files_only=True)
