"""load_tokenizer against transformers' AutoTokenizer (the oracle): the same class and the same encodings, special
ids and chat prompts, whether the folder names the generic class (loaded without AutoTokenizer's registry) or
a class of its own (loaded by AutoTokenizer)."""

import json
import subprocess
import sys

import pytest

from jaxrl_llm.model.tokenizer import load_tokenizer
from tests.helpers import ROOT, byte_bpe_tokenizer, hf_tokenizer

TEXTS = ["Hello <|im_start|> world 12+3=15\n", "  spaced\tand tabbed ünïcode", ""]
CHATS = [[{"role": "user", "content": "2 + 2?"}],
         [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"},
          {"role": "assistant", "content": "hello"}, {"role": "user", "content": "3 + 5?"}]]


def _folder(tmp_path, tokenizer_class=None, **extra):
    folder = tmp_path / "tok"
    hf_tokenizer(byte_bpe_tokenizer()).save_pretrained(str(folder))
    path = folder / "tokenizer_config.json"
    config = json.loads(path.read_text())
    assert config["tokenizer_class"] in ("TokenizersBackend", "PreTrainedTokenizerFast")  # what save_pretrained names
    if tokenizer_class:
        config["tokenizer_class"] = tokenizer_class
    path.write_text(json.dumps({**config, **extra}))
    return folder


@pytest.mark.parametrize("tokenizer_class", [None, "PreTrainedTokenizerFast", "GPT2Tokenizer"])
def test_load_tokenizer_equals_autotokenizer(tmp_path, tokenizer_class):
    from transformers import AutoTokenizer

    folder = _folder(tmp_path, tokenizer_class)
    want, got = AutoTokenizer.from_pretrained(str(folder), local_files_only=True), load_tokenizer(folder)
    assert type(got) is type(want)
    for text in TEXTS:
        assert got(text)["input_ids"] == want(text)["input_ids"]
        assert got(text, add_special_tokens=False)["input_ids"] == want(text, add_special_tokens=False)["input_ids"]
    assert (got.pad_token_id, got.eos_token_id, got.bos_token_id) == (want.pad_token_id, want.eos_token_id,
                                                                      want.bos_token_id)
    for chat in CHATS:
        assert (got.apply_chat_template(chat, add_generation_prompt=True)
                == want.apply_chat_template(chat, add_generation_prompt=True))


def test_a_generic_folder_loads_without_importing_torch(tmp_path):
    """Where torch is installed, AutoTokenizer's registry imports it (seconds of every process's start); the generic
    path does not. A folder with remote code (`auto_map`) still goes through AutoTokenizer."""
    pytest.importorskip("torch")
    plain = _folder(tmp_path)
    probe = ("import sys; from jaxrl_llm.model.tokenizer import load_tokenizer; "
             f"load_tokenizer({str(plain)!r}); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0 and out.stdout.split() == ["False"], out.stderr[-2000:]
    from jaxrl_llm.model.tokenizer import _generic

    assert _generic(plain)
    remote = _folder(tmp_path / "remote", auto_map={"AutoTokenizer": ["tok.MyTokenizer", None]})
    assert not _generic(remote)
    (plain / "tokenizer_config.json").write_text("{not json")
    assert not _generic(plain)  # AutoTokenizer reads it and gives the error
