"""`jaxrl-llm bench step` on a tiny run: both layouts time the same rows, the plain one at its own
micro-batch when asked, and the FLOP counts follow the batch shapes."""

from __future__ import annotations

import pytest

from jaxrl_llm.bench.step_bench import bench, table
from tests.helpers import tiny_cfg

pytestmark = pytest.mark.slow  # integration runs: tools/test.sh runs them, `-m "not slow"` leaves them out


def test_step_bench_layouts_and_flops(tmp_path):
    cfg = tiny_cfg(tmp_path, "rollout.max_new_tokens=4", "rollout.temperature=1.0")
    out = bench(cfg, repeats=1, log=lambda *a: None, unshared_micro_batch=16)
    s, u = out["shared"], out["unshared"]
    assert (s["micro_batch_rows"], u["micro_batch_rows"]) == (32, 16)
    # shared: 2 micro-batches of 32 rows = 2 groups of 16 each; rows carry only their own tokens
    m, g, lc = s["batch_shapes"]["ctx_tokens"]
    _, r, ls = s["batch_shapes"]["tokens"]
    assert (m, g, r) == (2, 2, 32)
    n, length = u["batch_shapes"]["tokens"]
    assert n == 64
    # positions by hand: every context slot plus each row's tokens but its last; the plain rows all but one
    assert s["update_positions"] == m * g * lc + m * r * (ls - 1)
    assert s["update_head_positions"] == m * r * ls
    assert u["update_positions"] == u["update_head_positions"] == n * (length - 1)
    for r_ in (s, u):
        assert r_["update_model_gflop"] > 0 and r_["update_s"] > 0 and r_["update_peak_gib"] > 0
    assert out["ratios"]["update_model_gflop"] == pytest.approx(s["update_model_gflop"] / u["update_model_gflop"])
    assert out["ratios"]["update_model_gflop"] < 1
    text = table(out)
    assert "| micro-batch, rows | 16 | 32 | |" in text
    with pytest.raises(ValueError, match="unshared-micro-batch 24"):
        bench(cfg, repeats=1, log=lambda *a: None, unshared_micro_batch=24)
