"""The confinement of a reward worker: what the scoring of a model's output may touch.

A worker (rewards/pool.py) runs `enter` first thing: it becomes the leader of its own session and process group,
so that a time limit kills everything it started (`kill_group`), forks included; drops credentials from its
environment; works in a private temporary folder (`folder`, made and removed by the pool); sends its stdout and
stderr to the pool, not to the trainer's terminal. Once its scorers are loaded, `limit` caps what a job may add:
address space (RLIMIT_AS, `memory_mb` beyond what the loaded scorers hold, so a many-core host's larger thread
pools do not eat the margin), file size (RLIMIT_FSIZE, `file_mb`; 0: no file may grow at all) and no core files.
`job_cpu_limit` gives each job a CPU-time limit a little over its wall-clock one (RLIMIT_CPU).

This is damage control on top of scoring that never runs the answer as code (verifiers.py), not a security
boundary: the worker is the trainer's user, so it could still read files the user can read (~/.cache/huggingface/
token, the trainer's /proc/<pid>/environ, and its own, which keeps the variables it started with), create empty
files, and a forked child that calls setsid() leaves the process group before the kill reaches it.
"""

from __future__ import annotations

import math
import os
import re
import resource
import signal
import sys
import tempfile

# variables whose values are credentials: HF_TOKEN, AWS_SECRET_ACCESS_KEY, GOOGLE_APPLICATION_CREDENTIALS,
# SSH_AUTH_SOCK, WANDB_API_KEY, GITHUB_TOKEN, *_PASSWORD ...
_SECRET = re.compile(r"TOKEN|SECRET|KEY|PASSW|CREDENTIAL|AUTH|COOKIE|SESSION|^AWS_|^GOOGLE_|^GCP_|^GCLOUD_|^AZURE_"
                     r"|^SSH_|^GPG_|^KRB5|^NETRC$|^DOCKER_CONFIG$|^KUBECONFIG$", re.IGNORECASE)


def secret_names(environ) -> list[str]:
    """The names of the variables in `environ` that `enter` removes."""
    return sorted(k for k in environ if _SECRET.search(k))


def enter(folder: str, output_fd: int) -> None:
    """Make this process a confined worker: its own process group, no credentials in os.environ, `folder` as its
    working and temporary folder, fd 1 and 2 on `output_fd` (the pool reads them)."""
    os.setsid()
    for name in secret_names(os.environ):
        del os.environ[name]
    os.chdir(folder)
    for name in ("TMPDIR", "TEMP", "TMP"):
        os.environ[name] = folder
    tempfile.tempdir = folder
    os.environ["HOME"] = folder  # libraries that cache under ~ write in the private folder, not the user's home
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(output_fd, 1)
    os.dup2(output_fd, 2)
    os.close(output_fd)


def address_space() -> int:
    """This process's mapped address space in bytes (what RLIMIT_AS counts)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")


def limit(memory_mb: float, file_mb: float) -> None:
    """Cap what the jobs may add from here on (memory_mb 0: no address-space limit). Hard limits too: the scored
    code cannot raise them again."""
    if memory_mb > 0:
        cap = address_space() + int(memory_mb * 2**20)
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    size = int(file_mb * 2**20)
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit raises OSError (EFBIG): the job errs
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def job_cpu_limit(timeout_s: float) -> None:
    """A CPU-time limit for the next job: what the worker has used so far plus a little over the job's time
    limit (SIGXCPU ends a job that threads past its wall-clock limit before the pool's kill arrives)."""
    used = resource.getrusage(resource.RUSAGE_SELF)
    soft = math.ceil(used.ru_utime + used.ru_stime + timeout_s) + 1
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    resource.setrlimit(resource.RLIMIT_CPU, (soft if hard == resource.RLIM_INFINITY else min(soft, hard), hard))


def leftovers() -> list[int]:
    """Processes still in this worker's process group other than itself (a job forked and left them), after
    reaping the children that have already exited."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            break
    me, found = os.getpid(), []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:  # it ended while we looked
            continue
        if int(fields[2]) == me and fields[0] != "Z":  # fields: state, ppid, pgrp, ...
            found.append(int(entry))
    return found


def kill_group(pid: int) -> None:
    """SIGKILL the process group that worker `pid` leads: itself and what it forked (none such before it made its
    group, or once all of them ended)."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
