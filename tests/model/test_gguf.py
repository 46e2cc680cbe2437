"""GGUF import: a synthetic llama GGUF written with the `gguf` package round-trips to the same model
and tokenizer; unsupported files are refused with a clear error."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize, quantize

from jaxrl_llm.model.config import UnsupportedModelError
from jaxrl_llm.model.gguf_io import load_gguf, load_gguf_tokenizer, permute_qk, unpermute_qk
from jaxrl_llm.model.hf_io import CheckpointError, build_model, weight_map
from jaxrl_llm.model.transformer import init_model
from tests.helpers import TINY, byte_bpe_tokenizer, torch_or_skip, write_gguf

def _hf_arrays(model):
    pure = nnx.to_pure_dict(nnx.state(model))
    out = {}
    for path, name, _, to_hf in weight_map(model.cfg):
        leaf = pure
        for k in path:
            leaf = leaf[k]
        out[name] = np.asarray(to_hf(np.asarray(leaf)), np.float32)
    return out




@pytest.fixture(scope="module")
def setup():
    tok = byte_bpe_tokenizer()
    cfg = TINY.replace(vocab_size=tok.get_vocab_size(), tie_embeddings=False)
    model = init_model(cfg, seed=5)
    nnx.update(model, jax.tree.map(lambda x: x * 6.0 if x.ndim > 1 else x, nnx.state(model)))
    return tok, cfg, model, _hf_arrays(model)


def _logits(model, ids):
    ids = jnp.asarray(ids)
    h, _ = model(ids, jnp.broadcast_to(jnp.arange(ids.shape[1]), ids.shape))
    return np.asarray(model.logits(h))


def test_permutation_inverts():
    w = np.random.RandomState(0).randn(4 * 16, 24)
    assert np.array_equal(unpermute_qk(permute_qk(w, 4), 4), w)
    assert not np.array_equal(permute_qk(w, 4), w)


@pytest.mark.slow
def test_gguf_round_trip_weights_and_logits(setup, tmp_path):
    tok, cfg, model, arrays = setup
    path = tmp_path / "tiny.gguf"
    write_gguf(path, cfg, arrays, tok, quantized={"blk.1.ffn_up.weight"})
    loaded, got_cfg = load_gguf(path)
    assert got_cfg.num_layers == cfg.num_layers and got_cfg.num_kv_heads == cfg.num_kv_heads
    assert got_cfg.vocab_size == cfg.vocab_size and not got_cfg.tie_embeddings
    # oracle: the original weights, with the one Q8_0 tensor as the gguf package dequantises it
    up = arrays["model.layers.1.mlp.up_proj.weight"]
    expected = dict(arrays)
    expected["model.layers.1.mlp.up_proj.weight"] = dequantize(quantize(up, GGMLQuantizationType.Q8_0),
                                                               GGMLQuantizationType.Q8_0)
    assert np.abs(expected["model.layers.1.mlp.up_proj.weight"] - up).max() > 0  # really quantised
    reference = build_model(cfg, expected, source="expected")
    ids = np.random.RandomState(0).randint(0, cfg.vocab_size, (2, 14))
    np.testing.assert_allclose(_logits(loaded, ids), _logits(reference, ids), atol=1e-5, rtol=0)


def test_gguf_tokenizer_and_chat_template(setup, tmp_path):
    tok, cfg, model, arrays = setup
    path = tmp_path / "tok.gguf"
    write_gguf(path, cfg, arrays, tok)
    hf_tok = load_gguf_tokenizer(path)
    for text in ["What is 12 + 35?", "The lazy dog answers: 47.", "unseen words zq!"]:
        assert hf_tok(text, add_special_tokens=False)["input_ids"] == tok.encode(text).ids
    msgs = [{"role": "user", "content": "What is 2 + 2?"}]
    rendered = hf_tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert rendered == "<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n<|im_start|>assistant\n"
    assert hf_tok.eos_token == "<|im_end|>"


def test_unsupported_architecture_is_refused(setup, tmp_path):
    tok, cfg, model, arrays = setup
    path = tmp_path / "gpt2.gguf"
    write_gguf(path, cfg, arrays, tok, arch="gpt2")
    with pytest.raises(UnsupportedModelError, match=r"gpt2\.gguf: GGUF architecture 'gpt2' is not supported"):
        load_gguf(path)


def test_unsupported_tensor_type_names_the_tensor(setup, tmp_path):
    tok, cfg, model, arrays = setup
    path = tmp_path / "q81.gguf"
    block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType.Q8_1]
    raw = np.zeros((cfg.intermediate_size, cfg.hidden_size // block * type_size), np.uint8)
    write_gguf(path, cfg, arrays, tok, raw_override={"blk.0.ffn_up.weight": (raw, GGMLQuantizationType.Q8_1)})
    with pytest.raises(UnsupportedModelError, match=r"'blk\.0\.ffn_up\.weight' has GGUF type Q8_1"):
        load_gguf(path)


@pytest.mark.slow
def test_gguf_matches_transformers_gguf_reader(setup, tmp_path):
    """transformers' own GGUF reader (its own Q/K un-permutation) is the oracle, not our permute_qk."""
    torch = torch_or_skip()
    from transformers import AutoModelForCausalLM

    tok, cfg, model, arrays = setup
    write_gguf(tmp_path / "tiny.gguf", cfg, arrays, tok, quantized={"blk.1.ffn_up.weight"})
    ref_model = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file="tiny.gguf", dtype=torch.float32).eval()
    ours, _ = load_gguf(tmp_path / "tiny.gguf")
    ours_hf = _hf_arrays(ours)
    ref_sd = {k: v.numpy() for k, v in ref_model.state_dict().items()}
    for name in ["model.layers.0.self_attn.q_proj.weight", "model.layers.1.self_attn.k_proj.weight"]:
        np.testing.assert_allclose(ours_hf[name], ref_sd[name], atol=1e-6, rtol=0, err_msg=name)
        # the file holds permuted rows that transformers' layout differs from: an identity
        # unpermute_qk (ours = the file's rows) could not pass the check above
        in_file = permute_qk(arrays[name], cfg.num_heads if "q_proj" in name else cfg.num_kv_heads)
        assert np.abs(ref_sd[name] - in_file).max() > 0.1
    ids = np.random.RandomState(4).randint(0, cfg.vocab_size, (2, 24))
    with torch.no_grad():
        ref = ref_model(torch.tensor(ids)).logits.numpy()
    assert np.abs(ref).max() > 1.0
    np.testing.assert_allclose(_logits(ours, ids), ref, atol=1e-4, rtol=0)


