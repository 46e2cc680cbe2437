"""Launch scripts (tools/launch_*.sh): their dry runs print the commands they would run on the machines;
the resume loop restarts on exit 75 only; signals reach the trainer; jax.distributed start-up from the
environment (jaxrl_llm/parallel/distributed.py); two real processes training together: test_multihost.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jaxrl_llm.parallel.distributed import DistributedError, initialize_from_env

ROOT = Path(__file__).resolve().parents[1]
CONFIG = "configs/tpu_qwen2.5_1.5b.yaml"
RESUME_EXIT_CODE_SH = 75  # tools/launch_lib.sh's RESUME_EXIT_CODE


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
    assert cmds[1].startswith("+ tar -czf ") and " --null -T " in cmds[1] and cmds[1].endswith(" .launch_args")
    assert f"on each host the run is: jaxrl-llm train --config {CONFIG} train.steps=10 optim.lr=1e-6" in r.stdout
    assert cmds[2].startswith(f"{gc} scp ") and cmds[2].endswith("--zone=us-west4-a --project=p1 --worker=all")
    assert cmds[3].startswith(f"{gc} ssh rl --zone=us-west4-a --project=p1 --worker=all") and \
        "bash\\ tools/setup.sh\\ tpu" in cmds[3] and "rm\\ -f\\ ~/jaxrl_llm.tar.gz" in cmds[3]
    start, stream = cmds[4], cmds[5]
    assert "--worker=all" in start and "remote_run.sh\\ start\\ JAXRL_DISTRIBUTED=auto" in start
    assert "--worker=0" in stream and "remote_run.sh\\ stream" in stream
    assert len(cmds) == 6  # one attempt: a dry run never restarts
    assert "--worker=all --command=\"cd ~/jaxrl_llm && LOG_TIMEOUT_S=600 bash tools/remote_run.sh stop\"" in r.stdout


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
        assert f"JAXRL_NUM_PROCESSES=3\\ JAXRL_PROCESS_ID={i}\\ " in c and "remote_run.sh\\ start" in c
    assert cmds[10].startswith("+ ssh g0 ") and "remote_run.sh\\ stream" in cmds[10] and len(cmds) == 11


@pytest.mark.parametrize("script,args,message", [
    ("launch_tpu_pod.sh", ["--zone", "z", "--", CONFIG], "--name is required"),
    ("launch_tpu_pod.sh", ["--name", "n", "--zone", "z", "--"], "give the run config after --"),
    ("launch_gpu_node.sh", ["--", "configs/nope.yaml"], "no config file configs/nope.yaml"),
    ("launch_gpu_multinode.sh", ["--", CONFIG], "--hosts h1,h2,... is required"),
    ("launch_gpu_node.sh", ["--gpu", "0", "--", CONFIG], "unknown option --gpu"),
    ("launch_gpu_multinode.sh", ["--hosts", "g0,g1;reboot", "--", CONFIG], "host 'g1;reboot' may hold only"),
    ("launch_tpu_pod.sh", ["--name", "n", "--zone", "z", "--dir", "a b", "--", CONFIG], "--dir 'a b' may hold only"),
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


# -- multi-host launches end to end, with stand-ins for ssh, scp and gcloud: each "host" is a folder (its home)
# under FAKE_HOSTS where the stand-in ssh runs the remote command with bash, as sshd does with the login shell

_FAKE_SSH = r"""#!/usr/bin/env bash
host=$1; shift
cmd="$*"
printf '%s: %s\n' "$host" "$cmd" >> "$FAKE_HOSTS/ssh.log"
case "$cmd" in *pkill*) exit 0 ;; esac  # never on this machine: it would end every matching process here
if [ -f "$FAKE_HOSTS/$host.fail_start" ] && [[ "$cmd" == *nohup* || "$cmd" == *"remote_run.sh start"* ]]; then
  exit 255
fi
mkdir -p "$FAKE_HOSTS/$host" && cd "$FAKE_HOSTS/$host" || exit 1
HOME="$FAKE_HOSTS/$host" JAXRL_HOST_ID="$host" exec bash -c "$cmd"
"""
_FAKE_SCP = r"""#!/usr/bin/env bash
host=${2%%:*}; path=${2#*:}; path=${path#\~/}
mkdir -p "$FAKE_HOSTS/$host" && cp "$1" "$FAKE_HOSTS/$host/$path"
"""
_FAKE_GCLOUD = r"""#!/usr/bin/env bash
# gcloud compute tpus tpu-vm VERB NAME|SRC [DEST] [--flags]: a slice of two workers, hosts NAME-w0 and NAME-w1
verb=$4; first=$5; shift 5
worker=all command="" rest=()
for a in "$@"; do
  case "$a" in --worker=*) worker=${a#--worker=} ;; --command=*) command=${a#--command=} ;; --*) ;; *) rest+=("$a") ;; esac
done
workers=(0 1); [ "$worker" != all ] && workers=("$worker")
case "$verb" in
  describe|create) exit 0 ;;
  scp) name=${rest[0]%%:*}; for w in "${workers[@]}"; do scp "$first" "$name-w$w:${rest[0]#*:}" || exit $?; done ;;
  ssh) for w in "${workers[@]}"; do ssh "$first-w$w" "$command" || exit $?; done ;;
