"""A LoRA run end to end (model.lora, model/lora.py) on a Hugging Face folder (the tiny model after a full SFT,
exported: a freshly initialised tiny model's frozen 0.02-scale embedding caps its logits near +-1, so adapters
alone cannot make it answer and every reward would be 0): SFT -> RL with a KL reference, E3, RRL and HeRL on.
The base never moves; checkpoints hold the adapters alone (and their optimizer state and reference); stopped after
step 2 and resumed, the run equals the uninterrupted one; a checkpoint loads back into base + adapters for eval and
export; the final export is the merged model and the PEFT adapter. The adapter format itself is checked against
peft in tests/model/test_lora.py."""

import json
from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import load_file

from tests.helpers import rrl_cfg, tiny_cfg, train_rows
from jaxrl_llm.model import lora
from jaxrl_llm.parallel.mesh import make_mesh
from jaxrl_llm.train.export import export_checkpoint
from jaxrl_llm.train.loop import Run
from jaxrl_llm.train.restore import load_checkpoint

pytestmark = pytest.mark.slow
# E3's target anneals toward train.steps: off, so that a run stopped by train.steps=2 plans steps 1-2 as the longer one
LORA = ("model.lora.rank=4", "model.lora.alpha=8", "model.lora.dropout=0.1", "sft.lr=0.05", "algo.kl_coef=0.05", "optim.lr=0.05",
        "train.checkpoint_every=2", "explore.e3.anneal=false")
STEPS = 4


def _leaves(tree):
    return [np.asarray(x) for x in jax.tree.leaves(jax.device_get(tree))]


def test_lora_run_trains_adapters_alone_resumes_exactly_and_exports(tmp_path):
    Run(rrl_cfg(tmp_path / "base", "train.steps=0", "train.export_final=true", "eval.size=0"), log=lambda *a: None).train()
    lora_cfg = lambda where, *extra: rrl_cfg(tmp_path / where, f"model.name={tmp_path / 'base' / 'run' / 'final'}",  # noqa: E731
                                              *extra, *LORA)
    whole = lora_cfg("a", f"train.steps={STEPS}", "train.export_final=true")
    run = Run(whole, log=lambda *a: None)
    start = jax.device_get(run.state.params)
    run.train()
    end = jax.device_get(run.state.params)
    for x, y in zip(_leaves(lora.frozen(start)), _leaves(lora.frozen(end))):
        np.testing.assert_array_equal(x, y)  # the base is frozen
    moved = [np.abs(x - y).max() for x, y in zip(_leaves(lora.trainable(start)), _leaves(lora.trainable(end)))]
    assert min(moved) > 0, moved  # every adapter trained (A and B of every projection)

    out = Path(whole.train.out_dir)
    registry = json.loads((out / "checkpoints" / str(STEPS) / "registry" / "metadata").read_text())
    saved = [k for k in registry["array_shapes"] if k.startswith(("['params']", "['ref_params']"))]
    assert saved and all("_lora_" in k for k in saved), saved  # no base weight in the checkpoint
    assert registry["model_signature"]["lora"] == {"rank": 4, "alpha": 8.0, "targets": list(lora.TARGETS)}
    adapters = [k for k in saved if k.startswith("['params']")]
    moments = [v for k, v in registry["array_shapes"].items() if k.startswith("['opt_state']") and v]
    assert len(moments) == 2 * len(adapters)  # Adam's two moments of each adapter array, nothing of the base

    # stopped by the config after step 2, resumed to step 4: the same adapters as the uninterrupted run
    Run(lora_cfg("b", "train.steps=2"), log=lambda *a: None).train()
    logs = []
    resumed = Run(lora_cfg("b", f"train.steps={STEPS}"), log=logs.append)
    resumed.train()
    assert any("resumed from" in line for line in logs) and resumed.state.step == STEPS
    rows_a = train_rows(out)
    assert all(rows_a[s]["rrl_replay_rows"] > 0 for s in (2, 3, 4)) and sum(r["herl_kept"] for r in rows_a.values())
    assert rows_a[STEPS]["e3_n_max"] > rows_a[1]["e3_n_max"]  # E3's bounds widened: all three explorers acted
    assert 0 < sum(r["reward_mean"] for r in rows_a.values()) and all(rows_a[s]["kl"] > 0 for s in (2, 3, 4))
    for x, y in zip(_leaves(end), _leaves(resumed.state.params)):
        np.testing.assert_allclose(x, y, atol=1e-6)
    assert train_rows(tmp_path / "b" / "run") == rows_a  # every metric of every step

    # eval / export read a checkpoint back onto the base the run was built from
    mesh = make_mesh({"data": 1}, devices=jax.devices()[:1])
    loaded = load_checkpoint(whole, mesh, log=lambda *a: None)
    for x, y in zip(_leaves(end), _leaves(loaded.params)):
        np.testing.assert_array_equal(x, y)
    export_checkpoint(whole, mesh, tmp_path / "merged", dtype="float32", log=lambda *a: None)
    export_checkpoint(whole, mesh, tmp_path / "adapter", log=lambda *a: None, adapter=True)
    a, b = load_file(out / "final" / "model.safetensors"), load_file(tmp_path / "merged" / "model.safetensors")
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    a, b = load_file(out / "final_adapter" / "adapter_model.safetensors"), \
        load_file(tmp_path / "adapter" / "adapter_model.safetensors")
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"], config["peft_type"]) == (4, 8.0, "LORA")
    # the merged export is W + alpha / rank A B
    model = nnx.merge(loaded.policy.graphdef, loaded.params)
    q = model.layers[0].attn
    by_hand = np.asarray(q.q[...]) + 2.0 * np.tensordot(np.asarray(q.q_lora_a[...]), np.asarray(q.q_lora_b[...]), 1)
    d, h, e = by_hand.shape
    np.testing.assert_allclose(a_q := load_file(tmp_path / "merged" / "model.safetensors")[
        "model.layers.0.self_attn.q_proj.weight"], by_hand.reshape(d, h * e).T, atol=1e-6)
    assert np.abs(a_q - np.asarray(q.q[...]).reshape(d, h * e).T).max() > 1e-4  # the adapter is in it

    with pytest.raises(ValueError, match="model.lora.rank is 0"):
        export_checkpoint(tiny_cfg(tmp_path / "c"), mesh, tmp_path / "x", adapter=True)