def test_unmapped_gguf_tensor_is_refused(setup, tmp_path):
    """llama3-scaled GGUFs carry rope_freqs.weight; importing without it would run plain RoPE."""
    tok, cfg, model, arrays = setup
    path = tmp_path / "freqs.gguf"
    write_gguf(path, cfg, arrays, tok, extra={"rope_freqs.weight": np.ones(cfg.head_dim // 2, np.float32)})
    with pytest.raises(UnsupportedModelError, match=r"freqs\.gguf: 1 GGUF tensor\(s\) .*'rope_freqs\.weight'"):
        load_gguf(path)


@pytest.mark.parametrize("keep", [0.5, 0.999, 40])
def test_truncated_gguf_is_one_line_naming_the_file(setup, tmp_path, keep):
    tok, cfg, model, arrays = setup
    path = tmp_path / "cut.gguf"
    write_gguf(path, cfg, arrays, tok)
    data = path.read_bytes()
    path.write_bytes(data[:int(len(data) * keep) if keep < 1 else keep])
    with pytest.raises(CheckpointError) as err:
        load_gguf(path)
    message = str(err.value)
    assert message.startswith(f"{path}: not a readable GGUF file, truncated or corrupt? (")
    assert "\n" not in message and isinstance(err.value, ValueError)
