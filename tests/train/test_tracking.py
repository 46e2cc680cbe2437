"""Tracking (train/tracking.py) on a tiny run with W&B offline: what W&B holds, read back from its own files, equals
metrics.jsonl; samples.jsonl agrees with the step's metrics and with the verifier; a resume duplicates nothing."""

import json
import shutil
import struct
import sys
from pathlib import Path

import numpy as np
import pytest
from tests.helpers import tiny_cfg

from jaxrl_llm.rewards.verifiers import score
from jaxrl_llm.train.loop import Run
from jaxrl_llm.train.tracking import Tracker

pytestmark = pytest.mark.slow  # integration runs: tools/test.sh runs them, `-m "not slow"` leaves them out

TRACKED = ("logging.wandb=true", "logging.wandb_mode=offline", "logging.samples_every=2",
           "logging.samples_per_step=1000", "train.tensorboard=true")
ROWS = 64  # rollout.prompts_per_step 4 x rollout.group_size 16 in tiny_cfg


def _wandb_env(mp, tmp: Path) -> None:
    """W&B's own settings, caches and staged tables in the test's folder, not the user's."""
    for var in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
        mp.setenv(var, str(tmp / var.lower()))
    mp.setenv("WANDB_MODE", "offline")
    mp.delenv("WANDB_API_KEY", raising=False)
    mp.setenv("NETRC", str(tmp / "netrc"))


def _records(path: Path):
    """The protobuf records of a .wandb file: W&B's LevelDB-style log (a 7-byte file header, then 32 KiB blocks of
    chunks, each with a 7-byte header: crc32, length, type full | first | middle | last)."""
    from wandb.proto.wandb_internal_pb2 import Record

    data, block = path.read_bytes(), 32768
    assert data[:4] == b":W&B" and struct.unpack("<H", data[4:6])[0] == 0xBEE1, path
    at, parts = 7, b""
    while at + 7 <= len(data):
        if block - at % block < 7:  # a block's tail too short for a chunk header is padding
            at += block - at % block
            continue
        _, n, kind = struct.unpack("<IHB", data[at:at + 7])
        if n == 0 and kind == 0:
            at += block - at % block
            continue
        parts += data[at + 7:at + 7 + n]
        at += 7 + n
        if kind in (1, 4):  # full, last
            yield Record.FromString(parts)
            parts = b""


def _history(run_dir: Path) -> list[tuple[Path, dict]]:
    """Every history row W&B recorded for the run folder, session by session: (offline run folder, {key: value})."""
    import wandb

    wandb.teardown()  # run.finish() leaves the last session's records in wandb-core's buffer until the service stops
    out = []
    for session in sorted((run_dir / "wandb").glob("offline-run-*")):
        (log,) = session.glob("run-*.wandb")
        for r in _records(log):
            if r.WhichOneof("record_type") == "history":
                out.append((session, {"/".join(i.nested_key) or i.key: json.loads(i.value_json)
                                      for i in r.history.item}))
    return out


def _rows(path: Path) -> list[dict]:
    return [json.loads(ln) for ln in path.read_text().splitlines()]


def _tb_texts(folder: Path) -> dict:
    """{step: [text]} of the `samples` text as TensorBoard shows it (a SessionLog.START at step N hides every
    earlier-written event of step >= N)."""
    from tensorboardX.proto.event_pb2 import Event, SessionLog

    sessions = []
    for f in folder.glob("events.out.tfevents.*"):
        data, events, at = f.read_bytes(), [], 0
        while at < len(data):
            (n,) = struct.unpack("<Q", data[at:at + 8])
            events.append(Event.FromString(data[at + 12:at + 12 + n]))
            at += 12 + n + 4
        sessions.append((events[0].wall_time, events))
    seen = []
    for _, events in sorted(sessions, key=lambda s: s[0]):
        for e in events:
            if e.HasField("session_log") and e.session_log.status == SessionLog.START:
                seen = [s for s in seen if s[0] < e.step]
            seen += [(e.step, v.tensor.string_val[0].decode()) for v in e.summary.value if v.tag.startswith("samples")]
    out: dict = {}
    for step, text in seen:
        out.setdefault(step, []).append(text)
    return out


FUNCTIONS = """
def parts(prompt, completion, item):
    return {"chars": len(completion), "digit": float(completion.strip().isdigit())}
"""


