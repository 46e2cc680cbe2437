"""train/checkpoint.py: saves on a nearly full disk. The file system is simulated: free bytes are a
capacity less what the checkpoint folder holds, so deleting a checkpoint frees its real size."""

import errno
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm.train import checkpoint as ck
from tests.helpers import truncate_data


def _du(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) if folder.exists() else 0


def _arrays(step):
    noise = np.random.default_rng(step).standard_normal((1024, 1024), np.float32)  # 4 MiB that do not compress
    return {"params": {"w": jnp.asarray(noise)}}


def _disk(tmp_path, monkeypatch, ckpt, capacity):
    """Free bytes = capacity - what the checkpoints take; every write checks there was room for it."""
    monkeypatch.setattr(ck, "free_bytes", lambda _d: capacity[0] - _du(ckpt.directory))
    save, seen = ckpt.manager.save, []

    def checked_save(step, *a, **k):
        seen.append((step, ck.free_bytes(ckpt.directory)))
        return save(step, *a, **k)

    monkeypatch.setattr(ckpt.manager, "save", checked_save)
    return seen


def _restore(ckpt):
    like = lambda _reg: _arrays(0)  # noqa: E731
    step, arrays, _ = ckpt.restore_latest(like, {"m": 1}, log=lambda *a: None)
    np.testing.assert_array_equal(np.asarray(arrays["params"]["w"]), np.asarray(_arrays(step)["params"]["w"]))
    return step


def test_a_save_deletes_the_oldest_early_when_the_disk_is_short(tmp_path, monkeypatch):
    logs = []
    ckpt = ck.Checkpointer(tmp_path / "checkpoints", keep=3, async_save=False, log=logs.append)
    capacity = [1 << 40]
    seen = _disk(tmp_path, monkeypatch, ckpt, capacity)
    ckpt.save(0, _arrays(0), {"model_signature": {"m": 1}}, wait=True)
    one = _du(ckpt.directory / "0")
    assert one > 3 << 20
    capacity[0] = int(3.5 * one) + (2 << 20)  # room for 3 checkpoints and a half, not for 4
    for step in (1, 2):
        ckpt.save(step, _arrays(step), {"model_signature": {"m": 1}}, wait=True)
    assert sorted(ckpt.manager.all_steps()) == [0, 1, 2] and not logs
    for step in (3, 4):  # keep-3 writes the 4th before deleting the oldest: no room for that
        ckpt.save(step, _arrays(step), {"model_signature": {"m": 1}}, wait=True)
        assert sorted(ckpt.manager.all_steps()) == [step - 2, step - 1, step]
    need = int(one * 1.05) + (1 << 20)
    assert all(free >= need for _step, free in seen), (need, seen)  # every write had the room it takes
    assert len(logs) == 2 and "deleting the oldest kept one" in logs[0] and logs[0].endswith(
        "(train.keep_checkpoints=3)") and f"{ckpt.directory}/0" in logs[0] and f"{ckpt.directory}/1" in logs[1]
    assert _restore(ckpt) == 4
    ckpt.close()


def test_a_save_without_room_is_refused_before_writing_and_keeps_the_newest(tmp_path, monkeypatch):
    ckpt = ck.Checkpointer(tmp_path / "checkpoints", keep=3, async_save=False, log=lambda *a: None)
    capacity = [1 << 40]
    seen = _disk(tmp_path, monkeypatch, ckpt, capacity)
    for step in (0, 1):
        ckpt.save(step, _arrays(step), {"model_signature": {"m": 1}}, wait=True)
    one = _du(ckpt.directory / "0")
    capacity[0] = int(1.9 * one)  # after deleting step 0 early there is still no room for a second one
    with pytest.raises(ck.CheckpointSpaceError, match=r"needs about .* GiB and the disk has .* GiB free with "
                                                      r"only the newest checkpoint \(1\) left.*nothing was written"):
        ckpt.save(2, _arrays(2), {"model_signature": {"m": 1}}, wait=True)
    assert [s for s, _free in seen] == [0, 1]  # the refused save never reached orbax
    assert sorted(ckpt.manager.all_steps()) == [1] and not (ckpt.directory / "2").exists()
    assert _restore(ckpt) == 1
    ckpt.close()


def test_the_first_save_is_sized_from_the_arrays(tmp_path, monkeypatch):
    ckpt = ck.Checkpointer(tmp_path / "checkpoints", keep=2, async_save=False, log=lambda *a: None)
    _disk(tmp_path, monkeypatch, ckpt, [3 << 20])  # 3 MiB free, a 4 MiB array
    with pytest.raises(ck.CheckpointSpaceError, match=r"needs about 0\.01 GiB and the disk has 0\.00 GiB free; nothing") as e:
        ckpt.save(0, _arrays(0), {"model_signature": {"m": 1}})
    assert "newest checkpoint" not in str(e.value) and not ckpt.directory.joinpath("0").exists()
    ckpt.close()


