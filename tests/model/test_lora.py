"""LoRA adapters (model/lora.py): the forward against the merged weights computed in numpy, and the adapter in
PEFT's format against peft + transformers (the adapter loaded onto the transformers base gives our logits; our
merged export loads in transformers with the same logits)."""

import numpy as np
import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from tests.helpers import TINY, forward_logits, torch_or_skip, with_random_adapters
from jaxrl_llm.model import lora
from jaxrl_llm.model.transformer import init_model

SPEC = lora.LoraSpec(rank=4, alpha=8.0, targets=tuple(lora.TARGETS))
IDS = np.array([[5, 17, 33, 2, 90, 41, 7, 12, 64, 3]], np.int32)


def _logits(model):
    graphdef, state = nnx.split(model)
    return np.asarray(forward_logits(graphdef, state, jnp.asarray(IDS)))


def test_fresh_adapters_change_nothing_and_trained_ones_equal_the_merged_weights():
    """Oracle: the base model whose weights are W + alpha / rank A B, merged here in numpy by hand."""
    base_logits = _logits(init_model(TINY, seed=3))
    fresh = lora.add_adapters(init_model(TINY, seed=3), SPEC, seed=1)
    np.testing.assert_array_equal(_logits(fresh), base_logits)  # B = 0: exactly the base
    adapted = with_random_adapters(init_model(TINY, seed=3), SPEC.rank, SPEC.alpha)
    merged = init_model(TINY, seed=3)
    for i, layer in enumerate(adapted.layers):
        for target in SPEC.targets:
            sub, name = lora.TARGETS[target][:2]
            module = getattr(layer, sub)
            w = np.asarray(getattr(module, name)[...], np.float64)
            a = np.asarray(getattr(module, f"{name}_lora_a")[...], np.float64)
            b = np.asarray(getattr(module, f"{name}_lora_b")[...], np.float64)
            by_hand = w + SPEC.alpha / SPEC.rank * (a.reshape(-1, SPEC.rank) @ b.reshape(SPEC.rank, -1)).reshape(w.shape)
            getattr(getattr(merged.layers[i], sub), name)[...] = jnp.asarray(by_hand, jnp.float32)
    ours, oracle = _logits(adapted), _logits(merged)
    assert np.abs(oracle - base_logits).max() > 0.1  # the adapters matter
    np.testing.assert_allclose(ours, oracle, atol=2e-5)


def test_only_named_targets_get_adapters_and_bad_specs_are_refused():
    model = lora.add_adapters(init_model(TINY, seed=0), lora.LoraSpec(2, 4.0, ("q_proj", "down_proj")))
    assert lora.spec_of(model) == lora.LoraSpec(2, 4.0, ("q_proj", "down_proj"))
    params = nnx.state(model)
    names = sorted({jax.tree_util.keystr(p).split("'")[-2] for p, _ in
                    jax.tree_util.tree_leaves_with_path(lora.trainable(params))})
    assert names == ["down_lora_a", "down_lora_b", "q_lora_a", "q_lora_b"]
    assert len(jax.tree.leaves(lora.trainable(params))) == 4 * TINY.num_layers
    whole = lora.combine(lora.trainable(params), lora.frozen(params))
    assert jax.tree.structure(whole) == jax.tree.structure(params)
    plain = nnx.state(init_model(TINY, seed=0))
    assert lora.trainable(plain) is plain and lora.frozen(plain) is None
    with pytest.raises(ValueError, match="unknown: qkv"):
        lora.LoraSpec(2, 4.0, ("qkv",)).check()
    with pytest.raises(ValueError, match="rank"):
        lora.LoraSpec(0, 4.0, ("q_proj",)).check()


