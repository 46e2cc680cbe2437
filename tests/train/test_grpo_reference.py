"""Plain GRPO through the exploration seam equals the trainer before the seam existed.

The reference (tests/data/grpo_reference.*) was recorded with the pre-seam trainer (commit 5b54133)
by `python -m tests.train.test_grpo_reference --record`: three RL steps of a tiny scratch model (two
minibatches, so the minibatch permutation is exercised), every non-timing train metric and every
parameter afterwards. The run compared is made in its own process (`--run DIR`) at XLA's default optimisation
level, as it was recorded: the suite's own processes compile at -O0 (tests/conftest.py), which moves last bits."""

import json
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from jaxrl_llm.train.loop import Run
from tests.helpers import ROOT, subprocess_env, tiny_cfg, train_rows

pytestmark = pytest.mark.slow  # integration runs: tools/test.sh runs them, `-m "not slow"` leaves them out

DATA = Path(__file__).resolve().parents[1] / "data"
EXTRAS = ("train.steps=3", "sft.steps=8", "sft.batch_size=16", "sft.lr=0.01", "rollout.prompts_per_step=4", "rollout.group_size=4", "rollout.max_new_tokens=3",
          "algo.minibatches=2", "algo.micro_batch=8", "optim.lr=0.01", "train.checkpoint_every=100")
# keys that did not exist when the reference was recorded (new metrics are allowed, changed ones are not)
NEW_KEYS = ()


def _flat_params(params) -> dict:
    leaves = jax.tree_util.tree_flatten_with_path(params)[0]
    return {jax.tree_util.keystr(p): np.asarray(jax.device_get(v), np.float32) for p, v in leaves}


def _reference_run(tmp: Path):
    run = Run(tiny_cfg(tmp, *EXTRAS), log=lambda *a: None)
    run.train()
    return train_rows(run.cfg.train.out_dir), _flat_params(run.state.params)


def test_plain_grpo_through_the_seam_matches_the_recorded_trainer(tmp_path):
    env = subprocess_env(fast_compile=False, XLA_FLAGS="--xla_force_host_platform_device_count=8")
    out = subprocess.run([sys.executable, "-m", "tests.train.test_grpo_reference", "--run", str(tmp_path)], cwd=ROOT,
                         env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = {int(k): v for k, v in json.loads((tmp_path / "rows.json").read_text()).items()}
    params = dict(np.load(tmp_path / "params.npz"))
    want_rows = json.loads((DATA / "grpo_reference.json").read_text())
    want_params = dict(np.load(DATA / "grpo_reference_params.npz"))
    assert sorted(rows) == sorted(int(s) for s in want_rows)
    for step, want in want_rows.items():
        got = rows[int(step)]
        for k, v in want.items():
            if isinstance(v, float):
                np.testing.assert_allclose(got[k], v, rtol=1e-5, atol=1e-6, err_msg=f"step {step} {k}")
            else:
                assert got[k] == v, (step, k, got[k], v)
    assert sorted(params) == sorted(want_params)
    # The recording was made on another CPU, whose vector width sums in another order. Adam divides each
    # gradient element by its own scale, so where a gradient is near zero a last-bit difference moves that
    # one parameter by up to a few 1e-6 (seen: 1 element of 2048 off by 1.1e-6). A changed update moves
    # most parameters by ~lr (1e-2): all within lr / 100, and 99.9 % within rtol 1e-5 + atol 1e-6
    for k, v in want_params.items():
        d = np.abs(params[k] - v)
        off = d > 1e-6 + 1e-5 * np.abs(v)
        assert d.max() < 1e-4 and off.mean() <= 1e-3, (k, d.max(), int(off.sum()), off.size)


if __name__ == "__main__" and "--run" in sys.argv:  # the test's run, in a process of its own
    out = Path(sys.argv[sys.argv.index("--run") + 1])
    rows, params = _reference_run(out / "run")
    (out / "rows.json").write_text(json.dumps({str(k): v for k, v in rows.items()}))
    np.savez(out / "params.npz", **params)

if __name__ == "__main__" and "--record" in sys.argv:
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        rows, params = _reference_run(Path(d))
    DATA.mkdir(exist_ok=True)
    (DATA / "grpo_reference.json").write_text(json.dumps({str(k): v for k, v in rows.items()}, indent=1) + "\n")
    np.savez_compressed(DATA / "grpo_reference_params.npz", **params)
    print("recorded", len(rows), "steps,", len(params), "parameter arrays")
