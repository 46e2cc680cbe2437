"""Hugging Face checkpoint folders: load (config.json + safetensors, sharded or not) and export.

Arrays are read on the host and placed straight into their sharded layout when a mesh is given,
so a large model never sits whole on one device.
"""

from __future__ import annotations

import json
from pathlib import Path, PurePosixPath
from typing import Callable, Iterable, Iterator, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh
from safetensors import safe_open
from safetensors.numpy import save_file

from jaxrl_llm.model import lora
from jaxrl_llm.model.config import ModelConfig
from jaxrl_llm.model.transformer import Transformer, abstract_model
from jaxrl_llm.parallel.rules import DEFAULT_RULES, state_shardings


class CheckpointError(ValueError):
    """A checkpoint folder is missing a tensor, holds one of the wrong shape, or one we cannot place; or a
    checkpoint file (safetensors, GGUF, shard index) cannot be read."""


# Tensors a checkpoint may hold that transformers itself does not load: RoPE buffers some older
# exports saved (recomputed from the config). Anything else we do not map is an error, never dropped.
_IGNORED_SUFFIXES = (".rotary_emb.inv_freq",)


# One entry per parameter: (our path, HF name, HF array -> ours, ours -> HF array).
Entry = tuple[tuple, str, Callable[[np.ndarray], np.ndarray], Callable[[np.ndarray], np.ndarray]]


def _t(x):
    return x.T


def weight_map(cfg: ModelConfig) -> list[Entry]:
    d, h, k, e = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    out: list[Entry] = [(("embed",), "model.embed_tokens.weight", lambda x: x, lambda x: x),
                        (("final_norm", "scale"), "model.norm.weight", lambda x: x, lambda x: x)]
    if not cfg.tie_embeddings:
        out.append((("lm_head",), "lm_head.weight", _t, _t))
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        out += [
            (("layers", i, "attn_norm", "scale"), p + "input_layernorm.weight", lambda x: x, lambda x: x),
            (("layers", i, "mlp_norm", "scale"), p + "post_attention_layernorm.weight", lambda x: x, lambda x: x),
            (("layers", i, "attn", "q"), p + "self_attn.q_proj.weight",
             lambda x: x.T.reshape(d, h, e), lambda x: x.reshape(d, h * e).T),
            (("layers", i, "attn", "k"), p + "self_attn.k_proj.weight",
             lambda x: x.T.reshape(d, k, e), lambda x: x.reshape(d, k * e).T),
            (("layers", i, "attn", "v"), p + "self_attn.v_proj.weight",
             lambda x: x.T.reshape(d, k, e), lambda x: x.reshape(d, k * e).T),
            (("layers", i, "attn", "o"), p + "self_attn.o_proj.weight",
             lambda x: x.T.reshape(h, e, d), lambda x: x.reshape(h * e, d).T),
            (("layers", i, "mlp", "gate"), p + "mlp.gate_proj.weight", _t, _t),
            (("layers", i, "mlp", "up"), p + "mlp.up_proj.weight", _t, _t),
            (("layers", i, "mlp", "down"), p + "mlp.down_proj.weight", _t, _t),
        ]
        if cfg.attention_bias:
            out += [
                (("layers", i, "attn", "q_bias"), p + "self_attn.q_proj.bias",
                 lambda x: x.reshape(h, e), lambda x: x.reshape(h * e)),
                (("layers", i, "attn", "k_bias"), p + "self_attn.k_proj.bias",
                 lambda x: x.reshape(k, e), lambda x: x.reshape(k * e)),
                (("layers", i, "attn", "v_bias"), p + "self_attn.v_proj.bias",
                 lambda x: x.reshape(k, e), lambda x: x.reshape(k * e)),
            ]
        if cfg.out_bias:
            out.append((("layers", i, "attn", "o_bias"), p + "self_attn.o_proj.bias", lambda x: x, lambda x: x))
        if cfg.qk_norm:
            out += [(("layers", i, "attn", "q_norm", "scale"), p + "self_attn.q_norm.weight", lambda x: x, lambda x: x),
                    (("layers", i, "attn", "k_norm", "scale"), p + "self_attn.k_norm.weight", lambda x: x, lambda x: x)]
    return out


