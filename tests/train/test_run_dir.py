"""train/run_dir.py and the run's use of its folder: one writer at a time, eval reads only, train.resume=false
never lands on an old run, a resume with another config is refused naming each key, every start is kept in
the config history. Toy runs of 1-2 steps (tests/test_trainer.py's tiny config)."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml


from jaxrl_llm.config import load_config
from jaxrl_llm.train.checkpoint import CheckpointMismatchError
from jaxrl_llm.train.loop import Run
from jaxrl_llm.train.run_dir import ConfigChangedError, RunFolder, RunFolderBusyError, RunFolderUsedError
from tests.helpers import tiny_cfg, train_rows
from tests.helpers import truncate_data as _damage

pytestmark = pytest.mark.slow  # integration runs: tools/test.sh runs them, `-m "not slow"` leaves them out

ROOT = Path(__file__).resolve().parents[2]


def _files(folder: Path, everything: bool = False) -> dict:
    """Every file under `folder`: size, modification time and inode (a rewrite or a move changes them). Unless
    `everything`, not the two a writer Run writes as it starts, before it can be refused: the lock (its name)
    and the scratch model's tokenizer files (the same bytes again)."""
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns, p.stat().st_ino)
            for p in sorted(folder.rglob("*")) if p.is_file()
            and (everything or not (p.name == "run.lock" or p.parent.name == "tokenizer"))}


def _steps(folder: Path) -> list[int]:
    return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit()) if folder.is_dir() else []


@pytest.fixture(scope="module")
def two_steps(tmp_path_factory):
    """A 2-step run (checkpoints 0 and 2) trained once; each test works on a copy of its folder. Returns
    `cfg(tmp_path, *overrides)`: the run's config (its data files, unchanged) with its folder in tmp_path, after
    copying the trained folder there."""
    base = tmp_path_factory.mktemp("two_steps")
    Run(tiny_cfg(base, "train.steps=2"), log=lambda *a: None).train()

    def cfg(tmp_path, *extra):
        if not (tmp_path / "run").exists():
            shutil.copytree(base / "run", tmp_path / "run")
        return tiny_cfg(base, f"train.out_dir={tmp_path / 'run'}", *extra)

    return cfg


def test_resume_false_on_a_used_folder_is_refused_and_overwrite_moves_the_old_run_aside(tmp_path, two_steps):
    cfg = two_steps(tmp_path, "train.steps=2")
    out = Path(cfg.train.out_dir)
    before = _files(out)
    with pytest.raises(RunFolderUsedError, match=rf"{out} holds a run \(checkpoints, config.yaml, .*metrics.jsonl.*"
                                                 r"train.overwrite=true to move the old run aside"):
        Run(two_steps(tmp_path, "train.steps=1", "train.resume=false"), log=lambda *a: None)
    assert _files(out) == before  # refused before anything was written

    logs = []
    Run(two_steps(tmp_path, "train.steps=1", "train.resume=false", "train.overwrite=true"), log=logs.append).train()
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("run.overwritten-")]
    assert len(aside) == 1 and any(f"moved the run that was in {out} to {aside[0]}" in ln for ln in logs), logs
    moved = {k: v[:2] for k, v in _files(aside[0]).items()}
    assert moved == {k: v[:2] for k, v in before.items()}  # the old run, whole, nothing deleted
    assert sorted(train_rows(out)) == [1] and _steps(out / "checkpoints") == [0, 1]
    assert sorted(train_rows(aside[0])) == [1, 2]
    old = Run(two_steps(tmp_path, "train.steps=2", f"train.out_dir={aside[0]}"), log=lambda *a: None)
    assert old.try_resume() and old.state.step == 2  # the old run is a run folder of its own
    assert old.save().endswith(f"already in {aside[0]}/checkpoints/2, kept as it was")  # a re-save writes nothing
    assert _steps(aside[0] / "checkpoints") == [0, 2]


