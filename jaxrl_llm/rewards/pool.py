"""Reward checks in worker processes with a time limit per item.

A checker that raises scores 0 and is counted as an error; one that outlives its time limit scores
0, is counted as a timeout, and its worker is killed and replaced. Neither stalls nor ends the run.
Workers are spawned (not forked), so they never inherit the trainer's JAX threads. A worker starts,
imports and loads what the run's scorers need (`scorers`: if-verifiable and its sentence splitter, math-verify,
reasoning-gym) and says it is ready before it gets a job, so no item's time limit pays a worker's start: on a
busy machine a first rubric check once timed out on the import alone, and every replaced worker would again.
"""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import time
from multiprocessing.connection import wait
from typing import Callable, Sequence

from jaxrl_llm.rewards.verifiers import prepare, score

READY = "ready"


def _value(result):
    """A reward, or (reward, rubric items met) as rubric scorers return."""
    if isinstance(result, tuple):
        return float(result[0]), [int(m) for m in result[1]]
    return float(result)


def _worker(conn, fn, scorers):
    try:
        prepare(scorers)
    except Exception as e:  # a library a scorer needs is missing or broken: the pool says so, once
        conn.send((READY, f"{type(e).__name__}: {e}"))
        return
    conn.send((READY, None))
    while True:
        job = conn.recv()
        if job is None:
            return
        idx, args = job
        try:
            conn.send((idx, _value(fn(*args)), None))
        except Exception as e:  # a broken checker must not take the worker down
            conn.send((idx, 0.0, f"{type(e).__name__}: {e}"))


@dataclasses.dataclass
class PoolStats:
    errors: int = 0
    timeouts: int = 0
    last_error: str = ""


class RewardPool:
    """`workers` processes scoring jobs with `fn`, `timeout_s` per job; `scorers`: the scorer names the jobs
    use (TaskItem.scorer), prepared in each worker before its first job; `start_timeout_s`: how long a worker
    may take to start and prepare them before the pool gives up with an error."""

    def __init__(self, workers: int = 2, timeout_s: float = 5.0, fn: Callable = score, *,
                 scorers: Sequence[str] = (), start_timeout_s: float = 300.0):
        self.timeout_s, self.start_timeout_s = timeout_s, start_timeout_s
        self.fn, self.scorers = fn, tuple(sorted(set(scorers)))
        self.ctx = mp.get_context("spawn")
        self.stats = PoolStats()
        self.workers = [self._spawn() for _ in range(max(1, workers))]
        self.ready = [False] * len(self.workers)
        self.start_deadline = [time.monotonic() + start_timeout_s] * len(self.workers)

    def _spawn(self):
        parent, child = self.ctx.Pipe()
        proc = self.ctx.Process(target=_worker, args=(child, self.fn, self.scorers), daemon=True)
        proc.start()
        child.close()
        return proc, parent

    def _started(self, slot: int) -> None:
        """Take a starting worker's first message: ready, or why it cannot score (an error for the run)."""
        try:
            _, err = self.workers[slot][1].recv()
        except EOFError:
            err = "the process died while starting"
        if err:
            raise RuntimeError(f"reward worker {slot} could not prepare the scorers {list(self.scorers)}: {err}")
        self.ready[slot] = True

    def map(self, jobs: Sequence[tuple]) -> list:
        """Score every job (a tuple of `fn` arguments); results in job order: a float, or (float, items met)
        from rubric scorers; a job that errs or times out gives 0.0."""
        results = [0.0] * len(jobs)
        pending = list(range(len(jobs)))[::-1]
        busy: dict[int, tuple[int, float]] = {}  # worker slot -> (job index, deadline)
        while pending or busy:
            for slot in range(len(self.workers)):
                if slot not in busy and pending and self.ready[slot]:
                    idx = pending.pop()
                    self.workers[slot][1].send((idx, jobs[idx]))
                    busy[slot] = (idx, time.monotonic() + self.timeout_s)
            starting = [s for s in range(len(self.workers)) if not self.ready[s]] if pending else []
            conns = {self.workers[s][1]: s for s in [*busy, *starting]}
            deadlines = [d for _, d in busy.values()] + [self.start_deadline[s] for s in starting]
            ready = wait(list(conns), timeout=max(0.0, min(deadlines) - time.monotonic()))
            for conn in ready:
                slot = conns[conn]
                if not self.ready[slot]:
                    self._started(slot)
                    continue
                try:
                    idx, value, err = conn.recv()
                except EOFError:  # the worker died (e.g. killed by the OS): score 0, replace it
                    idx, value, err = busy[slot][0], 0.0, "worker died"
                    self._replace(slot)
                if err:
                    self.stats.errors += 1
                    self.stats.last_error = err
                results[idx] = value
                del busy[slot]
            now = time.monotonic()
            for slot in starting:
                if not self.ready[slot] and now >= self.start_deadline[slot]:
                    raise RuntimeError(f"reward worker {slot} did not start and prepare the scorers "
                                       f"{list(self.scorers)} within {self.start_timeout_s:.0f} s")
            for slot, (idx, deadline) in list(busy.items()):
                if now >= deadline:
                    self.stats.timeouts += 1
                    results[idx] = 0.0
                    self._replace(slot)
                    del busy[slot]
        return results

    def _replace(self, slot: int) -> None:
        proc, conn = self.workers[slot]
        proc.kill()
        proc.join(timeout=5)
        conn.close()
        self.workers[slot] = self._spawn()
        self.ready[slot] = False
        self.start_deadline[slot] = time.monotonic() + self.start_timeout_s

    def close(self) -> None:
        for proc, conn in self.workers:
            try:
                conn.send(None)
            except (BrokenPipeError, OSError):
                pass
            proc.join(timeout=2)
            if proc.is_alive():
                proc.kill()
        self.workers = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