@pytest.mark.slow
def test_peft_loads_our_adapter_and_transformers_our_merged_export(tmp_path):
    """Qwen2 with q/k/v biases, adapters on every projection: the PEFT folder loaded by peft onto the
    transformers base, and our merged HF export loaded by transformers, give our logits."""
    torch = torch_or_skip()
    peft = pytest.importorskip("peft", reason="peft is the adapter format's oracle; install the test extra")
    from transformers import AutoModelForCausalLM, Qwen2Config, Qwen2ForCausalLM

    from jaxrl_llm.model.hf_io import export_hf_folder, load_hf_folder

    torch.manual_seed(0)
    hf = Qwen2ForCausalLM(Qwen2Config(vocab_size=113, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
                                      attn_implementation="eager")).eval()
    hf.save_pretrained(tmp_path / "base")
    ours, _ = load_hf_folder(tmp_path / "base")
    with_random_adapters(ours, rank=4, alpha=16.0, scale=0.5)
    ours_logits = _logits(ours)
    with torch.no_grad():
        base_logits = hf(torch.tensor(IDS)).logits.numpy()
    assert np.abs(ours_logits - base_logits).max() > 0.05

    for _, _, module, _ in lora.adapted(ours):
        module.lora_dropout = 0.1  # PEFT's lora_dropout; eval mode (and our logits) run without it
    lora.save_peft_adapter(ours, tmp_path / "adapter", base_model=str(tmp_path / "base"))
    with_peft = peft.PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tmp_path / "base"),
                                               tmp_path / "adapter").eval()
    assert with_peft.peft_config["default"].lora_dropout == 0.1
    with torch.no_grad():
        peft_logits = with_peft(torch.tensor(IDS)).logits.numpy()
    np.testing.assert_allclose(peft_logits, ours_logits, atol=1e-4)

    export_hf_folder(ours, tmp_path / "merged")
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged", dtype=torch.float32).eval()
    with torch.no_grad():
        np.testing.assert_allclose(merged(torch.tensor(IDS)).logits.numpy(), ours_logits, atol=1e-4)


def test_dropout_zeroes_the_adapters_input_at_its_rate_and_only_given_a_key():
    """PEFT's lora_dropout on the adapters' input: with identity adapters (A = B = I, scale 1, y = 0) `add` returns
    the dropped-out input itself, so every element is 0 or x / (1 - p), zeroed at rate p (binomial: within 4.5
    standard deviations), a fresh mask per projection and per key, the same for the same key; no key: x."""
    import types

    d, rate = 64, 0.3
    eye = jnp.eye(d, dtype=jnp.float32)
    module = types.SimpleNamespace(q_lora_a=eye, q_lora_b=eye, k_lora_a=eye, k_lora_b=eye, lora_scale=1.0,
                                   lora_dropout=rate)
    x = jax.random.uniform(jax.random.key(0), (32, 16, d), minval=0.5, maxval=1.5)
    zero = jnp.zeros_like(x)
    key = np.asarray(jax.random.key_data(jax.random.key(7)))
    out = np.asarray(lora.add(module, "q", x, zero, key))
    kept = out != 0
    np.testing.assert_allclose(out[kept], np.asarray(x)[kept] / (1 - rate), rtol=1e-6)
    n = x.size
    assert abs((~kept).sum() - rate * n) < 4.5 * np.sqrt(n * rate * (1 - rate)), (~kept).mean()
    np.testing.assert_array_equal(out, np.asarray(lora.add(module, "q", x, zero, key)))  # same key, same mask
    other_key = np.asarray(jax.random.key_data(jax.random.key(8)))
    for other in (lora.add(module, "k", x, zero, key), lora.add(module, "q", x, zero, other_key)):
        same = (np.asarray(other) != 0) == kept
        assert 0.5 < same.mean() < 0.7, same.mean()  # independent masks agree on p^2 + (1-p)^2 = 0.58
    np.testing.assert_allclose(np.asarray(lora.add(module, "q", x, zero)), np.asarray(x), rtol=1e-6)
    module.lora_dropout = 0.0
    np.testing.assert_allclose(np.asarray(lora.add(module, "q", x, zero, key)), np.asarray(x), rtol=1e-6)


def test_a_dropout_rate_changes_nothing_outside_the_training_forward():
    """Sampling, evaluation and the reference call the model without a key: its logits with adapters of dropout 0.5
    are those of the same adapters without dropout, bit for bit; the spec and PEFT's config carry the rate."""
    plain = with_random_adapters(init_model(TINY, seed=0))
    dropped = with_random_adapters(init_model(TINY, seed=0))
    for _, _, module, _ in lora.adapted(dropped):
        module.lora_dropout = 0.5
    np.testing.assert_array_equal(np.asarray(_logits(plain)), np.asarray(_logits(dropped)))
    assert lora.spec_of(dropped).dropout == 0.5 and lora.spec_of(plain).dropout == 0.0
    with pytest.raises(ValueError, match="dropout"):
        lora.LoraSpec(2, 4.0, ("q_proj",), dropout=1.0).check()
