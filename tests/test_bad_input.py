"""Bad input gets an error that names the file, tensor, row or name at fault."""

import json

import jax
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from jaxrl_llm.model.config import UnsupportedModelError
from jaxrl_llm.model.hf_io import CheckpointError, export_hf_folder, load_hf_folder
from jaxrl_llm.model.registry import UnknownModelError, resolve
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