esac
"""
_FAKE_TRAINER = """#!{python}
import json, os, signal, sys, time
json.dump({{"argv": sys.argv[1:], "process_id": os.environ.get("JAXRL_PROCESS_ID"),
           "distributed": os.environ.get("JAXRL_DISTRIBUTED")}}, open("argv.json", "w"))
print("fake trainer started", flush=True)
def term(*a):
    open("got_term", "w").write("TERM")
    sys.exit(75)
signal.signal(signal.SIGTERM, term)
if "mode=wait" in sys.argv:
    time.sleep(60)  # a test that forgets to stop it still ends
    sys.exit(1)
"""
TOOLS = ROOT / "tools"
SCRIPTS = ("launch_lib.sh", "launch_gpu_multinode.sh", "launch_tpu_pod.sh", "remote_run.sh")


def _project(tmp_path):
    """A project to launch (its git-tracked files: the launch scripts, a setup stub installing a stand-in
    trainer, a config), an untracked .env and data file, the stand-ins on PATH, and the hosts' folder."""
    proj, bin_, hosts = tmp_path / "proj", tmp_path / "bin", tmp_path / "hosts"
    for d in (proj / "tools", proj / "configs", proj / "data", bin_, hosts):
        d.mkdir(parents=True)
    for name in SCRIPTS:
        if (TOOLS / name).exists():
            (proj / "tools" / name).write_text((TOOLS / name).read_text())
    (proj / "tools" / "setup.sh").write_text("mkdir -p .venv/bin && cp tools/fake_trainer.py .venv/bin/jaxrl-llm && "
                                             "chmod +x .venv/bin/jaxrl-llm\n")
    (proj / "tools" / "fake_trainer.py").write_text(_FAKE_TRAINER.format(python=sys.executable))
    (proj / "configs" / "run.yaml").write_text("train: {steps: 1}\n")
    subprocess.run(["git", "init", "-q"], cwd=proj, check=True)
    subprocess.run(["git", "add", "tools", "configs"], cwd=proj, check=True)
    (proj / ".env").write_text("API_KEY=secret\n")
    (proj / "data" / "extra.txt").write_text("named by the user\n")
    for name, text in (("ssh", _FAKE_SSH), ("scp", _FAKE_SCP), ("gcloud", _FAKE_GCLOUD)):
        (bin_ / name).write_text(text)
        (bin_ / name).chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_}:{os.environ['PATH']}", "FAKE_HOSTS": str(hosts), "LOG_TIMEOUT_S": "20"}
    return proj, hosts, env


def _launch(proj, env, script, *args) -> subprocess.Popen:
    where = {"gpu": ["launch_gpu_multinode.sh", "--hosts", "g0,g1"],
             "tpu": ["launch_tpu_pod.sh", "--name", "rl", "--zone", "z"]}[script]
    return subprocess.Popen(["bash", str(proj / "tools" / where[0]), *where[1:], *args], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)


def _end(proc, timeout) -> tuple[int, str, str]:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the launch, its stand-in hosts and their trainers
        out, err = proc.communicate()
        raise AssertionError(f"the launch did not end within {timeout} s:\n{out[-2000:]}\n{err[-2000:]}") from None
    return proc.returncode, out, err


def test_hosts_sharing_a_home_keep_their_runs_apart(tmp_path):
    """GPU nodes with one NFS home: each host's agent kept train.log, exit_code and the process ids in the same
    files, so the second start deleted the first's and a stop reached only the last trainer. Each host keeps its
    own (.run/HOST/): SIGTERM stops both trainers, both statuses are written, the launch exits 75."""
    proj, hosts, env = _project(tmp_path)
    (hosts / "g0").mkdir()
    (hosts / "g1").symlink_to(hosts / "g0")  # one home for both
    proc = _launch(proj, env, "gpu", "--", "configs/run.yaml", "mode=wait")
    run = hosts / "g0" / "jaxrl_llm" / ".run"
    deadline = time.monotonic() + 60
    while not all((run / h / "run.pid").exists() for h in ("g0", "g1")) and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(1.0)
    pids = {h: int((run / h / "run.pid").read_text()) for h in ("g0", "g1")}
    assert pids["g0"] != pids["g1"]
    proc.send_signal(signal.SIGTERM)
    rc, out, err = _end(proc, timeout=60)
    assert rc == RESUME_EXIT_CODE_SH, (rc, out, err)
    assert [(run / h / "exit_code").read_text().strip() for h in ("g0", "g1")] == ["75", "75"]


