"""Stopping a run cleanly: SIGTERM / SIGINT, and host maintenance events announced by the cloud's metadata
server, ask the loop to checkpoint after the current step and exit with RESUME_EXIT_CODE (what the launch
scripts rerun on). On a multi-host run the request of any host is agreed on between steps, so every host
saves the same step.

Maintenance events: on a Cloud TPU VM (or any GCE VM) the metadata server's `instance/maintenance-event`
reads NONE until the host is about to be maintained or preempted (e.g. TERMINATE_ON_HOST_MAINTENANCE);
a background thread long-polls it (`wait_for_change`) and turns anything else into a stop request.
`train.maintenance_url`: "auto" watches that URL on TPU only, "" watches nothing, any other URL is watched
as it is (a test serves one locally).
"""

from __future__ import annotations

import signal
import threading
import urllib.error
import urllib.request

from jaxrl_llm.parallel import hosts

# exit status of `train` / `sft` stopped by SIGTERM / SIGINT (preemption) after saving its checkpoint: BSD's
# EX_TEMPFAIL, "try again"; launch scripts (tools/launch_*.sh) rerun the same command on it to resume
RESUME_EXIT_CODE = 75
GCE_MAINTENANCE_URL = "http://metadata.google.internal/computeMetadata/v1/instance/maintenance-event"
POLL_S = 60  # the metadata server's long poll: it answers at the latest after this, or when the value changes


def maintenance_url(setting: str, platform: str) -> str:
    """The URL to watch for `train.maintenance_url` on `platform` ('' for none)."""
    if setting == "auto":
        return GCE_MAINTENANCE_URL if platform == "tpu" else ""
    return setting


class StopFlag:
    """A signal (or a maintenance event) sets `requested` at any moment; the loop reads `agreed`, which `sync()`
    sets between steps from every process's request (one host's stop stops all hosts at the same step; with
    one process, a copy). `reason` says what asked."""

    def __init__(self, maintenance: str = "", log=print):
        self.requested = False
        self.agreed = False
        self.reason = ""
        self._old = {}
        self._url, self._log = maintenance, log
        self._done = threading.Event()
        self._thread = None

    def request(self, reason: str) -> None:
        if not self.requested:
            self.reason = reason
        self.requested = True

    def sync(self) -> bool:
        self.agreed = hosts.any_process(self.requested)
        return self.agreed

    def __enter__(self):
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._old[sig] = signal.signal(sig, self._handle)
        if self._url:
            self._thread = threading.Thread(target=self._watch, name="maintenance-watch", daemon=True)
            self._thread.start()
        return self

    def _handle(self, signum, frame):
        self.request(signal.Signals(signum).name)

    def _watch(self):
        """Long-poll the maintenance URL until it reads something other than NONE (then ask for a stop) or the
        run ends. A URL that cannot be reached is reported once and retried; nothing here stops the run."""
        last, warned = None, False
        while not self._done.is_set():
            query = f"?wait_for_change=true&timeout_sec={POLL_S}" + (f"&last_etag={last}" if last else "")
            req = urllib.request.Request(self._url + query, headers={"Metadata-Flavor": "Google"})
            try:
                with urllib.request.urlopen(req, timeout=POLL_S + 10) as resp:
                    value = resp.read().decode(errors="replace").strip()
                    last = resp.headers.get("ETag") or last
            except (urllib.error.URLError, OSError, ValueError) as e:
                if not warned:
                    self._log(f"maintenance events: cannot read {self._url} ({e}); retrying every 30 s")
                    warned = True
                self._done.wait(30)
                continue
            if value and value.upper() != "NONE":
                self._log(f"maintenance event {value!r} from {self._url}: stopping after this step")
                self.request(f"maintenance event {value}")
                return
            if not last:  # a server without long polls (no ETag): poll once a second
                self._done.wait(1.0)

    def __exit__(self, *exc):
        self._done.set()
        for sig, old in self._old.items():
            signal.signal(sig, old)  # the watcher is a daemon thread: a long poll in flight ends with the process

    def describe(self) -> str:
        """What stopped the run, for its last log line."""
        if self.reason.startswith("SIG"):
            return f"signal ({self.reason})"
        return self.reason or "another process's stop request"
