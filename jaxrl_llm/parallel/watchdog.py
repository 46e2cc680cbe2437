"""A multi-host run never hangs on a silent process: a process that dies or stops answering (a crashed host, a
frozen VM, SIGSTOP) would leave every other process blocked forever in the step's next collective.

Each process posts a heartbeat to jax.distributed's key-value store once a second from a thread of its own
(`beat agreements`: a counter, and how many per-step agreements it has made; `done agreements` once it is past
its last agreement, so a process still saving does not take one that finished first for a silent one). The main
thread reports every cross-host agreement (`agreed()`; train/stop.py calls it after each step's stop agreement).
When the next agreement is overdue, the watcher reads every process's heartbeat; a process whose heartbeat has
not moved for stale_s (train.watchdog_stale_s, 10 s) is silent, and every live process then writes one line
naming it and exits with `exit_code` (the resume status the launch scripts rerun on: the run restarts from its
last checkpoint).

When is an agreement overdue: after K times the median of the recent intervals between agreements, clamped to
[floor_s, ceiling_s] (ceiling_s alone until two intervals are known), and never later than `cap_s(stale_s)`, so
a silent process is named before jax.distributed's own heartbeat timeout (parallel/distributed.py) ends the live
processes with a status no launch script resumes on. A slow step (a new compilation, a long evaluation) is not
a hang: while every heartbeat moves the run goes on, up to ceiling_s since the last agreement, after which it
ends the same way, naming the processes that are behind.

The watcher itself never blocks on the store: a read that does not answer within stale_s (the coordinator,
process 0, is the store) names process 0.
"""

from __future__ import annotations

import os
import statistics
import sys
import threading
import time
from collections import deque

from jaxrl_llm.parallel.distributed import JAX_HEARTBEAT_TIMEOUT_S

BEAT_S = 1.0  # how often each process posts its heartbeat
STALE_S = 10.0  # default: a heartbeat unchanged this long (ten missed beats) marks its process silent
K = 4  # an agreement is overdue after K x the median recent interval between agreements
PREFIX = "jaxrl_watchdog/"


def cap_s(stale_s: float) -> float:
    """The latest an agreement may become overdue: a silent process is named before jax.distributed gives up."""
    return JAX_HEARTBEAT_TIMEOUT_S - stale_s - 30.0


def _client():
    from jax._src.distributed import global_state  # the key-value store jax.distributed.initialize started

    return global_state.client


