"""train/checkpoint.py: saves on a nearly full disk. The file system is simulated: free bytes are a
capacity less what the checkpoint folder holds, so deleting a checkpoint frees its real size."""

from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm.train import checkpoint as ck


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