def _host_dirs(hosts, script):
    return [hosts / h / "jaxrl_llm" for h in (("g0", "g1") if script == "gpu" else ("rl-w0", "rl-w1"))]


@pytest.mark.parametrize("script", ["gpu", "tpu"])
def test_overrides_reach_every_host_verbatim_and_run_nothing(tmp_path, script):
    """A quote (which hung the launch), a newline (whose next line ran as a command on every host), command
    substitution and a ';' are plain characters of the value the trainer receives."""
    proj, hosts, env = _project(tmp_path)
    args = ["configs/run.yaml", "data.prompt=it's", "data.note=x\ntouch INJECTED", "a.b=$(touch INJECTED) `id`; ls",
            "mode=exit0"]
    rc, out, err = _end(_launch(proj, env, script, "--", *args), timeout=60)
    assert rc == 0, (out, err)
    assert not list(hosts.rglob("INJECTED")), sorted(hosts.rglob("*"))
    for i, d in enumerate(_host_dirs(hosts, script)):
        got = json.loads((d / "argv.json").read_text())
        assert got["argv"] == ["train", "--config", *args]
        assert (got["process_id"], got["distributed"]) == ((str(i), None) if script == "gpu" else (None, "auto"))
    assert "fake trainer started" in out


@pytest.mark.parametrize("script", ["gpu", "tpu"])
def test_only_tracked_and_named_files_travel_and_the_archive_is_deleted(tmp_path, script):
    proj, hosts, env = _project(tmp_path)
    rc, out, err = _end(_launch(proj, env, script, "--include", "data/extra.txt", "--", "configs/run.yaml",
                                "mode=exit0"), timeout=60)
    assert rc == 0, (out, err)
    for d in _host_dirs(hosts, script):
        assert (d / "tools" / "launch_lib.sh").is_file() and (d / "data" / "extra.txt").is_file()
        assert not (d / ".env").exists(), "an untracked file the user did not name was copied"
        assert not (d.parent / "jaxrl_llm.tar.gz").exists(), "the archive was left on the host"
    r = _end(_launch(proj, env, script, "--include", "../secrets", "--", "configs/run.yaml"), timeout=30)
    assert r[0] == 2 and "--include ../secrets must be a path inside the project" in r[2]


def test_a_failed_start_ends_the_launch_and_stops_the_hosts_already_started(tmp_path):
    proj, hosts, env = _project(tmp_path)
    (hosts / "g1.fail_start").touch()
    rc, out, err = _end(_launch(proj, env, "gpu", "--", "configs/run.yaml", "mode=wait"), timeout=60)
    assert rc == 1 and "starting the run on g1 failed" in err, (rc, err)
    assert (hosts / "g0" / "jaxrl_llm" / "got_term").read_text() == "TERM"  # g0 was started, then stopped


def test_a_run_whose_log_never_appears_ends_the_launch(tmp_path):
    """The start command 'succeeds' but nothing runs (a stand-in nohup that does nothing): the launch ends
    after LOG_TIMEOUT_S saying so, instead of waiting forever for a log."""
    proj, hosts, env = _project(tmp_path)
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "nohup").write_text("#!/bin/sh\nexit 0\n")
    (broken / "nohup").chmod(0o755)
    env = {**env, "PATH": f"{broken}:{env['PATH']}", "LOG_TIMEOUT_S": "2"}
    rc, out, err = _end(_launch(proj, env, "gpu", "--", "configs/run.yaml", "mode=wait"), timeout=60)
    assert rc == 1 and "train.log did not appear within 2 s" in err and "starting the run on g0 failed" in err, err


@pytest.mark.slow
@pytest.mark.parametrize("script", ["gpu", "tpu"])
def test_sigterm_while_streaming_stops_each_run_by_process_id(tmp_path, script):
    """SIGTERM to the launch script while it streams the log: every host's trainer (and only it: another
    'jaxrl-llm train' process on the machine lives on) gets SIGTERM, saves and exits 75; the exit status is
    written on every host and the script ends with 75 without restarting."""
    proj, hosts, env = _project(tmp_path)
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "jaxrl-llm train"])
    try:
        proc = _launch(proj, env, script, "--", "configs/run.yaml", "mode=wait")
        dirs = _host_dirs(hosts, script)
        deadline = time.monotonic() + 60
        while not all((d / "argv.json").exists() for d in dirs) and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1.0)
        proc.send_signal(signal.SIGTERM)
        rc, out, err = _end(proc, timeout=60)
        assert rc == RESUME_EXIT_CODE_SH and "fake trainer started" in out and "preempted" not in err, (rc, out, err)
        for d in dirs:
            code = d / ".run" / d.parent.name / "exit_code"
            assert (d / "got_term").read_text() == "TERM" and code.read_text().strip() == "75"
        assert bystander.poll() is None, "another run on the host was stopped"
    finally:
        bystander.kill()
        bystander.wait()
