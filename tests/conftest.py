"""Shared fixtures: tiny models built here (no hub), 8 fake CPU devices, a persistent compile cache."""

import functools
import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

from pathlib import Path  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import pytest  # noqa: E402
from flax import nnx  # noqa: E402

# JAXRL_TEST_JAX_CACHE: another folder (an empty one measures the suite as CI's fresh checkout runs it)
CACHE_DIR = os.environ.get("JAXRL_TEST_JAX_CACHE", str(Path(__file__).resolve().parents[1] / ".cache" / "jax"))
jax.config.update("jax_compilation_cache_dir", CACHE_DIR)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)

from jaxrl_llm.model.config import ModelConfig  # noqa: E402
from jaxrl_llm.model.transformer import init_model  # noqa: E402
from jaxrl_llm.sampling.sampler import Sampler  # noqa: E402

TINY = ModelConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                   num_kv_heads=2, head_dim=16, rope_theta=500.0, max_position_embeddings=256)


CHAT = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TEXT = ["The quick brown fox jumps over the lazy dog.", "What is 12 + 35? The answer is 47.",
        "Reasoning step by step: first add the tens, then the ones."] * 20


def byte_bpe_tokenizer():
    """A small byte-level BPE (`tokenizers.Tokenizer`) trained here, with chat special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(TEXT, trainer)
    return tok


def hf_tokenizer(tok):
    """The same tokenizer as a transformers fast tokenizer with a chat template."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", bos_token="<|im_start|>",
                                   pad_token="<|endoftext|>", chat_template=CHAT)


@functools.partial(jax.jit, static_argnums=0)
def forward_logits(graphdef, state, ids):
    """Logits [B, T, V] of a plain causal forward of our model, as one compiled program (an oracle run eagerly
    compiles each of its ops on its own: hundreds of small programs per test)."""
    model = nnx.merge(graphdef, state)
    hidden, _ = model(ids, jnp.arange(ids.shape[1])[None])
    return model.logits(hidden)


def torch_or_skip():
    return pytest.importorskip("torch", reason="torch is the test oracle; install the test extra (torch==2.13.0)")


@pytest.fixture(scope="session")
def tiny_model():
    """Random tiny Llama-style model whose logits are sharp enough to make sampling tests informative."""
    model = init_model(TINY, seed=3)
    state = nnx.state(model)
    nnx.update(model, jax.tree.map(lambda x: x * 8.0 if x.ndim > 1 else x, state))
    return model


@pytest.fixture(scope="session")
def tiny_sampler(tiny_model):
    return Sampler.for_model(tiny_model, pad_id=0, stop_ids=())


# Modules whose tests share an expensive module-scoped run: with `pytest -n N --dist loadgroup` (tools/test.sh)
# each goes to one worker whole, so the run is built once, not once per worker that gets some of its tests.
SHARED_RUN_MODULES = {"test_trainer.py", "test_run_dir.py", "test_eval_export.py", "test_tracking.py",
                      "test_memory_bench.py", "test_real_model.py", "test_explore_correctness.py"}


def pytest_collection_modifyitems(items):
    for item in items:
        if item.path.name in SHARED_RUN_MODULES:
            item.add_marker(pytest.mark.xdist_group(item.path.stem))