def test_a_second_writer_is_refused_naming_the_holder_and_eval_only_reads_a_live_run(tmp_path, capsys, monkeypatch,
                                                                                      two_steps):
    monkeypatch.chdir(tmp_path)  # eval writes eval_out/ in the working directory
    from jaxrl_llm.cli import main

    cfg = two_steps(tmp_path, "train.steps=2")
    out = Path(cfg.train.out_dir)
    _damage(out / "checkpoints" / "2")
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(cfg.to_dict()))
    holder = subprocess.Popen(  # another trainer on the folder: the real lock, held until its stdin closes
        [sys.executable, "-c", "import sys, yaml\nfrom jaxrl_llm.config import load_config\n"
         "from jaxrl_llm.train.run_dir import RunFolder\n"
         f"with RunFolder(load_config({str(config)!r})).held():\n"
         "    print('LOCKED', flush=True)\n    sys.stdin.read()"],
        cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "LOCKED"
        with pytest.raises(RunFolderBusyError, match=rf"{out} is in use by another run \(pid {holder.pid} on .*, "
                                                     r"locked since .*command: -c\)"):
            Run(cfg, log=lambda *a: None)
        before = _files(out, everything=True)
        capsys.readouterr()
        assert main(["eval", "--config", str(config)]) == 0
        captured = capsys.readouterr()
        assert _files(out, everything=True) == before  # nothing moved, rewritten or added: not even the tokenizer
        assert '"step": 0' in captured.out  # the damaged newest was skipped, not moved
        assert f"checkpoint {out / 'checkpoints'}/2 is damaged" in captured.err and "left in place" in captured.err
    finally:
        holder.kill()  # SIGKILL: no clean-up runs, the kernel drops the lock
        holder.wait()
    with RunFolder(cfg).held():
        assert json.loads((out / "run.lock").read_text())["pid"] == os.getpid()


def test_a_resume_with_another_config_is_refused_naming_each_key(tmp_path):
    cfg = tiny_cfg(tmp_path, "train.steps=1", "optim.schedule=cosine")
    Run(cfg, log=lambda *a: None).train()
    out = Path(cfg.train.out_dir)
    data = Path(cfg.data.path)
    changed = tiny_cfg(tmp_path, "train.steps=2", "optim.schedule=cosine", "optim.lr=0.01")
    data.write_text(data.read_text().replace("magic word", "secret word"))  # another file at the same path
    before = _files(out)
    with pytest.raises(ConfigChangedError, match=r"checkpoints/1 was written with another config: "
                                                 r"data.path#sha256 [0-9a-f.]+ -> [0-9a-f.]+, optim.lr 0.02 -> 0.01\. "
                                                 r".*train.accept_changes=data.path,optim.lr"):
        Run(changed, log=lambda *a: None).try_resume()
    assert _files(out) == before

    logs = []
    accepted = tiny_cfg(tmp_path, "train.steps=2", "optim.schedule=cosine", "optim.lr=0.01",
                         "train.accept_changes=data.path,optim.lr")
    data.write_text(data.read_text().replace("magic word", "secret word"))
    run = Run(accepted, log=logs.append)
    run.train()
    said = [ln for ln in logs if "differs from" in ln or "cosine" in ln]
    assert len(said) == 2 and "data.path#sha256" in said[0] and "optim.lr 0.02 -> 0.01" in said[0] \
        and "train.steps 1 -> 2" in said[0], said
    assert said[1].startswith("train.steps 1 -> 2 moves the cosine learning-rate schedule"), said
    history = [json.loads(ln) for ln in (out / "config_history.jsonl").read_text().splitlines()]
    assert [h["resumed_from"] for h in history] == [None, f"{out.absolute() / 'checkpoints'}/1"]
    assert history[1]["changes"]["optim.lr"] == [0.02, 0.01] and history[0]["config"]["optim"]["lr"] == 0.02
    assert yaml.safe_load((out / "config.yaml").read_text())["optim"]["lr"] == 0.01

    # a checkpoint written before runs recorded their config resumes with one line saying so
    registry = out / "checkpoints" / "2" / "registry" / "metadata"
    record = json.loads(registry.read_text())
    del record["config"]
    registry.write_text(json.dumps(record))
    logs = []
    assert Run(tiny_cfg(tmp_path, "train.steps=2", "optim.lr=0.5"), log=logs.append).try_resume()
    assert [ln for ln in logs if "config" in ln] == [
        f"{out.absolute() / 'checkpoints'}/2 has no config record (written before runs kept one): the config is not "
        f"checked against it"]


def test_per_item_state_of_another_size_is_an_error_not_damage(tmp_path):
    """E3 keeps state per training item: with the data changed (accepted), its arrays no longer fit. That is an
    error naming the arrays, and every checkpoint stays where it is (it used to be moved aside as damaged)."""
    e3 = ("explore.e3.enabled=true", "explore.e3.n_high=20", "train.steps=1")
    cfg = tiny_cfg(tmp_path, *e3)
    Run(cfg, log=lambda *a: None).train()
    out = Path(cfg.train.out_dir)
    more = tiny_cfg(tmp_path, *e3, "train.accept_changes=data.path")
    data = Path(more.data.path)
    data.write_text(data.read_text() + json.dumps({"question": "One more?", "answer": "7", "scorer": "exact"}) + "\n")
    before = _files(out)
    with pytest.raises(CheckpointMismatchError, match=r"checkpoints/1: arrays of other shapes than this run's "
                                                      r"\(\['explore'\]\['e3'\].* \[40\] -> \[41\].*Nothing was moved"):
        Run(more, log=lambda *a: None).try_resume()
    assert _files(out) == before and not (out / "checkpoints.damaged").exists()


def test_cutting_metrics_on_resume_is_all_or_nothing(tmp_path):
    """A resume keeps the rows up to its checkpoint. If writing them fails part-way (here the file-size limit of
    a full disk), metrics.jsonl must still hold every old row: it used to be truncated in place first."""
    import resource
    import signal

    from jaxrl_llm.train.metrics import MetricsWriter

    writer = MetricsWriter(tmp_path, tensorboard=False)
    for step in range(1, 7):
        writer.write(step, {"reward_mean": step / 10, "note": "x" * 40})
    path = tmp_path / "metrics.jsonl"
    before = path.read_text()
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (100, hard))  # the three kept rows are ~300 bytes
    try:
        with pytest.raises(OSError, match="File too large"):
            MetricsWriter(tmp_path, tensorboard=False, keep_rows=3)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, handler)
    assert path.read_text() == before and sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl"]
    MetricsWriter(tmp_path, tensorboard=False, keep_rows=3)
    assert path.read_text().splitlines() == before.splitlines()[:3]