@pytest.fixture(scope="module")
def tracked(tmp_path_factory):
    """A 4-step run with a reward function of two components beside the task's scorer, which dies after step 4's
    rows but before its checkpoint (checkpoint 4 removed), resumed from checkpoint 2 to 6 steps: (run folder,
    metrics.jsonl and samples.jsonl as the first session left them)."""
    tmp = tmp_path_factory.mktemp("tracking")
    (tmp / "fns.py").write_text(FUNCTIONS)
    extras = (*TRACKED, f"reward.functions=['{tmp / 'fns.py'}:parts']")
    with pytest.MonkeyPatch.context() as mp:
        _wandb_env(mp, tmp)
        cfg = tiny_cfg(tmp, "train.steps=4", *extras)
        Run(cfg, log=lambda *a: None).train()
        out = Path(cfg.train.out_dir)
        first = {name: _rows(out / name) for name in ("metrics.jsonl", "samples.jsonl")}
        shutil.rmtree(out / "checkpoints" / "4")
        Run(tiny_cfg(tmp, "train.steps=6", *extras), log=lambda *a: None).train()
    return out, first


def test_wandb_holds_each_metrics_row_once_with_its_values(tracked):
    out, first = tracked
    final = _rows(out / "metrics.jsonl")
    assert [(r["kind"], r["step"]) for r in first["metrics.jsonl"]] == [
        ("eval", 0), ("train", 1), ("train", 2), ("train", 3), ("train", 4), ("eval", 4)]
    assert [(r["kind"], r["step"]) for r in final] == [
        ("eval", 0)] + [("train", s) for s in range(1, 7)] + [("eval", 6)]
    # W&B keeps what it was sent first: the first session's rows, then the rows the resumed one adds (the steps it
    # redid, 3 and 4, are not sent again; the first session's final evaluation at step 4 stays)
    done = {(r["kind"], r["step"]) for r in first["metrics.jsonl"]}
    expected = first["metrics.jsonl"] + [r for r in final if (r["kind"], r["step"]) not in done]
    history = _history(out)
    sessions = sorted({s for s, _ in history})
    assert len(sessions) == 2 and [h["_step"] for _, h in history] == list(range(1, len(expected) + 1))
    assert [sessions.index(s) for s, _ in history] == [0] * 6 + [1] * 3
    for (_, h), row in zip(history, expected):
        kind, axis = row["kind"], "rl_step"
        numbers = {k: v for k, v in row.items() if isinstance(v, (int, float)) and k != "step"}
        assert len(numbers) > 10, row
        logged = {k[len(kind) + 1:]: v for k, v in h.items() if k.startswith(kind + "/")}
        assert logged == numbers and h[axis] == row["step"], (kind, row["step"])
        assert not [k for k in h if not k.startswith((kind + "/", "samples/", "_")) and k != axis], h
    run_ids = {p.name.rsplit("-", 1)[1] for p in sessions}
    assert run_ids == {json.loads((out / "wandb.json").read_text())["id"]}  # the resume continued the same run


def test_samples_match_the_steps_metrics_and_the_verifier(tracked):
    out, _ = tracked
    samples = _rows(out / "samples.jsonl")
    train = {r["step"]: r for r in _rows(out / "metrics.jsonl") if r["kind"] == "train"}
    assert sorted({s["step"] for s in samples}) == [2, 4, 6]
    for step in (2, 4, 6):
        rows = [s for s in samples if s["step"] == step]
        assert [s["row"] for s in rows] == list(range(ROWS)) and {s["kind"] for s in rows} == {"fresh"}
        rewards = np.array([s["reward"] for s in rows])
        assert rewards.mean() == pytest.approx(train[step]["reward_mean"], abs=1e-6)
        assert np.mean([s["correct"] for s in rows]) == pytest.approx(train[step]["accuracy"], abs=1e-12)
        for name in ("chars", "digit"):
            assert np.mean([s["components"][name] for s in rows]) == pytest.approx(train[step][f"reward/{name}"])
        assert np.mean([s["advantage"] for s in rows]) == pytest.approx(0.0, abs=1e-5)  # group-centred
        for s in rows:  # each row's reward and parts recomputed from its completion: the task's scorer + the function
            text, builtin = s["completion"], score("exact", s["answer"], "", s["completion"], "raw").reward
            assert s["components"] == {"builtin": builtin, "chars": len(text), "digit": float(text.strip().isdigit())}
            assert s["reward"] == pytest.approx(builtin + len(text) + text.strip().isdigit(), abs=1e-6)
            assert s["correct"] == (builtin == 1.0) and s["answer"] == "7"
    assert 0 < np.mean([s["correct"] for s in samples]) < 1  # both kinds of rows are there to check


