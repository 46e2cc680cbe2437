"""Sampling with parameters (and rows) sharded over 8 fake CPU devices equals one device."""

import jax
import numpy as np
import pytest
from flax import nnx
from jax.sharding import NamedSharding

from jaxrl_llm.parallel.mesh import make_mesh
from jaxrl_llm.parallel.rules import shard_state, state_shardings
from jaxrl_llm.sampling.sampler import Sampler

pytestmark = pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 (fake) devices; set in conftest")

PROMPTS = [[5, 6, 7], list(range(30, 52)), [9] * 5, [1, 2, 3, 4], [44, 45], [60] * 11, [7], [8, 9]]


@pytest.mark.slow
@pytest.mark.parametrize("mesh_shape", [{"data": 8}, {"data": 2, "fsdp": 2, "tensor": 2}, {"tensor": 2, "fsdp": 4}])
def test_sharded_sampling_equals_single_device(tiny_model, tiny_sampler, mesh_shape):
    sampler, state = tiny_sampler
    kwargs = dict(max_new_tokens=24, temperature=np.linspace(0.0, 1.5, 8).astype(np.float32), top_p=0.9,
                  key=jax.random.key(5))
    ref = sampler(state, PROMPTS, **kwargs)

    mesh = make_mesh(mesh_shape)
    sharded = shard_state(state, mesh)
    specs = {str(leaf.sharding.spec) for leaf in jax.tree.leaves(sharded)}
    if mesh.shape["tensor"] > 1 or mesh.shape["fsdp"] > 1:
        assert any(s != "PartitionSpec()" for s in specs), "no parameter was actually sharded"
    mesh_sampler = Sampler(sampler.graphdef, pad_id=0, stop_ids=(), mesh=mesh)
    got = mesh_sampler(sharded, PROMPTS, **kwargs)
    for i in range(len(PROMPTS)):
        assert got.generated(i) == ref.generated(i)
        # sharded matmuls sum in another order: float32 noise, relative to the value (rows at T = 0.2
        # have tempered log-probs of tens; one of 512 differed by 1.5e-5 = 6e-6 relative)
        np.testing.assert_allclose(got.logprobs[i], ref.logprobs[i], rtol=1e-5, atol=1e-5)


def test_rule_table_shards_the_expected_axes():
    mesh = make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
    from jaxrl_llm.model.config import ModelConfig
    from jaxrl_llm.model.transformer import abstract_model
    cfg = ModelConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_layers=1, num_heads=4,
                      num_kv_heads=2, head_dim=16)
    shard = state_shardings(nnx.state(abstract_model(cfg)), mesh)
    assert isinstance(shard["embed"], NamedSharding)
    assert tuple(shard["embed"].spec) == ("tensor", "fsdp")
    assert tuple(shard["layers"][0]["mlp"]["down"].spec) == ("tensor", "fsdp")
    assert tuple(shard["layers"][0]["attn"]["q"].spec) == ("fsdp", "tensor", None)
    assert tuple(shard["final_norm"]["scale"].spec) == (None,)
