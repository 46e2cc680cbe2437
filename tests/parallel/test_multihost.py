"""Multi-host (multi-controller) training: two real `jaxrl-llm train` processes on localhost, 4 fake CPU
devices each, joined by jax.distributed into one 8-device mesh, train exactly what one process with 8
devices trains (E3, RRL and HeRL on: explorer decisions and state must agree across hosts); a SIGTERM to
one of them stops both at the same step with a checkpoint (exit 75), and the pair resumes from it and
ends with the same result. The oracle is the single-process trainer, itself tested against brute force and transformers."""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest
import yaml
from flax import nnx

from jaxrl_llm.train.loop import Run
from jaxrl_llm.train.stop import RESUME_EXIT_CODE
from tests.helpers import (FAST_COMPILE, RRL_REFERENCE, RRL_STEPS, rrl_cfg, subprocess_env, tiny_cfg, train_rows,
                           wait_for_row)

pytestmark = pytest.mark.slow  # integration runs: tools/test.sh runs them, `-m "not slow"` leaves them out

ROOT = Path(__file__).resolve().parents[2]
STEPS = RRL_STEPS


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _spawn_pair(tmp_path, cfg) -> list[subprocess.Popen]:
    config = tmp_path / f"run-{time.monotonic_ns()}.yaml"
    config.write_text(yaml.safe_dump(cfg.to_dict()))
    port, procs = _free_port(), []
    for i in range(2):
        env = subprocess_env(XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu",
                             JAXRL_COORDINATOR_ADDRESS=f"localhost:{port}", JAXRL_NUM_PROCESSES="2",
                             JAXRL_PROCESS_ID=str(i))
        procs.append(subprocess.Popen([sys.executable, "-m", "jaxrl_llm.cli", "train", "--config", str(config)],
                                      cwd=ROOT, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    return procs


_HOSTS_SCRIPT = r"""
import sys
import numpy as np
from jaxrl_llm.parallel.distributed import initialize_from_env
initialize_from_env()
import jax
from jax.sharding import NamedSharding, PartitionSpec as P
from jaxrl_llm.parallel import hosts
from jaxrl_llm.parallel.mesh import make_mesh

i, out = hosts.index(), []
# shares cover the rows once, in order; gather_rows puts every share back in place (uneven n too)
for n in (0, 1, 5, 8):
    mine = hosts.share(n)
    local = np.arange(n)[mine] * 10 + 1
    assert (hosts.gather_rows(local, n) == np.arange(n) * 10 + 1).all(), n
assert hosts.sum_int(i + 1) == 3 and hosts.max_int(7 * i) == 7
assert hosts.any_process(i == 1) and not hosts.any_process(False)
# put: each process feeds its rows; the global array holds the global value, row-sharded and replicated
# also on a mesh whose processes' devices interleave (a TPU slice's torus order puts one host's chips at rows
# 0, 4, 16, 20 of 32): each process's rows are not one block there
devices = sorted(jax.devices(), key=lambda d: d.id)
interleaved = jax.sharding.Mesh(np.array([devices[k] for k in (0, 4, 1, 5, 2, 6, 3, 7)]), ("data",))
x = np.arange(8 * 3, dtype=np.float32).reshape(8, 3)
for mesh in (make_mesh({"data": 8}), interleaved):
    for spec in (P("data"), P()):
        a = hosts.put(x, NamedSharding(mesh, spec))
        assert a.shape == x.shape and not a.is_fully_addressable
        assert (hosts.to_host(a) == x).all() and (hosts.to_host(a * 2) == 2 * x).all()
        assert all((np.asarray(sh.data) == x[sh.index]).all() for sh in a.addressable_shards)
hosts.check_same(hosts.digest(np.arange(3), [1, 2]), "a plan both hosts share")
try:
    hosts.check_same(hosts.digest(np.arange(3) + (i if sys.argv[1] == "differ" else 0)), "the test plan")
except RuntimeError as e:
    print("REFUSED:", e)
else:
    print("AGREED")
"""


def test_hosts_helpers_across_two_real_processes(tmp_path):
    """parallel/hosts.py with two processes: row shares and their gathering, reductions, `put` feeding each
    process's rows into one global array, and a disagreement on the row plan refused on both hosts."""
    script = tmp_path / "hosts_check.py"
    script.write_text(_HOSTS_SCRIPT)
    for mode, want in (("differ", "REFUSED: the processes disagree on the test plan"), ("same", "AGREED")):
        port, procs = _free_port(), []
        for i in range(2):
            env = {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count=4 {FAST_COMPILE}",
                   "JAX_PLATFORMS": "cpu",
                   "JAXRL_COORDINATOR_ADDRESS": f"localhost:{port}", "JAXRL_NUM_PROCESSES": "2",
                   "JAXRL_PROCESS_ID": str(i)}
            procs.append(subprocess.Popen([sys.executable, str(script), mode], cwd=ROOT, env=env, text=True,
                                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
        for rc, out in _finish(procs, timeout=120):
            assert rc == 0 and want in out, out[-3000:]


_DAMAGE_SCRIPT = r"""
import sys
from pathlib import Path
import numpy as np
from jaxrl_llm.parallel.distributed import initialize_from_env
initialize_from_env()
import jax
from jax.sharding import NamedSharding, PartitionSpec as P
from jaxrl_llm.parallel import hosts
from jaxrl_llm.parallel.mesh import make_mesh
from jaxrl_llm.train.checkpoint import Checkpointer, CheckpointReadError

i, folder, mode = hosts.index(), Path(sys.argv[1]), sys.argv[2]
mesh = make_mesh({"data": 8})
sh = NamedSharding(mesh, P("data"))
ckpt = Checkpointer(folder, keep=5, async_save=False, log=lambda m: None)
for step in (1, 2):
    ckpt.save(step, {"params": {"w": hosts.put(np.full((8, 2), step, np.float32), sh)}}, {"model_signature": "m"},
              wait=True)
hosts.barrier("saved")
seen = []

def check(registry, where):  # the newest checkpoint fails on process 1 alone, as its own read found it
    seen.append(where)
    if i == 1 and where.endswith("/2"):
        raise (FileNotFoundError("NOT_FOUND: a shard of process 1") if mode == "damage" else
               OSError(5, "Input/output error"))

like = lambda registry: {"params": {"w": hosts.put(np.zeros((8, 2), np.float32), sh)}}
logs = []
try:
    step, arrays, _ = ckpt.restore_latest(like, "m", log=logs.append, check=check)
except CheckpointReadError as e:
    print("READ ERROR:", e)
else:
    print("RESTORED", step, float(hosts.to_host(arrays["params"]["w"]).mean()), sorted(ckpt.manager.all_steps()),
          (folder.parent / (folder.name + ".damaged") / "2").is_dir(), "|", " ".join(logs))
"""


def test_one_process_finding_damage_moves_the_checkpoint_aside_for_both(tmp_path):
    """The joint damage decision with two real processes: when only process 1's read of the newest checkpoint
    fails as damage, both processes call it damaged, process 0 moves it aside once, and both restore the older
    one; when process 1's failure is an I/O error instead, both stop with the read error and nothing moves."""
    script = tmp_path / "damage_check.py"
    script.write_text(_DAMAGE_SCRIPT)
    for mode in ("damage", "io"):
        port, procs = _free_port(), []
        folder = tmp_path / mode / "checkpoints"
        for i in range(2):
            env = {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count=4 {FAST_COMPILE}",
                   "JAX_PLATFORMS": "cpu",
                   "JAXRL_COORDINATOR_ADDRESS": f"localhost:{port}", "JAXRL_NUM_PROCESSES": "2",
                   "JAXRL_PROCESS_ID": str(i)}
            procs.append(subprocess.Popen([sys.executable, str(script), str(folder), mode], cwd=ROOT, env=env,
                                          text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
        outs = [out for _, out in _finish(procs, timeout=180)]
        lines = [[ln for ln in out.splitlines() if ln.startswith(("RESTORED", "READ ERROR"))] for out in outs]
        assert all(len(x) == 1 for x in lines), outs[0][-2000:] + outs[1][-2000:]
        if mode == "damage":
            for line in (lines[0][0], lines[1][0]):
                assert line.startswith("RESTORED 1 1.0 [1] True |") and "is damaged" in line, line
            assert "damaged as another process read it" in lines[0][0] and "NOT_FOUND" in lines[1][0]
        else:
            for line in (lines[0][0], lines[1][0]):
                assert line.startswith("READ ERROR:") and "nothing was moved" in line, line
            assert sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit()) == [1, 2]
            assert not (folder.parent / "checkpoints.damaged").exists()


def _finish(procs, timeout=300) -> list[tuple[int, str]]:
    done = []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
        done.append((p.returncode, out))
    return done


def _close(a, b, where):
    """Equal up to float32 summation order (gloo all-reduces across hosts vs one process's 8 devices: the
    gradient norm drifts by a few 1e-5 in 5 steps; every sampled token, reward and count is the same)."""
    if isinstance(a, float) or isinstance(b, float):
        assert np.isclose(a, b, rtol=1e-4, atol=1e-6), (where, a, b)
    elif isinstance(a, list):
        np.testing.assert_allclose(np.asarray(a, float), np.asarray(b, float), rtol=1e-4, atol=1e-6, err_msg=where)
    else:
        assert a == b, (where, a, b)


@pytest.mark.xdist_group("rrl_reference")
def test_two_hosts_train_as_one_and_stop_and_resume_together(tmp_path, rrl_reference):
    ref_cfg, ref = rrl_reference  # one process, 8 devices, the same config (tests/conftest.py)
    want = train_rows(ref_cfg.train.out_dir)
    assert sum(want[s]["rrl_replay_rows"] for s in want) > 0 and sum(want[s]["herl_kept"] for s in want) > 0
    assert 0 < np.mean([want[s]["reward_mean"] for s in want]) < 1  # rewards that differ: scoring matters

    cfg = rrl_cfg(tmp_path / "two", *RRL_REFERENCE)
    metrics = Path(cfg.train.out_dir) / "metrics.jsonl"
    procs = _spawn_pair(tmp_path, cfg)
    wait_for_row(procs[0], metrics, '"step": 2, "kind": "train"', timeout=400)
    procs[1].send_signal(signal.SIGTERM)  # one host is told to stop: both must stop, at the same step
    (rc0, out0), (rc1, out1) = _finish(procs)
    assert (rc0, rc1) == (RESUME_EXIT_CODE, RESUME_EXIT_CODE), (out0[-3000:], out1[-3000:])
    saved = [re.findall(r"stopped by ([^;]+); saved RL step (\d+) ", out) for out in (out0, out1)]
    assert [s[0][0] if s else None for s in saved] == ["another process's stop request", "signal (SIGTERM)"], saved
    saved = [[step for _, step in s] for s in saved]
    assert saved[0] == saved[1] and len(saved[0]) == 1 and 2 <= int(saved[0][0]) < STEPS, (saved, out0[-2000:])

    # restarted, the pair resumes from that step and finishes (an unclean stop's resume: test_trainer.py's
    # SIGKILL test; a silent process's: the test below)
    (rc0, out0), (rc1, out1) = _finish(_spawn_pair(tmp_path, cfg))
    assert (rc0, rc1) == (0, 0), (out0[-3000:], out1[-3000:])
    assert "resumed from" in out0, out0[-2000:]
    got = train_rows(cfg.train.out_dir)
    assert sorted(got) == sorted(want) == list(range(1, STEPS + 1))
    for s in want:
        assert sorted(got[s]) == sorted(want[s]), s
        for k in want[s]:
            _close(got[s][k], want[s][k], f"step {s} {k}")
    evals = [[json.loads(ln) for ln in Path(c.train.out_dir, "metrics.jsonl").read_text().splitlines()
              if '"kind": "eval"' in ln] for c in (ref_cfg, cfg)]
    assert [e["step"] for e in evals[1]] == [0, STEPS] == [e["step"] for e in evals[0]]  # process 0 alone writes
    for a, b in zip(*evals):
        for k in a:
            if not k.startswith(("time", "cpu_")) and k != "wall_time":
                _close(b[k], a[k], f"eval {a['step']} {k}")

    # the pair's final checkpoint (written by both processes) holds the one-process run's state
    two = Run(cfg, log=lambda *a: None)
    assert two.try_resume() and two.state.step == STEPS

    # Adam normalises each gradient element: where a gradient is near zero, last-bit differences from the
    # summation order can move that one parameter by a fraction of lr (0.02); a wrong row split or a host
    # counted twice moves most parameters by ~lr. So: all within lr / 20, and 99% within 2e-5
    def params_close(x, y):
        d = np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64))
        assert d.max() < 1e-3 and np.mean(d > 2e-5) < 0.01, (d.max(), np.mean(d > 2e-5), d.shape)

    jax.tree.map(params_close, jax.device_get(nnx.to_pure_dict(two.state.params)),
                 jax.device_get(nnx.to_pure_dict(ref.state.params)))
    explore_close = lambda x, y: np.testing.assert_allclose(  # noqa: E731
        np.asarray(x, np.float64), np.asarray(y, np.float64), rtol=1e-4, atol=1e-6)
    jax.tree.map(explore_close, jax.device_get(two.state.explore), jax.device_get(ref.state.explore))


@pytest.mark.parametrize("silent", [1, 0])
def test_a_silent_process_ends_the_run_with_the_resume_status_naming_it(tmp_path, silent):
    """One process of two stops answering (SIGSTOP) after step 2: the live one must not wait forever in the
    next collective. Within the watchdog's bound (what it reports: K x the median recent step, at least
    watchdog_floor_s) plus watchdog_stale_s of silent heartbeats it exits 75, naming the silent process; that
    holds for the coordinator (process 0, which serves the key-value store) too."""
    stale = 3  # seconds (10 by default): the test waits through it twice
    cfg = tiny_cfg(tmp_path, "train.steps=10000", "train.checkpoint_every=10000", "train.watchdog_floor_s=2",
                    "train.watchdog_ceiling_s=600", f"train.watchdog_stale_s={stale}",
                    "eval.size=0")  # no evaluation to compile: steps come sooner
    procs = _spawn_pair(tmp_path, cfg)
    live = procs[1 - silent]
    try:
        wait_for_row(procs[0], Path(cfg.train.out_dir) / "metrics.jsonl", '"step": 3, "kind": "train"', timeout=400)
        procs[silent].send_signal(signal.SIGSTOP)
        stopped_at = time.monotonic()
        out, _ = live.communicate(timeout=120)
        waited = time.monotonic() - stopped_at
    finally:
        procs[silent].kill()
        procs[silent].communicate(timeout=60)
        live.kill()
    assert live.returncode == RESUME_EXIT_CODE, out[-3000:]
    line = re.search(r"watchdog \(process (\d)\): no cross-host agreement for (\d+) s after agreement \d+ "
                     r"\(overdue after (\d+) s\); process (?:0 is )?silent:? ?(.*)", out)
    assert line and int(line[1]) == 1 - silent, out[-3000:]
    assert f"process {silent}" in line[0] and "exiting with status 75" in line[0], line[0]
    overdue = int(line[3])
    assert 2 <= overdue < 60 and stale <= waited <= overdue + stale + 10, (overdue, waited, line[0])