class Watchdog:
    """Armed from __enter__ to __exit__; `agreed()` after each cross-host agreement. A no-op unless
    process_count > 1 and ceiling_s > 0. `stale_s`: how long a heartbeat may stand still before its process counts
    as silent."""

    def __init__(self, process_index: int, process_count: int, floor_s: float, ceiling_s: float,
                 stale_s: float = STALE_S, *, exit_code: int, clock=time.monotonic):
        self.index, self.count = process_index, process_count
        self.floor_s, self.ceiling_s, self.stale_s, self.exit_code = floor_s, ceiling_s, stale_s, exit_code
        self._clock = clock
        self._intervals: deque[float] = deque(maxlen=16)
        self._agreements, self._last = 0, 0.0
        self._done = threading.Event()
        self._reading: threading.Thread | None = None
        self._read_result: list = []
        self.active = process_count > 1 and ceiling_s > 0

    def overdue_after(self) -> float:
        """Seconds after the last agreement at which the watcher starts looking for a silent process."""
        if len(self._intervals) < 2:
            bound = self.ceiling_s
        else:
            bound = min(self.ceiling_s, max(self.floor_s, K * statistics.median(self._intervals)))
        return min(bound, cap_s(self.stale_s))

    def agreed(self) -> None:
        now = self._clock()
        if self._agreements:
            self._intervals.append(now - self._last)
        self._agreements += 1
        self._last = now

    def __enter__(self):
        if self.active:
            self._client = _client()
            self._last = self._clock()
            self._beater = threading.Thread(target=self._beat, name="watchdog-heartbeat", daemon=True)
            self._beater.start()
            threading.Thread(target=self._watch, name="watchdog", daemon=True).start()
        return self

    def __exit__(self, *exc):
        self._done.set()  # both threads are daemons: one blocked on an unanswering store ends with the process
        if self.active:
            self._beater.join(timeout=2 * BEAT_S)  # its last post says "done": the others do not wait on us

    def _beat(self) -> None:
        beat = 0
        while True:
            done = self._done.is_set()
            beat += 1
            try:
                self._client.key_value_set(f"{PREFIX}{self.index}",
                                           f"{'done' if done else beat} {self._agreements}", allow_overwrite=True)
            except Exception:  # noqa: BLE001 - the store is gone or busy: the others see this process go quiet
                pass
            if done:
                return
            self._done.wait(BEAT_S)

    def _read(self) -> dict[int, str] | None:
        """Every process's heartbeat, or None while the store does not answer (one read in flight at a time)."""
        if self._reading is None:
            self._read_result = []
            self._reading = threading.Thread(target=self._read_once, daemon=True)
            self._reading.start()
        self._reading.join(timeout=1.0)
        if self._reading.is_alive():
            return None
        self._reading = None
        return self._read_result[0]

    def _read_once(self) -> None:
        try:
            pairs = self._client.key_value_dir_get(PREFIX)
            self._read_result.append({int(k.rsplit("/", 1)[-1]): v for k, v in pairs})
        except Exception:  # noqa: BLE001 - an unreachable store reads as "no answer"
            self._read_result.append(None)

    def _watch(self) -> None:
        seen: dict[int, tuple[str | None, float]] = {}  # process -> (heartbeat, when it last changed)
        quiet_since = None  # when the store stopped answering
        while not self._done.wait(0.5):
            now = self._clock()
            waited = now - self._last
            if waited < self.overdue_after():
                seen, quiet_since = {}, None
                continue
            beats = self._read()
            if beats is None:
                quiet_since = now if quiet_since is None else quiet_since
                if now - quiet_since >= self.stale_s and self.index != 0:
                    self._fire(waited, "process 0 is silent (the coordinator: its key-value store has not answered "
                                       f"for {now - quiet_since:.0f} s)")
                continue
            quiet_since = None
            silent = []
            for j in range(self.count):
                if j == self.index:
                    continue
                value = beats.get(j)
                if value and value.startswith("done "):  # past its last agreement (finishing, saving): not silent
                    continue
                if j not in seen or seen[j][0] != value:
                    seen[j] = (value, now)
                elif now - seen[j][1] >= self.stale_s:
                    at = f"last heartbeat at agreement {value.split()[1]}" if value else "no heartbeat posted"
                    silent.append(f"process {j} ({at}, unchanged for {now - seen[j][1]:.0f} s)")
            if silent:
                self._fire(waited, ("process " if len(silent) == 1 else "processes ") + "silent: " + "; ".join(silent))
            elif waited >= self.ceiling_s:
                steps = {j: int(v.split()[1]) for j, v in beats.items() if v}
                behind = sorted(j for j, a in steps.items() if a == min(steps.values())) if steps else []
                self._fire(waited, f"every process answers but none agreed within train.watchdog_ceiling_s="
                                   f"{self.ceiling_s:g}; behind: processes {behind} at agreement "
                                   f"{min(steps.values()) if steps else '?'}")

    def _fire(self, waited: float, who: str) -> None:
        line = (f"watchdog (process {self.index}): no cross-host agreement for {waited:.0f} s after agreement "
                f"{self._agreements} (overdue after {self.overdue_after():.0f} s); {who}; exiting with status "
                f"{self.exit_code} so the launch script restarts the run from its last checkpoint\n")
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001 - a broken pipe must not keep this process alive
                pass
        os.write(2, line.encode())
        os._exit(self.exit_code)