def _get(tree, path):
    for key in path:
        tree = tree[key]
    return tree


def _set(tree, path, value):
    for key in path[:-1]:
        tree = tree[key]
    tree[path[-1]] = value


def check_no_unmapped(cfg: ModelConfig, names: Iterable[str], fetch: Callable[[str], np.ndarray | None], *,
                      source: str) -> None:
    """Refuse a checkpoint holding tensors the model has no place for (e.g. biases of a switch we do
    not read), rather than run a different model than the one saved. Skipped by name: transformers'
    RoPE buffers, and lm_head.weight of a tied model when it is a copy of the embedding."""
    mapped = {name for _, name, _, _ in weight_map(cfg)}
    unmapped = sorted(n for n in names if n not in mapped and not n.endswith(_IGNORED_SUFFIXES))
    if cfg.tie_embeddings and "lm_head.weight" in unmapped:
        head, embed = fetch("lm_head.weight"), fetch("model.embed_tokens.weight")
        if head is not None and embed is not None and np.array_equal(np.asarray(head), np.asarray(embed)):
            unmapped.remove("lm_head.weight")
        else:
            raise CheckpointError(f"{source}: tie_word_embeddings is true but 'lm_head.weight' differs from "
                                  f"'model.embed_tokens.weight'")
    if unmapped:
        shown = ", ".join(repr(n) for n in unmapped[:5]) + (", ..." if len(unmapped) > 5 else "")
        raise CheckpointError(f"{source}: {len(unmapped)} tensor(s) the {cfg.architecture} config has no place "
                              f"for (they would be dropped): {shown}")


def build_model(cfg: ModelConfig, hf_arrays: Mapping[str, np.ndarray] | Callable[[str], np.ndarray | None], *,
                source: str, mesh: Mesh | None = None, rules=DEFAULT_RULES,
                names: Iterable[str] | None = None) -> Transformer:
    """A Transformer whose parameters come from HF-named host arrays, placed with `mesh` if given.

    Every tensor of the checkpoint (a Mapping's keys, or `names` beside a fetch function) must be one
    the model uses: see `check_no_unmapped`."""
    fetch = hf_arrays if callable(hf_arrays) else hf_arrays.get
    if names is None and not callable(hf_arrays):
        names = hf_arrays.keys()
    if names is not None:
        check_no_unmapped(cfg, names, fetch, source=source)
    graphdef, abstract = nnx.split(abstract_model(cfg))
    pure = nnx.to_pure_dict(abstract)
    shardings = state_shardings(abstract, mesh, rules) if mesh is not None else None
    for path, name, to_ours, _ in weight_map(cfg):
        want = _get(pure, path)
        raw = fetch(name)
        if raw is None:
            raise CheckpointError(f"{source}: missing tensor {name!r} (needed for {cfg.architecture} "
                                  f"with {cfg.num_layers} layers)")
        try:
            arr = to_ours(np.asarray(raw))
        except ValueError as e:
            raise CheckpointError(f"{source}: tensor {name!r} has shape {tuple(np.shape(raw))}, "
                                  f"which does not fit the config ({e})") from None
        if arr.shape != want.shape:
            raise CheckpointError(f"{source}: tensor {name!r} has shape {tuple(np.shape(raw))}; "
                                  f"the config implies {want.shape} in our layout")
        arr = arr.astype(want.dtype)
        if shardings is not None:
            sharding = _get(shardings, path)
            placed = jax.make_array_from_callback(arr.shape, sharding, lambda idx, a=arr: a[idx])
        else:
            placed = jnp.asarray(arr)
        _set(pure, path, placed)
    nnx.replace_by_pure_dict(abstract, pure)
    return nnx.merge(graphdef, abstract)


