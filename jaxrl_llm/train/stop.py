"""Stopping a run cleanly: SIGTERM / SIGINT, and host maintenance events announced by the cloud's metadata
server, ask the loop to checkpoint after the current step and exit with RESUME_EXIT_CODE (what the launch
scripts rerun on). On a multi-host run the request of any host is agreed on between steps, so every host
saves the same step.

Maintenance events: on a Cloud TPU VM (or any GCE VM) the metadata server's `instance/maintenance-event`
reads NONE until the host is about to be maintained: MIGRATE_ON_HOST_MAINTENANCE or
TERMINATE_ON_HOST_MAINTENANCE (the values GCE documents). A background thread long-polls it (`wait_for_change`)
and turns those two into a stop request; any other answer (an error page, a proxy's HTML) is logged once and
watching goes on, so a broken answer never stops, let alone restarts, a run in a loop. Bodies are read up to
MAX_BODY bytes. `train.maintenance_url`: "auto" watches that URL on TPU only, "" watches nothing, any other
http(s) URL is watched as it is (a test serves one locally).

A silent process (multi-host): the per-step agreement is watched (parallel/watchdog.py); when it is overdue and
a process's heartbeat has stopped, every live process names it and exits with RESUME_EXIT_CODE.
"""

from __future__ import annotations

import signal
import threading
import urllib.error
import urllib.request

from jaxrl_llm.parallel import hosts
from jaxrl_llm.parallel.watchdog import Watchdog

# exit status of `train` / `sft` stopped by SIGTERM / SIGINT (preemption) after saving its checkpoint: BSD's
# EX_TEMPFAIL, "try again"; launch scripts (tools/launch_*.sh) rerun the same command on it to resume
RESUME_EXIT_CODE = 75
GCE_MAINTENANCE_URL = "http://metadata.google.internal/computeMetadata/v1/instance/maintenance-event"
POLL_S = 60  # the metadata server's long poll: it answers at the latest after this, or when the value changes
MAINTENANCE_EVENTS = ("MIGRATE_ON_HOST_MAINTENANCE", "TERMINATE_ON_HOST_MAINTENANCE")  # what stops; NONE: nothing
MAX_BODY = 4096  # the answer is one short word; anything longer is not one of them
ODD_WAIT_S = 30.0  # after an unreadable or unexpected answer, before asking again
# urlopen's default opener also reads file:// and ftp:// (a redirect may lead there): this one speaks http(s) only
_HTTP_ONLY = urllib.request.OpenerDirector()
for _handler in (urllib.request.HTTPHandler, urllib.request.HTTPSHandler, urllib.request.HTTPRedirectHandler,
                 urllib.request.HTTPErrorProcessor, urllib.request.HTTPDefaultErrorHandler,
                 urllib.request.UnknownHandler):
    _HTTP_ONLY.add_handler(_handler())


def maintenance_url(setting: str, platform: str) -> str:
    """The URL to watch for `train.maintenance_url` on `platform` ('' for none)."""
    if setting == "auto":
        return GCE_MAINTENANCE_URL if platform == "tpu" else ""
    if setting and not setting.startswith(("http://", "https://")):
        raise ValueError(f"train.maintenance_url={setting!r}: only http:// and https:// URLs are watched")
    return setting


class StopFlag:
    """A signal (or a maintenance event) sets `requested` at any moment; the loop reads `agreed`, which `sync()`
    sets between steps from every process's request (one host's stop stops all hosts at the same step; with
    one process, a copy). `reason` says what asked. With several processes, `watchdog` = (floor_s, ceiling_s,
    stale_s) arms parallel/watchdog.py around the agreements (ceiling_s 0: off)."""

    def __init__(self, maintenance: str = "", log=print, watchdog: tuple[float, ...] = (0.0, 0.0)):
        if maintenance and not maintenance.startswith(("http://", "https://")):
            raise ValueError(f"maintenance URL {maintenance!r}: only http:// and https:// URLs are watched")
        self.requested = False
        self.agreed = False
        self.reason = ""
        self._old = {}
        self._url, self._log = maintenance, log
        self._done = threading.Event()
        self._thread = None
        self._watchdog = Watchdog(hosts.index(), hosts.count(), *watchdog, exit_code=RESUME_EXIT_CODE)

    def request(self, reason: str) -> None:
        if not self.requested:
            self.reason = reason
        self.requested = True

    def sync(self) -> bool:
        self.agreed = hosts.any_process(self.requested)
        self._watchdog.agreed()
        return self.agreed

    def __enter__(self):
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._old[sig] = signal.signal(sig, self._handle)
        if self._url:
            self._thread = threading.Thread(target=self._watch, name="maintenance-watch", daemon=True)
            self._thread.start()
        self._watchdog.__enter__()
        return self

    def _handle(self, signum, frame):
        self.request(signal.Signals(signum).name)

    def _watch(self):
        """Long-poll the maintenance URL until it reads a documented maintenance event (then ask for a stop) or
        the run ends. A URL that cannot be reached, or an answer that is no documented value, is reported once
        and watching goes on; nothing else here stops the run."""
        last, warned, odd = None, False, set()
        while not self._done.is_set():
            query = f"?wait_for_change=true&timeout_sec={POLL_S}" + (f"&last_etag={last}" if last else "")
            req = urllib.request.Request(self._url + query, headers={"Metadata-Flavor": "Google"})
            try:
                with _HTTP_ONLY.open(req, timeout=POLL_S + 10) as resp:
                    body = resp.read(MAX_BODY + 1)
                    value = body.decode(errors="replace").strip() if len(body) <= MAX_BODY else None
                    last = resp.headers.get("ETag") or last
            except (urllib.error.URLError, OSError, ValueError) as e:
                if not warned:
                    self._log(f"maintenance events: cannot read {self._url} ({e}); retrying every {ODD_WAIT_S:g} s")
                    warned = True
                self._done.wait(ODD_WAIT_S)
                continue
            if value in MAINTENANCE_EVENTS:
                self._log(f"maintenance event {value!r} from {self._url}: stopping after this step")
                self.request(f"maintenance event {value}")
                return
            if value != "NONE":  # not an answer the metadata server gives: say so once per value, ask again later
                if value not in odd:
                    odd.add(value)
                    shown = f"{value[:80]!r}" if value is not None else f"a body over {MAX_BODY} bytes"
                    self._log(f"maintenance events: {self._url} answered {shown}, not NONE or one of "
                              f"{', '.join(MAINTENANCE_EVENTS)}; ignored, still watching")
                self._done.wait(ODD_WAIT_S)
                continue
            if not last:  # a server without long polls (no ETag): poll once a second
                self._done.wait(1.0)

    def __exit__(self, *exc):
        self._watchdog.__exit__(*exc)
        self._done.set()
        for sig, old in self._old.items():
            signal.signal(sig, old)  # the watcher is a daemon thread: a long poll in flight ends with the process

    def describe(self) -> str:
        """What stopped the run, for its last log line."""
        if self.reason.startswith("SIG"):
            return f"signal ({self.reason})"
        return self.reason or "another process's stop request"
