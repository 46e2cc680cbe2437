"""`bench memory`: XLA's memory analysis of the compiled (never run) update program, on a tiny model."""

import json

import pytest

from jaxrl_llm.bench.memory import main, report, update_memory
from jaxrl_llm.config import load_config

pytestmark = pytest.mark.slow  # integration runs: tools/test.sh runs them, `-m "not slow"` leaves them out

TINY = ["model.name=scratch", "model.scratch={hidden_size: 32, intermediate_size: 64, num_layers: 1, num_heads: 2, "
        "num_kv_heads: 2, head_dim: 16, max_position_embeddings: 96, tie_embeddings: true}",
        "data.max_prompt_len=40", "rollout.prompts_per_step=4", "rollout.group_size=16", "rollout.max_new_tokens=3"]


@pytest.fixture(scope="module")
def rows():
    """Rows layout, 64 rows per update in micro-batches of 32 and of 16 rows, one device."""
    return {mb: update_memory(load_config(None, TINY + ["rollout.shared_prefix=false", f"algo.micro_batch={mb}"]))
            for mb in (32, 16)}


def test_rows_layout_facts_are_the_trainers(rows):
    r = rows[32]
    # prefill bucket of 40 -> 64, new-token bucket of 3 -> 16 (the minimum): the sampler's buffer, by hand
    assert r["row_length"] == 64 + 16 and r["layout"] == "rows"
    assert r["batch_shapes"]["tokens"] == [64, 80] and r["batch_shapes"]["advantages"] == [64]
    assert (r["rows_per_update"], r["micro_batches"], r["rows_per_micro_batch"]) == (64, 2, 32)
    assert rows[16]["micro_batches"] == 4 and r["vocab"] > 50 and r["devices"] == 1


def test_temporaries_hold_at_least_one_micro_batch_of_whole_logits(rows):
    for mb, r in rows.items():
        logits = mb * (r["row_length"] - 1) * r["vocab"] * 4  # float32 [rows, L - 1, vocab]
        assert r["logits_bytes_per_micro_batch"] == logits
        assert r["temp_bytes"] >= logits, (mb, r["temp_bytes"], logits)
        assert r["peak_bytes"] == r["argument_bytes"] + r["temp_bytes"] + r["output_bytes"] - r["alias_bytes"]
    # halving the micro-batch at the same rows per update frees at least the logits of the rows it drops
    freed = rows[32]["temp_bytes"] - rows[16]["temp_bytes"]
    assert freed >= rows[32]["logits_bytes_per_micro_batch"] - rows[16]["logits_bytes_per_micro_batch"] > 0
    # parameters and optimizer state are donated: their bytes alias the outputs
    assert 0 < rows[32]["alias_bytes"] <= rows[32]["output_bytes"]


def test_shared_layout_on_a_sharded_mesh(rows, capsys):
    """The trainer's default layout, on fsdp 4 x tensor 2 (conftest's 8 fake CPU devices): the batch is the
    trainer's, and each device holds a fraction of the donated parameters and Adam moments one device holds."""
    assert main(TINY + ["algo.micro_batch=32", "mesh.data=1", "mesh.fsdp=4", "mesh.tensor=2", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["layout"] == "shared" and r["devices"] == 8 and r["mesh"] == {"data": 1, "fsdp": 4, "tensor": 2}
    # 2 micro-batches of 32 rows; each holds 2 groups of 16 rows, so 2 contexts of bucket(40) = 64 tokens,
    # and each row only its own bucket(3, min 8) = 8 tokens
    shapes = r["batch_shapes"]
    assert shapes["ctx_tokens"] == [2, 2, 64] and shapes["tokens"] == [2, 32, 8] and shapes["row_ctx"] == [2, 32]
    assert (r["micro_batches"], r["rows_per_micro_batch"]) == (2, 32) and r["temp_bytes"] > 0
    assert 0 < r["alias_bytes"] < rows[32]["alias_bytes"] / 3
    text = report(r)
    assert "8 cpu device(s)" in text and "temporaries" in text and "shared layout" in text
