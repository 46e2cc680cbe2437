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


class _Late:
    """A stop whose request arrives right after an agreement: the signal lands between two `sync()` calls."""

    def __init__(self):
        self.requested = self.agreed = self.armed = False

    def sync(self) -> bool:
        self.agreed = self.requested
        if self.armed:  # the request comes in just after this agreement
            self.requested, self.armed = True, False
        return self.agreed


def test_a_stop_asked_between_agreements_still_saves_the_last_step(monkeypatch):
    """stages.rl read the agreement twice a step (to save, then to loop); a request between the two ended the
    loop on a step no save had seen, losing the work since the last checkpoint. One agreement a step now."""
    import types

    from jaxrl_llm.train import stages

    flag, saves = _Late(), []

    def rl_step(run, pool, writer):
        flag.armed = run.state.step == 3  # the signal arrives during step 3, after its agreement is read
        return {"reward_mean": 0.0, "accuracy": 0.0, "entropy": 0.0, "temperature": 1.0, "sample_tokens_per_s": 0.0}

    monkeypatch.setattr(stages, "rl_step", rl_step)
    monkeypatch.setattr(stages, "write", lambda *a, **k: None)
    cfg = types.SimpleNamespace(train=types.SimpleNamespace(steps=10, checkpoint_every=100),
                                eval=types.SimpleNamespace(every=100))
    run = types.SimpleNamespace(cfg=cfg, state=types.SimpleNamespace(stage="rl", step=0),
                                save=lambda wait: saves.append((run.state.step, wait)) or f"RL step {run.state.step}")
    stages.rl(run, None, None, flag, {}, "")
    assert flag.agreed and run.state.step < 10 and saves == [(run.state.step, True)], (run.state.step, saves)


@pytest.mark.parametrize("stage,sft_steps,fresh", [("sft", 0, True), ("sft", 20, True), ("start", 0, False)])
def test_rl_starts_with_a_fresh_optimizer_whenever_sft_left_its_state(monkeypatch, stage, sft_steps, fresh):
    """A run stopped mid-SFT and resumed with sft.steps=0 (a key allowed to change on resume) holds SFT's optimizer
    state: RL took it over (its moments, step count, SFT's hyperparameters) because the reset read the config, not
    the state. A run that never had SFT keeps the RL state it was built with."""
    import types

    from jaxrl_llm.train import stages

    monkeypatch.setattr(stages, "init_optimizer", lambda opt, params, mesh: ("fresh", opt))
    cfg = types.SimpleNamespace(sft=types.SimpleNamespace(steps=sft_steps), algo=types.SimpleNamespace(kl_coef=0.0))
    state = types.SimpleNamespace(stage=stage, params={}, opt_state="as restored or built")
    run = types.SimpleNamespace(cfg=cfg, state=state, optimizer="rl", mesh=None)
    stages.start_rl(run)
    assert state.stage == "rl" and state.opt_state == (("fresh", "rl") if fresh else "as restored or built")
