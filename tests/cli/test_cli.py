"""The command line on a tiny local model folder (with a tokenizer and chat template)."""

import pytest

from tests.helpers import byte_bpe_tokenizer, hf_tokenizer
from jaxrl_llm.cli import main
from jaxrl_llm.model.hf_io import export_hf_folder
from jaxrl_llm.model.transformer import init_model


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory):
    from tests.helpers import TINY
    tok = hf_tokenizer(byte_bpe_tokenizer())
    model = init_model(TINY.replace(vocab_size=len(tok), eos_token_ids=(tok.eos_token_id,)), seed=1)
    return export_hf_folder(model, tmp_path_factory.mktemp("cli") / "tiny", tokenizer=tok)


@pytest.mark.slow
def test_sample_prints_completions(model_folder, capsys):
    assert main(["sample", "--model", str(model_folder), "--prompt", "What is 2 + 2?", "--num-samples", "3",
                 "--max-new-tokens", "8"]) == 0
    out, err = capsys.readouterr()
    assert out.count("--- sample ") == 3
    assert "new tokens in" in err and "programs compiled" in err


def test_unknown_model_is_a_clear_error(capsys):
    assert main(["sample", "--model", "nope"]) == 2
    assert "'nope' is neither a model folder nor a known short name" in capsys.readouterr().err
