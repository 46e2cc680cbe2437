"""Our loader and model against transformers' PyTorch implementation of the same architectures."""

import numpy as np
import jax
import jax.numpy as jnp
import pytest

from flax import nnx

from tests.helpers import torch_or_skip
from jaxrl_llm.model.hf_io import export_hf_folder, load_hf_folder
from jaxrl_llm.model.transformer import abstract_model
from jaxrl_llm.sampling.sampler import Sampler

torch = torch_or_skip()
from transformers import (AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, MistralConfig,  # noqa: E402
                          MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM)

COMMON = dict(vocab_size=113, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, rope_theta=1000.0, max_position_embeddings=128)
CASES = {
    "llama": (LlamaConfig, LlamaForCausalLM, dict(tie_word_embeddings=False)),
    "llama-tied-mha": (LlamaConfig, LlamaForCausalLM, dict(tie_word_embeddings=True, num_key_value_heads=4)),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM, dict(tie_word_embeddings=True)),
    "mistral-window": (MistralConfig, MistralForCausalLM, dict(sliding_window=6, tie_word_embeddings=False)),
    # q, k, v and o biases
    "llama-attn-bias": (LlamaConfig, LlamaForCausalLM, dict(attention_bias=True, tie_word_embeddings=False)),
    # frequency-dependent RoPE scaling; original context 16 < the 40 tokens compared, so it shows
    "llama3-rope": (LlamaConfig, LlamaForCausalLM, dict(tie_word_embeddings=False, rope_parameters=dict(
        rope_type="llama3", rope_theta=1000.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
        original_max_position_embeddings=16))),
    # the window in layer 1 only (layers from max_window_layers on)
    "qwen2-window-layers": (Qwen2Config, Qwen2ForCausalLM, dict(use_sliding_window=True, sliding_window=6,
                                                                max_window_layers=1, tie_word_embeddings=True)),
    # q/k RMSNorm; head_dim 32 != hidden 64 / 4 heads
    "qwen3": (Qwen3Config, Qwen3ForCausalLM, dict(head_dim=32, tie_word_embeddings=False)),
}
# Config changes that must move the logits (else the case could pass without testing its feature):
# the window on every layer or on none, plain RoPE.
ABLATIONS = {
    "mistral-window": [dict(sliding_window=None)],
    "qwen2-window-layers": [dict(sliding_layers=None), dict(sliding_window=None)],
    "llama3-rope": [dict(rope_scaling=None)],
}


@pytest.fixture(scope="module", params=sorted(CASES))
def hf_pair(request, tmp_path_factory):
    conf_cls, model_cls, extra = CASES[request.param]
    torch.manual_seed(0)
    hf_model = model_cls(conf_cls(**{**COMMON, **extra}, attn_implementation="eager")).eval()
    with torch.no_grad():  # random init has tiny weights; larger ones make differences visible
        for p in hf_model.parameters():
            p.mul_(4.0) if p.dim() > 1 else p.add_(torch.randn_like(p) * 0.1)
    folder = tmp_path_factory.mktemp(request.param)
    hf_model.save_pretrained(folder)
    ours, cfg = load_hf_folder(folder)
    return request.param, hf_model, ours, cfg


def _hf_logits(hf_model, ids):
    with torch.no_grad():
        return hf_model(torch.tensor(ids)).logits.numpy()


def _our_logits(model, ids):
    ids = jnp.asarray(ids)
    hidden, _ = model(ids, jnp.broadcast_to(jnp.arange(ids.shape[1]), ids.shape))
    return np.asarray(model.logits(hidden))


def _with_config(model, cfg):
    """The same weights under another config of the same parameter structure."""
    graphdef, _ = nnx.split(abstract_model(cfg))
    return nnx.merge(graphdef, nnx.state(model))


@pytest.mark.slow
def test_logits_match_transformers(hf_pair):
    name, hf_model, ours, cfg = hf_pair
    ids = np.random.RandomState(1).randint(0, cfg.vocab_size, (3, 40))  # longer than windows and 16
    ref = _hf_logits(hf_model, ids)
    got = _our_logits(ours, ids)
    assert np.abs(ref).max() > 1.0  # the comparison is not between near-zero numbers
    np.testing.assert_allclose(got, ref, atol=1e-4, rtol=0)
    ours.attention_block = 8  # blockwise attention (model/attention.py) over 5 blocks of the 40 keys
    try:
        np.testing.assert_allclose(_our_logits(ours, ids), ref, atol=1e-4, rtol=0)
    finally:
        ours.attention_block = 512
    for change in ABLATIONS.get(name, []):
        other = _our_logits(_with_config(ours, cfg.replace(**change)), ids)
        assert np.abs(other - ref).max() > 1e-2, f"{name}: {change} does not change the logits"


@pytest.mark.slow
def test_greedy_32_tokens_match_generate(hf_pair):
    name, hf_model, ours, cfg = hf_pair
    hf_model.generation_config.eos_token_id = None  # no stop tokens on either side
    sampler, state = Sampler.for_model(ours, pad_id=0, stop_ids=())
    prompts = [[5, 17, 3, 99, 42, 7, 8], [11, 12, 13], list(range(20, 40))]
    out = sampler(state, prompts, max_new_tokens=32, temperature=0.0)
    for i, p in enumerate(prompts):
        with torch.no_grad():
            ref = hf_model.generate(torch.tensor([p]), max_new_tokens=32, do_sample=False, pad_token_id=0, attention_mask=torch.ones(1, len(p), dtype=torch.long))
        assert out.generated(i) == ref[0, len(p):].tolist(), f"{name}: row {i} differs from transformers"


def test_export_loads_in_transformers(hf_pair, tmp_path):
    name, hf_model, ours, cfg = hf_pair
    export_hf_folder(ours, tmp_path / "exported")
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "exported", dtype=torch.float32).eval()
    assert type(reloaded) is type(hf_model)
    ids = np.random.RandomState(2).randint(0, cfg.vocab_size, (2, 16))
    np.testing.assert_allclose(_hf_logits(reloaded, ids), _hf_logits(hf_model, ids), atol=1e-5, rtol=0)


@pytest.mark.slow
def test_bfloat16_params_follow_float32(hf_pair):
    """bfloat16 weights with float32 softmax/logits stay close to the float32 model."""
    name, hf_model, ours, cfg = hf_pair
    from jaxrl_llm.model.hf_io import load_hf_folder as load
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        hf_model.save_pretrained(d)
        bf16, _ = load(d, param_dtype="bfloat16")
    assert jax.tree.leaves(bf16)[0].dtype == jnp.bfloat16
    ids = np.random.RandomState(3).randint(0, cfg.vocab_size, (2, 12))
    got = _our_logits(bf16, ids)
    assert got.dtype == np.float32
    ref = _hf_logits(hf_model, ids)
    assert np.abs(got - ref).max() < 0.05 * np.abs(ref).max()