def _shard_names(index: Path) -> list[str]:
    """The shard file names an index lists; each must name a file inside the model folder (a downloaded index
    must not make us open ../../etc/passwd or /dev/zero)."""
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as e:
        raise CheckpointError(f"{index}: not a safetensors index with a 'weight_map' ({type(e).__name__}: {e})") \
            from None
    if not isinstance(weight_map, dict):
        raise CheckpointError(f"{index}: 'weight_map' must map tensor names to shard files, got {weight_map!r}")
    for tensor, name in weight_map.items():
        rel = PurePosixPath(name) if isinstance(name, str) else None
        if rel is None or rel.is_absolute() or not rel.parts or ".." in rel.parts or "\\" in name:
            raise CheckpointError(f"{index}: weight_map entry {tensor!r} names shard file {name!r}, which is not a "
                                  f"file name inside the model folder")
    return sorted(set(weight_map.values()))


def _safetensors_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        files = [folder / n for n in _shard_names(index)]
        missing = [str(f) for f in files if not f.is_file()]
        if missing:
            raise CheckpointError(f"{index}: lists shard files that do not exist: {missing}")
        return files
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{folder}: no *.safetensors files")
    return files


def _unreadable(path: Path, e: Exception) -> CheckpointError:
    return CheckpointError(f"{path}: not a readable safetensors file, truncated or corrupt? "
                           f"({type(e).__name__}: {e})")


def iter_safetensors(folder: Path) -> Iterator[tuple[str, Path]]:
    for f in _safetensors_files(folder):
        try:  # safetensors raises its own SafetensorError (no ValueError) for a short or damaged file
            with safe_open(str(f), framework="numpy") as fh:
                names = list(fh.keys())
        except Exception as e:
            raise _unreadable(f, e) from None
        for name in names:
            yield name, f


def load_hf_folder(folder: str | Path, *, mesh: Mesh | None = None, rules=DEFAULT_RULES,
                   param_dtype: str | None = None) -> tuple[Transformer, ModelConfig]:
    folder = Path(folder)
    cfg = ModelConfig.from_hf_folder(folder, param_dtype=param_dtype)
    where = dict(iter_safetensors(folder))

    def fetch(name):
        if name not in where:
            return None
        try:
            with safe_open(str(where[name]), framework="numpy") as fh:
                return fh.get_tensor(name)
        except Exception as e:  # the file changed or was cut after its header was read
            raise _unreadable(where[name], e) from None

    return build_model(cfg, fetch, source=str(folder), mesh=mesh, rules=rules, names=where), cfg


def export_hf_folder(model: Transformer, folder: str | Path, *, tokenizer=None, dtype: str | None = None) -> Path:
    """Write config.json + model.safetensors (+ tokenizer files) that `transformers` loads. LoRA adapters
    (model/lora.py) are merged into their weights (W + alpha / rank A B, in float32, then cast)."""
    cfg: ModelConfig = model.cfg
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    pure = nnx.to_pure_dict(nnx.state(model))
    for (i, sub, name), w in lora.merged_weights(model).items():
        pure["layers"][i][sub][name] = w
    out_dtype = np.dtype(jnp.dtype(dtype or cfg.param_dtype))
    tensors = {name: np.ascontiguousarray(to_hf(np.asarray(jax.device_get(_get(pure, path)))).astype(out_dtype))
               for path, name, _, to_hf in weight_map(cfg)}
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    hf = cfg.to_hf_dict()
    hf["torch_dtype"] = str(out_dtype) if out_dtype != np.float32 else "float32"
    (folder / "config.json").write_text(json.dumps(hf, indent=2))
    if tokenizer is not None:
        tokenizer.save_pretrained(str(folder))
    return folder