def test_free_bytes_reads_the_nearest_existing_folder(tmp_path):
    assert ck.free_bytes(tmp_path / "not" / "yet") == ck.free_bytes(tmp_path) > 0


def _small(step, n=4):
    return {"params": {"w": jnp.full((n, 4), float(step)), "b": jnp.arange(3.0) + step}}


def _restore_small(ckpt, n=4, log=None):
    return ckpt.restore_latest(lambda _reg: _small(0, n), {"m": 1}, log=log if log is not None else (lambda *a: None))


def _tree(folder: Path) -> dict:
    return {str(p.relative_to(folder)): (p.stat().st_mtime_ns, p.stat().st_ino) for p in folder.rglob("*")}


def test_a_save_of_an_existing_step_writes_nothing(tmp_path):
    """A run stopped right after resuming saves the step it resumed from: that checkpoint stays as it was (it
    used to be deleted first, leaving no checkpoint of the step if the process died before the new one was
    written)."""
    ckpt = ck.Checkpointer(tmp_path / "checkpoints", keep=3, async_save=False, log=lambda *a: None)
    assert ckpt.save(1, _small(1), {"model_signature": {"m": 1}}, wait=True)
    before = _tree(ckpt.directory / "1")
    assert ckpt.save(1, _small(7), {"model_signature": {"m": 1}}, wait=True) is False
    assert _tree(ckpt.directory / "1") == before
    step, arrays, _ = _restore_small(ckpt)
    assert step == 1 and float(arrays["params"]["w"][0, 0]) == 1.0
    ckpt.close()


def test_a_save_orbax_declines_is_an_error(tmp_path):
    ckpt = ck.Checkpointer(tmp_path / "checkpoints", keep=3, async_save=False, log=lambda *a: None)
    for step in (2, 4):
        ckpt.save(step, _small(step), {"model_signature": {"m": 1}}, wait=True)
    with pytest.raises(ck.CheckpointSaveError, match=r"declined to save step 3 .*newest checkpoint, step 4\); "
                                                     r"nothing was written"):
        ckpt.save(3, _small(3), {"model_signature": {"m": 1}}, wait=True)
    assert sorted(ckpt.manager.all_steps()) == [2, 4]
    ckpt.close()


def test_a_shape_the_run_does_not_have_is_an_error_and_moves_nothing(tmp_path):
    """Arrays of another shape (per-item explorer state after the data changed) are the run's fault, not the
    checkpoint's: an error naming the arrays, every checkpoint left where it is."""
    ckpt = ck.Checkpointer(tmp_path / "checkpoints", keep=3, async_save=False, log=lambda *a: None)
    for step in (1, 2):
        ckpt.save(step, _small(step), {"model_signature": {"m": 1}}, wait=True)
    with pytest.raises(ck.CheckpointMismatchError, match=r"checkpoints/2: arrays of other shapes than this run's "
                                                         r"\(\['params'\]\['w'\] \[4, 4\] -> \[5, 4\]\).*"
                                                         r"Nothing was moved"):
        _restore_small(ckpt, n=5)
    # a checkpoint from before shapes were recorded: orbax's own error, still not damage
    manager = ckpt.manager
    manager.save(3, args=ck.ocp.args.Composite(arrays=ck.ocp.args.StandardSave(_small(3)),
                                               registry=ck.ocp.args.JsonSave({"model_signature": {"m": 1},
                                                                              "array_items": ["params"]})))
    manager.wait_until_finished()
    with pytest.raises(ck.CheckpointReadError, match=r"checkpoints/3: could not restore its arrays \(ValueError: "
                                                     r"Requested shape: \(5, 4\) is not compatible with the stored "
                                                     r"shape: \(4, 4\).*nothing was moved"):
        _restore_small(ckpt, n=5)
    assert sorted(ckpt.manager.all_steps()) == [1, 2, 3] and not (tmp_path / "checkpoints.damaged").exists()
    ckpt.close()


