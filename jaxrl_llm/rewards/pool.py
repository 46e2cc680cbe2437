"""Reward checks in confined worker processes with a time limit per item.

Model output is adversarial, so every outcome of a job other than a score is a 0 the run survives, counted by kind
in `PoolStats`: a checker that raises (`errors`); one that runs out of memory (`memory`); one past its time limit
(`timeouts`: its worker's whole process group is killed and the worker replaced); one that ends its worker or
leaves processes behind it (`killed`: the same). Workers are spawned (not forked), so they never inherit the
trainer's JAX threads, and confined (rewards/sandbox.py): own process group, no credentials in the environment,
a private temporary folder, limits on memory, file size and CPU time, stdout and stderr captured by the pool
(counted in `output_bytes`, the tail of a failed job's output in `last_error`), never printed to the trainer's.

A worker starts, imports and loads what the run's scorers need (`scorers`: if-verifiable and its sentence
splitter, math-verify, reasoning-gym; `functions`: the user's reward functions, rewards/functions.py, which the pool
first imports and checks in the trainer's own process, so a bad entry is one clear error) and says it is ready
before it gets a job, so no item's time limit pays a worker's start: on a busy machine a first rubric check once
timed out on the import alone, and every replaced worker would again. Its limits apply from then on, so the
scorers' imports do not count against them. A worker that dies while starting is started again, up to
`start_retries` times in a row, before the pool gives up.
"""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import os
import shutil
import sys
import tempfile
import time
from multiprocessing.connection import wait
from typing import Callable, Sequence

from jaxrl_llm.rewards import functions as reward_functions
from jaxrl_llm.rewards import sandbox
from jaxrl_llm.rewards.types import FAILED, Score
from jaxrl_llm.rewards.verifiers import prepare, score

READY = "ready"
ERROR, MEMORY, KILLED = "error", "memory", "killed"
TAIL_BYTES = 2000  # of a failed job's captured output, kept in last_error


def _value(result) -> Score:
    """A job's Score: what the scorers and reward functions return, or a bare number (a pool given another `fn`)
    as its reward."""
    return result if isinstance(result, Score) else Score(float(result))


def _worker(conn, output, fn, scorers, functions, folder, timeout_s, memory_mb, file_mb):
    sandbox.enter(folder, os.dup(output.fileno()))
    output.close()
    try:
        _serve(conn, fn, scorers, functions, timeout_s, memory_mb, file_mb)
    finally:  # the pool's close removes the folder too; a pool killed outright (SIGKILL, OOM) cannot: this does
        os.chdir("/")
        shutil.rmtree(folder, ignore_errors=True)


def _serve(conn, fn, scorers, functions, timeout_s, memory_mb, file_mb):
    try:
        prepare(scorers)
        reward_functions.load(functions)
        sandbox.limit(memory_mb, file_mb)
    except Exception as e:  # a library a scorer needs is missing or broken: the pool says so, once
        conn.send((READY, f"{type(e).__name__}: {e}"))
        return
    conn.send((READY, None))
    while True:
        try:
            job = conn.recv()
        except EOFError:  # the pool's end is gone: its process died without closing the pool
            return
        if job is None:
            return
        idx, job_fn, args = job
        sandbox.job_cpu_limit(timeout_s)
        try:
            reply = (idx, _value((job_fn or fn)(*args)), None, None)
        except MemoryError:
            reply = (idx, FAILED, "MemoryError: the job needed more than reward.memory_mb", MEMORY)
        except BaseException as e:  # a broken or hostile checker (sys.exit included) must not take the worker down
            reply = (idx, FAILED, f"{type(e).__name__}: {e}", ERROR)
        sys.stdout.flush()
        sys.stderr.flush()
        left = sandbox.leftovers()
        if left:  # the pool kills the group and replaces this worker
            reply = (idx, FAILED, f"the job left {len(left)} processes running (pids {left[:5]})", KILLED)
        conn.send(reply)


@dataclasses.dataclass
class PoolStats:
    errors: int = 0  # the checker raised
    timeouts: int = 0  # past reward.timeout_s: the worker's process group was killed
    memory: int = 0  # the checker ran out of its reward.memory_mb
    killed: int = 0  # the job ended its worker or left processes running: the worker's group was killed
    output_bytes: int = 0  # what checkers printed (captured, not shown)
    last_error: str = ""