def test_a_resume_duplicates_no_sample_and_redoes_them_alike(tracked):
    out, first = tracked
    samples = _rows(out / "samples.jsonl")
    assert len({(s["step"], s["row"]) for s in samples}) == len(samples) == 3 * ROWS
    # step 4 ran in both sessions: the resumed run drew the same rows, so its samples are the same
    assert [s for s in samples if s["step"] <= 4] == first["samples.jsonl"]
    # W&B's tables: one per sampled step, the rows of samples.jsonl
    tables = {}
    for session, h in _history(out):
        if "samples/path" in h:
            table = json.loads((session / "files" / h["samples/path"]).read_text())
            tables[h["rl_step"]] = [dict(zip(table["columns"], row)) for row in table["data"]]
    assert sorted(tables) == [2, 4, 6]
    for step, rows in tables.items():
        expected = [s for s in samples if s["step"] == step]
        rows = [{k: json.loads(v) if k in ("components", "rubric") else v for k, v in r.items() if v is not None}
                for r in rows]
        assert rows == expected
    texts = _tb_texts(out / "tensorboard" / "rl")
    assert sorted(texts) == [2, 4, 6] and all(len(t) == 1 for t in texts.values())
    assert texts[6][0].count("\n") == ROWS + 1  # a header, its rule, a line a row


def test_wandb_turned_on_for_a_run_under_way_gets_its_rows_so_far(tmp_path, monkeypatch):
    """Without a Run: rows written with W&B off, then a writer resuming them with W&B on (and again, to see that
    the rows it sent are not sent twice)."""
    _wandb_env(monkeypatch, tmp_path)
    off = Tracker(tiny_cfg(tmp_path, "logging.wandb=false"))
    for step in (1, 2, 3):
        off.write(step, {"loss": step / 4, "note": "not a number"})
    off.close()
    on = tiny_cfg(tmp_path, *TRACKED)
    for keep, steps in ((2, (3, 4)), (3, (4, 5))):  # the second session redoes step 4, which W&B holds
        writer = Tracker(on, keep_rows=keep)
        for step in steps:
            writer.write(step, {"loss": 10.0 * step})
        writer.close()
    out = Path(on.train.out_dir)
    assert [(r["step"], r["loss"]) for r in _rows(out / "metrics.jsonl")] == [
        (1, 0.25), (2, 0.5), (3, 30.0), (4, 40.0), (5, 50.0)]
    assert [(h["_step"], h["rl_step"], h["train/loss"]) for _, h in _history(out)] == [
        (1, 1, 0.25), (2, 2, 0.5), (3, 3, 30.0), (4, 4, 40.0), (5, 5, 50.0)]


def test_wandb_missing_names_the_extra_and_only_wandb_needs_it(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` now fails as if it were not installed
    cfg = tiny_cfg(tmp_path, "logging.wandb=true")
    with pytest.raises(ImportError, match=r"logging\.wandb=true needs the wandb package.*'jaxrl-llm\[wandb\]'"):
        Tracker(cfg)
    assert not Path(cfg.train.out_dir).exists()  # refused before anything was written
    writer = Tracker(tiny_cfg(tmp_path, "logging.wandb=false"))
    writer.write(1, {"loss": 0.5})
    writer.close()
    assert [r["loss"] for r in _rows(Path(cfg.train.out_dir) / "metrics.jsonl")] == [0.5]


def test_online_without_credentials_is_refused_not_prompted(tmp_path, monkeypatch):
    _wandb_env(monkeypatch, tmp_path)
    (tmp_path / "netrc").write_text("")
    cfg = tiny_cfg(tmp_path, "logging.wandb=true", "logging.wandb_mode=online")
    with pytest.raises(ValueError, match="logging.wandb_mode=online needs W&B credentials: set WANDB_API_KEY"):
        Tracker(cfg)