def test_damage_is_told_from_other_failures(tmp_path):
    """What orbax raises for a truncated or missing file counts as damage; device memory (XLA's
    RESOURCE_EXHAUSTED), a transient I/O error (EIO) or a permission error never do."""
    errors = {}
    for case in ("truncated", "missing", "registry"):
        ckpt = ck.Checkpointer(tmp_path / case, keep=3, async_save=False, log=lambda *a: None)
        ckpt.save(1, _small(1), {"model_signature": {"m": 1}}, wait=True)
        data = [f for f in (ckpt.directory / "1" / "arrays").rglob("d/*") if f.is_file() and f.stat().st_size > 64]
        if case == "truncated":
            truncate_data(ckpt.directory / "1")
        elif case == "missing":
            for f in data:
                f.unlink()
        else:
            (ckpt.directory / "1" / "registry" / "metadata").write_text('{"model_signature": ')
        logs = []
        with pytest.raises(ck.CheckpointDamagedError, match=r"no intact checkpoint \(damaged: 1, moved to "):
            _restore_small(ckpt, log=logs.append)
        assert len(logs) == 1 and f"checkpoint {ckpt.directory}/1 is damaged: " in logs[0], logs
        errors[case] = logs[0]
        ckpt.close()
    assert "OUT_OF_RANGE" in errors["truncated"] and "JSONDecodeError" in errors["registry"], errors
    assert not ck.is_damage(ValueError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 2.1GiB"))
    assert not ck.is_damage(OSError(errno.EIO, "Input/output error"))
    assert not ck.is_damage(PermissionError(errno.EACCES, "Permission denied"))


_NOISE = r"""
import os, sys
from pathlib import Path
import jax.numpy as jnp
from jaxrl_llm.train import checkpoint as ck

tree = lambda v: {"params": {f"w{i}": jnp.full((64, 64), v + i) for i in range(40)}}
ckpt = ck.Checkpointer(Path(sys.argv[1]), keep=3, async_save=False, log=print)
for step in (1, 2):
    ckpt.save(step, tree(float(step)), {"model_signature": {"m": 1}}, wait=True)
for f in (ckpt.directory / "2" / "arrays").rglob("d/*"):
    if f.stat().st_size > 64:
        os.truncate(f, f.stat().st_size // 2)
step, arrays, _ = ckpt.restore_latest(lambda reg: tree(0.0), {"m": 1}, log=print)
print("restored", step, float(arrays["params"]["w3"][0, 0]))
"""


@pytest.mark.slow
def test_a_damaged_checkpoint_costs_one_line_of_output(tmp_path):
    """The fallback from a damaged checkpoint is one line naming it, not a traceback from each of orbax's reads
    still in flight when the event loop closed ('RuntimeError: Event loop is closed', about 95 of them)."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", _NOISE, str(tmp_path / "checkpoints")], capture_output=True,
                          text=True, timeout=240, cwd=Path(__file__).resolve().parents[2])
    lines = [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.strip() and "absl" not in ln]
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert len(lines) == 2, "\n".join(lines[:40])
    assert lines[0].startswith(f"checkpoint {tmp_path / 'checkpoints'}/2 is damaged: arrays unreadable (ValueError: ")
    assert lines[1] == "restored 1 4.0"



def test_only_the_reports_of_reads_left_behind_by_a_failed_restore_are_dropped(monkeypatch, caplog):
    """The two kinds of report orbax's abandoned reads make ('Event loop is closed' through sys.unraisablehook;
    asyncio's 'Future/Task exception was never retrieved' for a failed tensorstore read) are dropped, deterministically;
    any other unraisable error and any other asyncio error still reach the user."""
    import logging
    import sys
    import types

    from jaxrl_llm.train.checkpoint import _quiet_closed_loop_reports

    seen = []
    monkeypatch.setattr(sys, "unraisablehook", seen.append)
    _quiet_closed_loop_reports()

    def unraisable(e):
        return types.SimpleNamespace(exc_type=type(e), exc_value=e, exc_traceback=None, err_msg=None, object=None)

    closed, other = unraisable(RuntimeError("Event loop is closed")), unraisable(RuntimeError("disk on fire"))
    sys.unraisablehook(closed)
    sys.unraisablehook(other)
    assert seen == [other]

    def report(msg, exc):
        try:
            raise exc
        except type(exc):
            logging.getLogger("asyncio").error(msg, exc_info=True)

    with caplog.at_level(logging.ERROR, logger="asyncio"):
        report("Future exception was never retrieved", ValueError("NOT_FOUND: ... tensorstore_spec {...}"))
        report("Future exception was never retrieved", ValueError("a user's own future"))
        report("Task exception was never retrieved\nfuture: <Task finished name='Task-377' coro=<async_deserialize()>>",
               ValueError("OUT_OF_RANGE: ... tensorstore_spec {...}"))
        report("Task exception was never retrieved", ValueError("a user's own task"))
        report("Task was destroyed but it is pending!", ValueError("tensorstore_spec"))
    assert [r.exc_info[1].args[0] for r in caplog.records] == ["a user's own future", "a user's own task",
                                                               "tensorstore_spec"]
