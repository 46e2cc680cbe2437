"""Launch scripts (tools/launch_*.sh): their dry runs print the commands they would run on the machines;
the resume loop restarts on exit 75 only; signals reach the trainer; jax.distributed start-up from the
environment (jaxrl_llm/parallel/distributed.py); two real processes training together: test_multihost.py."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jaxrl_llm.parallel.distributed import DistributedError, initialize_from_env

ROOT = Path(__file__).resolve().parents[1]
CONFIG = "configs/tpu_qwen2.5_1.5b.yaml"


def _dry(script: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", f"tools/{script}", "--dry-run", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)


def _lines(out: str, start: str) -> list[str]:
    return [ln for ln in out.splitlines() if ln.startswith(start)]


def test_tpu_pod_dry_run_creates_installs_starts_everywhere_and_streams_worker_0():
    r = _dry("launch_tpu_pod.sh", "--name", "rl", "--zone", "us-west4-a", "--type", "v5litepod-8", "--create",
             "--spot", "--project", "p1", "--", CONFIG, "train.steps=10", "optim.lr=1e-6")
    assert r.returncode == 0, r.stderr
    cmds = _lines(r.stdout, "+ ")
    gc = "+ gcloud compute tpus tpu-vm"
    assert cmds[0] == (f"{gc} create rl --zone=us-west4-a --project=p1 --accelerator-type=v5litepod-8 "
                       "--version=tpu-ubuntu2204-base --spot")
    assert cmds[1].startswith("+ tar -czf ") and " jaxrl_llm/cli.py " in cmds[1] and " .venv" not in cmds[1]
    assert cmds[2].startswith(f"{gc} scp ") and cmds[2].endswith("--zone=us-west4-a --project=p1 --worker=all")
    assert cmds[3].startswith(f"{gc} ssh rl --zone=us-west4-a --project=p1 --worker=all") and \
        "bash\\ tools/setup.sh\\ tpu" in cmds[3]
    start, stream = cmds[4], cmds[5]
    assert "--worker=all" in start and "JAXRL_DISTRIBUTED=auto" in start and ".venv/bin/jaxrl-llm\\ train" in start
    assert f"--config\\ {CONFIG.replace('.', '.')}" in start and "train.steps=10" in start and "optim.lr=1e-6" in start
    assert "--worker=0" in stream and "tail" in stream and "exit_code" in stream
    assert len(cmds) == 6  # one attempt: a dry run never restarts
    assert "pkill -TERM -f 'jaxrl-llm train'" in r.stdout  # how a stop reaches every worker


def test_gpu_node_and_multinode_dry_runs():
    r = _dry("launch_gpu_node.sh", "--", CONFIG, "train.steps=3")
    assert r.returncode == 0, r.stderr
    assert _lines(r.stdout, "+ ") == [
        "+ bash tools/setup.sh cuda",
        f"+ env HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 .venv/bin/jaxrl-llm train --config "
        f"{CONFIG} train.steps=3"]
    r = _dry("launch_gpu_multinode.sh", "--hosts", "g0,g1,g2", "--port", "9000", "--", CONFIG)
    assert r.returncode == 0, r.stderr
    cmds = _lines(r.stdout, "+ ")
    assert [c.split()[1:3] for c in cmds[1:7]] == [["scp", cmds[1].split()[2]], ["ssh", "g0"], ["scp", cmds[1].split()[2]],
                                                   ["ssh", "g1"], ["scp", cmds[1].split()[2]], ["ssh", "g2"]]
    starts = cmds[7:10]
    for i, (host, c) in enumerate(zip(("g0", "g1", "g2"), starts)):
        assert c.startswith(f"+ ssh {host} ") and "JAXRL_COORDINATOR_ADDRESS=g0:9000" in c
        assert f"JAXRL_NUM_PROCESSES=3\\ JAXRL_PROCESS_ID={i}\\ " in c
    assert cmds[10].startswith("+ ssh g0 ") and "tail" in cmds[10] and len(cmds) == 11


@pytest.mark.parametrize("script,args,message", [
    ("launch_tpu_pod.sh", ["--zone", "z", "--", CONFIG], "--name is required"),
    ("launch_tpu_pod.sh", ["--name", "n", "--zone", "z", "--"], "give the run config after --"),
    ("launch_gpu_node.sh", ["--", "configs/nope.yaml"], "no config file configs/nope.yaml"),
    ("launch_gpu_multinode.sh", ["--", CONFIG], "--hosts h1,h2,... is required"),
    ("launch_gpu_node.sh", ["--gpu", "0", "--", CONFIG], "unknown option --gpu"),
])
def test_bad_usage_is_refused_with_the_reason(script, args, message):
    r = _dry(script, *args)
    assert r.returncode == 2 and message in r.stderr, (r.returncode, r.stderr)


def _bash(snippet: str, **kw) -> subprocess.Popen:
    return subprocess.Popen(["bash", "-c", f"set -euo pipefail; source tools/launch_lib.sh; {snippet}"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def test_resume_loop_restarts_on_75_only(tmp_path):
    count = tmp_path / "n"
    # exits 75 twice (preempted), then 3 (a failure): three calls, the failure's status returned
    snippet = (f"attempt() {{ n=$(( $(cat {count} 2>/dev/null || echo 0) + 1 )); echo $n > {count}; "
               f"[ $n -lt 3 ] && return 75; return 3; }}; set +e; resume_loop attempt; echo rc=$?")
    out, err = _bash(snippet).communicate(timeout=30)
    assert "rc=3" in out and count.read_text().strip() == "3"
    assert err.count("was preempted (exit 75)") == 2
    count.unlink()
    out, _ = _bash(f"attempt() {{ echo x >> {count}; return 0; }}; resume_loop attempt; echo rc=$?").communicate(timeout=30)
    assert "rc=0" in out and count.read_text().count("x") == 1


def test_a_signal_to_the_script_reaches_the_trainer_and_nothing_restarts(tmp_path):
    """SIGTERM to the launch script: the child gets SIGTERM, 'saves' and exits 75; the loop does not restart."""
    got, calls = tmp_path / "got", tmp_path / "calls"
    child = (f"import pathlib, signal, sys, time\n"
             f"pathlib.Path({str(calls)!r}).open('a').write('x')\n"
             f"signal.signal(signal.SIGTERM, lambda *a: (pathlib.Path({str(got)!r}).write_text('term'), sys.exit(75)))\n"
             f"time.sleep(60)\n")
    proc = _bash(f"attempt() {{ run_child {sys.executable} -c {_quote(child)}; }}; set +e; resume_loop attempt; "
                 f"echo rc=$?")
    deadline = time.monotonic() + 30
    while not calls.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert got.read_text() == "term" and calls.read_text() == "x" and "rc=75" in out, (out, err)


def _quote(s: str) -> str:
    return "'" + s.replace("'", "'\\''") + "'"


@pytest.mark.parametrize("env,message", [
    ({"JAXRL_COORDINATOR_ADDRESS": "h:1"}, "JAXRL_NUM_PROCESSES, JAXRL_PROCESS_ID is not"),
    ({"JAXRL_COORDINATOR_ADDRESS": "h:1", "JAXRL_NUM_PROCESSES": "two", "JAXRL_PROCESS_ID": "0"}, "must be integers"),
    ({"JAXRL_COORDINATOR_ADDRESS": "h:1", "JAXRL_NUM_PROCESSES": "2", "JAXRL_PROCESS_ID": "2"}, "is not in [0"),
    ({"JAXRL_DISTRIBUTED": "yes"}, "the only value is 'auto'"),
])
def test_distributed_environment_errors(env, message):
    with pytest.raises(DistributedError) as e:
        initialize_from_env(env)
    assert message in str(e.value)
    assert initialize_from_env({}) == 1  # no launch environment: one process, nothing initialized