def _scalars(folder: Path) -> dict:
    """{(tag, step): [values]} as TensorBoard shows a run folder: event files in the order they were written, and
    a SessionLog.START at step N hiding every earlier event of step >= N (TensorBoard's purge rule)."""
    import struct

    from tensorboardX.proto.event_pb2 import Event, SessionLog

    files = []
    for f in folder.glob("events.out.tfevents.*"):
        data, events, at = f.read_bytes(), [], 0
        while at < len(data):  # TFRecord: length (u64), its crc (u32), payload, payload crc (u32)
            (n,) = struct.unpack("<Q", data[at:at + 8])
            events.append(Event.FromString(data[at + 12:at + 12 + n]))
            at += 12 + n + 4
        files.append((events[0].wall_time, events))
    seen: list = []
    for _, events in sorted(files, key=lambda x: x[0]):
        for e in events:
            if e.HasField("session_log") and e.session_log.status == SessionLog.START:
                seen = [s for s in seen if s[1] < e.step]
            for v in e.summary.value:
                seen.append((v.tag, e.step, v.simple_value))
    out: dict = {}
    for tag, step, value in seen:
        out.setdefault((tag, step), []).append(value)
    return out


def test_tensorboard_shows_each_step_once_after_a_resume(tmp_path):
    from jaxrl_llm.train.metrics import MetricsWriter

    first = MetricsWriter(tmp_path, tensorboard=True)
    first.write(0, {"nll": 9.0}, kind="eval_before_sft")
    for step in (10, 20, 30):
        first.write(step, {"nll": 1.0 / step}, kind="sft")
    for step in range(1, 5):
        first.write(step, {"loss": float(step)})
    first.close()
    # resumed from a checkpoint taken after RL step 2 (the rows before it: 1 + 3 SFT rows + 2 RL rows)
    again = MetricsWriter(tmp_path, tensorboard=True, keep_rows=6)
    for step in (3, 4, 5):
        again.write(step, {"loss": 10.0 * step})
    again.close()
    rl, sft = _scalars(tmp_path / "tensorboard" / "rl"), _scalars(tmp_path / "tensorboard" / "sft")
    assert {k: v for k, v in rl.items() if k[0] == "train/loss"} == {
        ("train/loss", 1): [1.0], ("train/loss", 2): [2.0], ("train/loss", 3): [30.0], ("train/loss", 4): [40.0],
        ("train/loss", 5): [50.0]}
    assert {k: v for k, v in sft.items() if k[0] in ("sft/nll", "eval_before_sft/nll")} == {
        ("eval_before_sft/nll", 0): [9.0], ("sft/nll", 10): [pytest.approx(0.1)],
        ("sft/nll", 20): [pytest.approx(0.05)], ("sft/nll", 30): [pytest.approx(1 / 30)]}


def test_local_dataset_files_are_fingerprinted_and_a_changed_one_is_refused(tmp_path):
    """data.source=hf with local data_files (a dict of lists here): each file's bytes are in the record, so
    another file at the same path is a change the resume names (data.files#...), and data.columns is one value."""
    from jaxrl_llm.train.run_dir import SAFE_TO_CHANGE, config_changes, config_record, matches

    a, b = tmp_path / "train.jsonl", tmp_path / "test.jsonl"
    a.write_text('{"q": "1+1", "a": "2"}\n')
    b.write_text('{"q": "2+2", "a": "4"}\n')
    args = ["data.source=hf", "data.dataset=json", f"data.data_files={{train: [{a}], test: {b}}}",
            "data.columns={question: q, answer: a}"]
    before = config_record(load_config(None, args))
    assert before["data.columns"] == {"question": "q", "answer": "a"}
    a.write_text('{"q": "1+1", "a": "3"}\n')
    changed = config_changes(before, config_record(load_config(None, args)))
    assert list(changed) == [f"data.files#{a}#sha256"]
    assert not matches(f"data.files#{a}#sha256", SAFE_TO_CHANGE) and matches(f"data.files#{a}#sha256", ["data"])
    assert matches("logging.wandb", SAFE_TO_CHANGE)