@dataclasses.dataclass
class _Worker:
    proc: mp.Process
    conn: object
    output: object  # the read end of the worker's stdout and stderr
    folder: str
    tail: bytes = b""
    output_open: bool = True


class RewardPool:
    """`workers` processes scoring jobs with `fn`, `timeout_s` per job; `scorers`: the scorer names the jobs
    use (TaskItem.scorer), prepared in each worker before its first job; `start_timeout_s`: how long a worker
    may take to start and prepare them before the pool gives up with an error; `memory_mb`, `file_mb`: the
    sandbox's limits (reward.memory_mb, reward.file_mb); `start_retries`: starts of a worker that dies while
    starting, in a row, before the pool gives up; `functions`: reward.functions entries, resolved and checked
    here (ValueError naming a bad one) and loaded by every worker at its start (`functions.call` jobs)."""

    def __init__(self, workers: int = 2, timeout_s: float = 5.0, fn: Callable = score, *,
                 scorers: Sequence[str] = (), start_timeout_s: float = 300.0, memory_mb: float = 2048,
                 file_mb: float = 0.0, start_retries: int = 3, functions: Sequence = ()):
        self.functions = reward_functions.resolve(functions)  # before any worker: a bad entry is one error
        self.timeout_s, self.start_timeout_s = timeout_s, start_timeout_s
        self.fn, self.scorers = fn, tuple(sorted(set(scorers)))
        self.memory_mb, self.file_mb, self.start_retries = memory_mb, file_mb, start_retries
        self.ctx = mp.get_context("spawn")
        self.stats = PoolStats()
        self.workers: list[_Worker] = []
        n = max(1, workers)
        self.ready = [False] * n
        self.start_failures = [0] * n
        for _ in range(n):
            self.workers.append(self._spawn())
        self.start_deadline = [time.monotonic() + start_timeout_s] * n

    def _spawn(self) -> _Worker:
        parent, child = self.ctx.Pipe()
        out_read, out_write = self.ctx.Pipe(duplex=False)
        folder = tempfile.mkdtemp(prefix="jaxrl-reward-")
        proc = self.ctx.Process(target=_worker, daemon=True, args=(
            child, out_write, self.fn, self.scorers, self.functions, folder, self.timeout_s, self.memory_mb,
            self.file_mb))
        proc.start()
        child.close()
        out_write.close()
        os.set_blocking(out_read.fileno(), False)
        return _Worker(proc, parent, out_read, folder)

    def _drain(self, slot: int) -> None:
        """Read what worker `slot` printed so far: counted, its tail kept."""
        w = self.workers[slot]
        while True:
            try:
                chunk = os.read(w.output.fileno(), 65536)
            except (BlockingIOError, OSError):
                return
            if not chunk:  # its fd 1 and 2 are closed: nothing more to wait for
                w.output_open = False
                return
            self.stats.output_bytes += len(chunk)
            w.tail = (w.tail + chunk)[-TAIL_BYTES:]

    def _fail(self, slot: int, kind: str, err: str, label: str = "") -> None:
        self._drain(slot)
        tail = self.workers[slot].tail.decode("utf-8", "replace").strip()
        setattr(self.stats, kind, getattr(self.stats, kind) + 1)
        self.stats.last_error = (f"{label}: " if label and not err.startswith(label) else "") + err + (
            f"; its output ended: {tail[-TAIL_BYTES:]}" if tail else "")

    def _started(self, slot: int) -> None:
        """Take a starting worker's first message: ready, or why it cannot score (an error for the run); one that
        died is started again, `start_retries` times in a row at most."""
        try:
            _, err = self.workers[slot].conn.recv()
        except EOFError:
            self._drain(slot)
            self.start_failures[slot] += 1
            tail = self.workers[slot].tail.decode("utf-8", "replace").strip()
            if self.start_failures[slot] <= self.start_retries:
                self._replace(slot)
                return
            self.workers[slot].proc.join(timeout=5)  # the pipe closes before the process is reaped
            err = (f"the process died while starting, {self.start_failures[slot]} times in a row (exit code "
                   f"{self.workers[slot].proc.exitcode}){'; its output ended: ' + tail if tail else ''}")
        if err:
            raise RuntimeError(f"reward worker {slot} could not prepare the scorers {list(self.scorers)}: {err}")
        self.ready[slot] = True
        self.start_failures[slot] = 0
        self.workers[slot].tail = b""

    def map(self, jobs: Sequence[tuple], fn: Callable | None = None, label: Callable[[int], str] | None = None
            ) -> list[Score]:
        """Score every job (a tuple of arguments of `fn`, default the pool's): its Score, in job order; a job that
        fails in any way gives FAILED (reward 0). `label(i)`: what job i is, put before its error in
        stats.last_error."""
        results = [FAILED] * len(jobs)
        pending = list(range(len(jobs)))[::-1]
        busy: dict[int, tuple[int, float]] = {}  # worker slot -> (job index, deadline)
        while pending or busy:
            for slot in range(len(self.workers)):
                if slot not in busy and pending and self.ready[slot]:
                    idx = pending.pop()
                    self.workers[slot].tail = b""
                    self.workers[slot].conn.send((idx, fn, jobs[idx]))
                    busy[slot] = (idx, time.monotonic() + self.timeout_s)
            starting = [s for s in range(len(self.workers)) if not self.ready[s]] if pending else []
            conns = {self.workers[s].conn: s for s in [*busy, *starting]}
            outputs = {self.workers[s].output: s for s in [*busy, *starting] if self.workers[s].output_open}
            deadlines = [d for _, d in busy.values()] + [self.start_deadline[s] for s in starting]
            ready = wait([*conns, *outputs], timeout=max(0.0, min(deadlines) - time.monotonic()))
            for conn in ready:
                if conn in outputs:
                    self._drain(outputs[conn])
                    continue
                slot = conns[conn]
                if not self.ready[slot]:
                    self._started(slot)
                    continue
                try:
                    idx, value, err, kind = conn.recv()
                    if idx != busy[slot][0]:
                        raise ValueError(f"a reply for job {idx} while it runs job {busy[slot][0]}")
                except Exception as e:  # the job ended its worker (os._exit, a signal, the OOM killer) or wrote
                    # into its pipe
                    self.workers[slot].proc.join(timeout=1)
                    idx, value, kind = busy[slot][0], FAILED, KILLED
                    err = (f"the worker died (exit code {self.workers[slot].proc.exitcode})" if isinstance(e, EOFError)
                           else f"the worker's reply was unreadable ({type(e).__name__}: {e})")
                if err:
                    self._fail(slot, {ERROR: "errors", MEMORY: "memory", KILLED: "killed"}[kind], err,
                               label(idx) if label else "")
                if kind == KILLED:
                    self._replace(slot)
                results[idx] = value
                del busy[slot]
            now = time.monotonic()
            for slot in starting:
                if not self.ready[slot] and now >= self.start_deadline[slot]:
                    raise RuntimeError(f"reward worker {slot} did not start and prepare the scorers "
                                       f"{list(self.scorers)} within {self.start_timeout_s:.0f} s")
            for slot, (idx, deadline) in list(busy.items()):
                if now >= deadline:
                    self._fail(slot, "timeouts", f"a job ran past its {self.timeout_s} s", label(idx) if label else "")
                    results[idx] = FAILED
                    self._replace(slot)
                    del busy[slot]
        return results

    def _stop(self, slot: int) -> None:
        w = self.workers[slot]
        sandbox.kill_group(w.proc.pid)
        if w.proc.exitcode is None:  # stopped before it made its group
            w.proc.kill()
        w.proc.join(timeout=5)
        self._drain(slot)
        for end in (w.conn, w.output):
            end.close()
        shutil.rmtree(w.folder, ignore_errors=True)

    def _replace(self, slot: int) -> None:
        self._stop(slot)
        self.workers[slot] = self._spawn()
        self.ready[slot] = False
        self.start_deadline[slot] = time.monotonic() + self.start_timeout_s

    def close(self) -> None:
        for w in self.workers:
            try:
                w.conn.send(None)
            except (BrokenPipeError, OSError):
                pass
        for slot, w in enumerate(self.workers):
            w.proc.join(timeout=2)
            self._stop(slot)  # what a worker forked may outlive it: its group goes too
        self.workers = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
