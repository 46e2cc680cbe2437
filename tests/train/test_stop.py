"""train/stop.py's maintenance watcher against a local stand-in for the GCE metadata server: only the documented
maintenance events (MIGRATE_ON_HOST_MAINTENANCE, TERMINATE_ON_HOST_MAINTENANCE) stop a run; an error page,
an unknown word or an oversized body is logged once and watching goes on; only http(s) URLs are watched."""

from __future__ import annotations

import time

import pytest

from tests.stand_in_http import serve

from jaxrl_llm.config import ConfigError, load_config
from jaxrl_llm.train import stop
from jaxrl_llm.train.stop import MAX_BODY, StopFlag


def _server(answers: list, served: list):
    """Answers answers[0] (status, body) to every GET, recording each; answers.pop(0) once served if more remain."""
    def respond(handler):
        status, body = answers[0] if len(answers) == 1 else answers.pop(0)
        served.append(body[:20])
        return status, body

    server = serve(respond)
    return server, f"http://127.0.0.1:{server.server_address[1]}/maintenance-event"


def _watch(answers, seconds, monkeypatch):
    monkeypatch.setattr(stop, "ODD_WAIT_S", 0.05)  # ask again at once after an odd answer (30 s in a run)
    served, logs = [], []
    server, url = _server(answers, served)
    try:
        with StopFlag(url, logs.append) as flag:
            deadline = time.monotonic() + seconds
            while not flag.requested and time.monotonic() < deadline:
                time.sleep(0.02)
    finally:
        server.shutdown()
    return flag, served, logs


@pytest.mark.parametrize("event", ["MIGRATE_ON_HOST_MAINTENANCE", "TERMINATE_ON_HOST_MAINTENANCE"])
def test_odd_answers_are_logged_once_and_only_a_documented_event_stops(monkeypatch, event):
    html = b"<html><body>502 Bad Gateway</body></html>"
    answers = [(200, html), (200, html), (200, b"x" * (MAX_BODY + 10)), (200, b"x" * (MAX_BODY + 10)),
               (200, b"NONE"), (200, html), (200, event.encode())]
    flag, served, logs = _watch(answers, 20, monkeypatch)
    assert flag.requested and flag.reason == f"maintenance event {event}", logs
    assert len(served) == 7  # every odd answer was followed by another question
    odd = [ln for ln in logs if "not NONE or one of" in ln]
    assert len(odd) == 2 and "'<html><body>502 Bad Gateway" in odd[0] and f"a body over {MAX_BODY} bytes" in odd[1]


def test_error_pages_and_unknown_words_never_stop_a_run(monkeypatch):
    flag, served, logs = _watch([(200, b"MAINTENANCE_SOON"), (500, b"<html>oops</html>"), (200, b"MAINTENANCE_SOON")],
                                2, monkeypatch)
    assert not flag.requested and len(served) >= 3, (served, logs)
    assert sum("answered 'MAINTENANCE_SOON'" in ln for ln in logs) == 1, logs


def test_only_http_urls_are_watched(tmp_path):
    secret = tmp_path / "TERMINATE"
    secret.write_text("TERMINATE_ON_HOST_MAINTENANCE")
    with pytest.raises(ValueError, match="only http:// and https://"):
        StopFlag(f"file://{secret}")
    with pytest.raises(ValueError, match="only http:// and https://"):
        stop.maintenance_url(f"file://{secret}", "tpu")
    with pytest.raises(ConfigError, match="train.maintenance_url='file:///x'"):
        load_config(None, ["train.maintenance_url=file:///x"])
    with pytest.raises(ConfigError, match="train.watchdog_floor_s=90.0 must be > 0 and <= train.watchdog_ceiling_s"):
        load_config(None, ["train.watchdog_floor_s=90", "train.watchdog_ceiling_s=60"])
    for bad in ("1", "31"):  # beats come every second; jax.distributed gives up on a silent process after 100 s
        with pytest.raises(ConfigError, match=rf"train.watchdog_stale_s={float(bad)} must be in \[2, 30\]"):
            load_config(None, [f"train.watchdog_stale_s={bad}"])
