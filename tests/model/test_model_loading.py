"""Loading refuses what it cannot run: unmapped tensors and config switches are errors naming the
folder and the tensor or key; RoPE and sliding-window settings are read the way transformers 5 reads them."""

import json
import re
import warnings

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from jaxrl_llm.model.config import ModelConfig, UnsupportedModelError
from jaxrl_llm.model.hf_io import CheckpointError, export_hf_folder, load_hf_folder

LLAMA = dict(model_type="llama", vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
LLAMA3 = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
              original_max_position_embeddings=16)


@pytest.fixture
def folder(tiny_model, tmp_path):
    return export_hf_folder(tiny_model, tmp_path / "ckpt")


def _edit_tensors(folder, edit):
    tensors = load_file(str(folder / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(folder / "model.safetensors"))


def _edit_config(folder, **changes):
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(changes)
    (folder / "config.json").write_text(json.dumps(cfg))


def test_unmapped_tensors_are_refused_by_name(folder):
    """An o_proj bias the config does not ask for (the loader once dropped it silently) is an error;
    the RoPE buffer transformers itself ignores is not."""
    def add(tensors):
        tensors["model.layers.0.self_attn.o_proj.bias"] = np.ones(64, np.float32)
        tensors["model.layers.0.self_attn.rotary_emb.inv_freq"] = np.ones(8, np.float32)
    _edit_tensors(folder, add)
    with pytest.raises(CheckpointError, match=r"ckpt: 1 tensor\(s\) the llama config has no place for .*"
                                              r"'model\.layers\.0\.self_attn\.o_proj\.bias'$"):
        load_hf_folder(folder)

    def add_many(tensors):
        for i in range(7):
            tensors[f"extra.{i}"] = np.zeros(2, np.float32)
    _edit_tensors(folder, add_many)
    with pytest.raises(CheckpointError, match=r"ckpt: 8 tensor\(s\) .*'extra\.0', .*, \.\.\.$"):
        load_hf_folder(folder)

    _edit_tensors(folder, lambda t: [t.pop(n) for n in list(t) if "o_proj.bias" in n or n.startswith("extra.")])
    load_hf_folder(folder)  # the inv_freq buffer alone is skipped


def test_tied_lm_head_must_equal_the_embedding(folder):
    _edit_config(folder, tie_word_embeddings=True)
    _edit_tensors(folder, lambda t: t.update({"lm_head.weight": t["model.embed_tokens.weight"] + 1.0}))
    with pytest.raises(CheckpointError, match=r"ckpt: tie_word_embeddings is true but 'lm_head\.weight' differs"):
        load_hf_folder(folder)
    _edit_tensors(folder, lambda t: t.update({"lm_head.weight": t["model.embed_tokens.weight"]}))
    _, cfg = load_hf_folder(folder)  # a saved copy of the tied head is what transformers would load
    assert cfg.tie_embeddings


def test_mlp_bias_and_other_activations_are_refused(folder):
    _edit_config(folder, mlp_bias=True)
    with pytest.raises(UnsupportedModelError, match=r"config\.json: mlp_bias=true is not supported"):
        load_hf_folder(folder)
    _edit_config(folder, mlp_bias=False, hidden_act="gelu")
    with pytest.raises(UnsupportedModelError, match=r"config\.json: hidden_act='gelu' is not supported"):
        load_hf_folder(folder)


def test_llama3_rope_reads_old_and_new_keys_alike():
    new = ModelConfig.from_hf_dict({**LLAMA, "rope_parameters": {**LLAMA3, "rope_theta": 500.0}})
    old = ModelConfig.from_hf_dict({**LLAMA, "rope_theta": 500.0, "rope_scaling": LLAMA3})
    assert new == old and hash(new) == hash(old)  # hashable: the config sits in jit's static graphdef
    assert new.rope_theta == 500.0 and dict(new.rope_scaling) == LLAMA3
    assert ModelConfig.from_hf_dict(new.to_hf_dict()) == new
    # transformers fills a missing original_max_position_embeddings with max_position_embeddings
    short = {k: v for k, v in LLAMA3.items() if k != "original_max_position_embeddings"}
    assert dict(ModelConfig.from_hf_dict({**LLAMA, "rope_scaling": short}).rope_scaling)[
        "original_max_position_embeddings"] == 128
    plain = ModelConfig.from_hf_dict({**LLAMA, "rope_parameters": {"rope_type": "default", "rope_theta": 7.0}})
    assert plain.rope_scaling is None and plain.rope_theta == 7.0


@pytest.mark.parametrize("key", ["rope_scaling", "rope_parameters"])
@pytest.mark.parametrize("rope_type", ["yarn", "linear", "dynamic"])
def test_other_rope_types_are_refused_by_name(key, rope_type):
    hf = {**LLAMA, key: {"rope_type": rope_type, "factor": 4.0, "original_max_position_embeddings": 16}}
    with pytest.raises(UnsupportedModelError, match=rf"cfg\.json: {key}: RoPE type '{rope_type}' is not supported"):
        ModelConfig.from_hf_dict(hf, source="cfg.json")
    with pytest.raises(UnsupportedModelError, match=r"partial_rotary_factor=0\.5"):
        ModelConfig.from_hf_dict({**LLAMA, "partial_rotary_factor": 0.5})


@pytest.mark.parametrize("model_type", ["qwen2", "qwen3"])
def test_qwen_sliding_window_per_layer(model_type):
    base = {**LLAMA, "model_type": model_type, "num_hidden_layers": 4, "sliding_window": 6}
    cfg = ModelConfig.from_hf_dict({**base, "use_sliding_window": True, "max_window_layers": 1})
    assert cfg.sliding_window == 6 and cfg.sliding_layers == (1, 2, 3)
    assert [cfg.layer_window(i) for i in range(4)] == [None, 6, 6, 6]
    assert ModelConfig.from_hf_dict(cfg.to_hf_dict()) == cfg
    # transformers 5's layer_types win over max_window_layers
    cfg = ModelConfig.from_hf_dict({**base, "use_sliding_window": True, "max_window_layers": 1,
                                    "layer_types": ["sliding_attention", "full_attention"] * 2})
    assert cfg.sliding_layers == (0, 2) and ModelConfig.from_hf_dict(cfg.to_hf_dict()) == cfg
    # use_sliding_window false (the default): no window anywhere, whatever sliding_window says
    assert ModelConfig.from_hf_dict(base).layer_window(3) is None
    assert ModelConfig.from_hf_dict({**base, "use_sliding_window": True, "max_window_layers": 4}).sliding_window is None
    with pytest.raises(UnsupportedModelError, match=r"layer_types .*'chunked_attention'"):
        ModelConfig.from_hf_dict({**base, "use_sliding_window": True,
                                  "layer_types": ["chunked_attention"] + ["full_attention"] * 3})


@pytest.mark.parametrize("model_type,extra", [("mistral", {}), ("qwen2", {"use_sliding_window": True}),
                                              ("qwen3", {"use_sliding_window": True}),
                                              ("mistral", {"sliding_window": None}), ("qwen2", {})])
def test_a_config_without_sliding_window_gets_transformers_default(model_type, extra):
    """A hand-made or trimmed config.json that leaves `sliding_window` out: transformers' config class fills its
    default (4096), so the model slides past 4,096 tokens; it loaded here without a window (another model)."""
    transformers = pytest.importorskip("transformers")
    hf = {**LLAMA, "model_type": model_type, "max_window_layers": 0, **extra}
    theirs = transformers.AutoConfig.for_model(**hf)
    ours = ModelConfig.from_hf_dict(hf)
    sliding = [i for i in range(2) if (getattr(theirs, "layer_types", None) or ["sliding_attention"] * 2)[i]
               == "sliding_attention"] if getattr(theirs, "sliding_window", None) else []
    assert [ours.layer_window(i) for i in range(2)] == [theirs.sliding_window if i in sliding else None
                                                      for i in range(2)], (theirs.sliding_window, sliding)


def test_mistral_window_stays_on_every_layer_and_ignored_keys_warn():
    hf = {**LLAMA, "model_type": "mistral", "sliding_window": 6, "layer_types": ["full_attention", "sliding_attention"]}
    with pytest.warns(UserWarning, match=r"ignoring layer_types, which transformers' MistralForCausalLM"):
        cfg = ModelConfig.from_hf_dict(hf)
    assert [cfg.layer_window(i) for i in range(2)] == [6, 6]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ModelConfig.from_hf_dict({**hf, "layer_types": None})


@pytest.mark.parametrize("shard", ["../../etc/passwd", "/etc/passwd", "../model.safetensors", "",
                                   "sub/../../model.safetensors", "..\\model.safetensors"])
def test_index_shard_names_must_stay_inside_the_folder(folder, shard):
    """A downloaded index must not make the loader open files outside the model folder."""
    outside = folder.parent / "model.safetensors"  # a real checkpoint one level up: only the name check stops it
    outside.write_bytes((folder / "model.safetensors").read_bytes())
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"model.norm.weight": "model.safetensors", "model.embed_tokens.weight": shard}}))
    with pytest.raises(CheckpointError, match=r"ckpt/model\.safetensors\.index\.json: weight_map entry "
                                              r"'model\.embed_tokens\.weight' names shard file "
                                              + re.escape(repr(shard)) + r", which is not a file name inside the "
                                              r"model folder$"):
        load_hf_folder(folder)


def test_unreadable_index_is_named(folder):
    (folder / "model.safetensors.index.json").write_text('{"weight_map": {"model.norm.weight": ')
    with pytest.raises(CheckpointError, match=r"ckpt/model\.safetensors\.index\.json: not a safetensors index with "
                                              r"a 'weight_map' \(JSONDecodeError: "):
        load_hf_folder(folder)


@pytest.mark.parametrize("keep", [0.5, 0.999, 4 / 4096])
def test_truncated_safetensors_is_one_line_naming_the_file(folder, keep):
    path = folder / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[:max(4, int(len(data) * keep))])
    with pytest.raises(CheckpointError) as err:
        load_hf_folder(folder)
    message = str(err.value)
    assert message.startswith(f"{path}: not a readable safetensors file, truncated or corrupt? (SafetensorError: ")
    assert "\n" not in message and isinstance(err.value, ValueError)
