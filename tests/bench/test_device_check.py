"""tools/device_check.sh's module on CPU (--quick): every figure is produced and consistent; the roofline
table finds the accelerators by their jax device_kind."""

from __future__ import annotations

import json
import pytest

from jaxrl_llm.bench.device_check import PEAKS, TINY, main, peaks


def test_peaks_by_device_kind():
    assert peaks("NVIDIA H200") == PEAKS["H200"] and peaks("NVIDIA H100 80GB HBM3") == PEAKS["H100"]
    assert peaks("TPU v5 lite") == PEAKS["TPU v5 lite"] and peaks("TPU v5p") == PEAKS["TPU v5p"]
    assert peaks("cpu") is None and peaks("Some New Chip") is None


@pytest.mark.slow
def test_quick_device_check_on_cpu(tmp_path, capsys):
    out = tmp_path / "dc.json"
    assert main(["--quick", "--json", str(out)]) == 0
    r = json.loads(out.read_text())
    d, u = r["decode"], r["update"]
    assert r["platform"] == "cpu" and "roofline_fraction" not in d and "mfu" not in u  # no peak for a CPU
    assert d["tokens_per_s"] > 0 and d["step_ms"] > 0
    # every decode step reads every bf16 weight at least once
    weights = 2 * (TINY["vocab_size"] * TINY["hidden_size"] + TINY["num_layers"] * (
        TINY["hidden_size"] * TINY["head_dim"] * (2 * TINY["num_heads"] + 2 * TINY["num_kv_heads"])
        + 3 * TINY["hidden_size"] * TINY["intermediate_size"]))
    assert d["bytes_per_step"] > weights
    assert u["rows"] == 8 and u["update_s"] > 0 and u["model_tflop"] > 0
    text = capsys.readouterr().out
    assert "sampler decode:" in text and "update:" in text and "device check took" in text
