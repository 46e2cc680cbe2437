"""Checkpoints with orbax: named array trees (parameters, optimizer state, ...) and a JSON registry of
everything else (step, data iterator, model shape, metrics rows, and any state a controller registers).
Keep-N, asynchronous saves, restore straight into the live arrays' sharded layout.

Restore walks back from the newest checkpoint: one that cannot be read (truncated or missing files)
is named, moved aside into `<directory>.damaged/`, and the next older one is tried, so keep-N
protects a run against a save cut short by a crash.

A save first checks free disk: the new checkpoint is written before keep-N deletes the oldest, so a
full disk would cut the save short (ENOSPC). When the file system has less room than the newest
checkpoint takes, the oldest kept ones are deleted early (never the newest); when even that is not
enough, the save is refused with the figures before anything is written, and the run ends with its
newest checkpoint intact (rerun the same command once there is room)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Callable

import jax
import orbax.checkpoint as ocp

from jaxrl_llm.parallel import hosts


class CheckpointMismatchError(ValueError):
    pass


class CheckpointDamagedError(ValueError):
    pass


class CheckpointSpaceError(ValueError):
    pass


class Checkpointer:
    def __init__(self, directory: Path, *, keep: int = 3, async_save: bool = True, log=print):
        self.directory = Path(directory).absolute()
        self.keep, self.log = keep, log
        self.manager = ocp.CheckpointManager(
            self.directory, item_names=("arrays", "registry"),
            options=ocp.CheckpointManagerOptions(max_to_keep=keep, enable_async_checkpointing=async_save))

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def save(self, step: int, arrays: dict, registry: dict, *, wait: bool = False) -> None:
        """Save `arrays` (a dict of array trees) and `registry` as checkpoint `step`, replacing an older
        checkpoint of the same number (e.g. a run stopped twice at the same point)."""
        self.manager.wait_until_finished()
        if step in self.manager.all_steps():
            self.manager.delete(step)
        self._make_room(arrays)
        registry = {**registry, "array_items": sorted(arrays)}
        self.manager.save(step, args=ocp.args.Composite(arrays=ocp.args.StandardSave(arrays),
                                                        registry=ocp.args.JsonSave(registry)))
        if wait:
            self.manager.wait_until_finished()

    def _bytes_needed(self, arrays: dict) -> int:
        """A checkpoint's size: the newest one's on disk, or the arrays' bytes before the first; 5 % and 1 MiB spare."""
        latest = self.manager.latest_step()
        folder = self.directory / str(latest)
        if latest is not None and folder.is_dir():
            size = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
        else:
            size = sum(int(x.nbytes) for x in jax.tree.leaves(arrays))
        return int(size * 1.05) + (1 << 20)

    def _make_room(self, arrays: dict) -> None:
        need = self._bytes_needed(arrays)
        while hosts.any_process(free_bytes(self.directory) < need):  # every process decides the same
            kept = sorted(self.manager.all_steps())
            free = free_bytes(self.directory)
            if len(kept) <= 1:
                raise CheckpointSpaceError(
                    f"{self.directory}: a checkpoint needs about {_gib(need)} and the disk has {_gib(free)} free"
                    + (f" with only the newest checkpoint ({kept[0]}) left, which is kept" if kept else "")
                    + "; nothing was written. Free some space (or lower train.keep_checkpoints) and run the same "
                      "command again to resume")
            self.log(f"checkpoints: {_gib(free)} free on disk, a checkpoint needs about {_gib(need)}: deleting the "
                     f"oldest kept one ({self.directory}/{kept[0]}) before the save instead of after it "
                     f"(train.keep_checkpoints={self.keep})")
            self.manager.delete(kept[0])

    def _restore_one(self, step: int, arrays_like: Callable[[dict], dict], model_signature: dict):
        try:
            registry = self.manager.restore(step, args=ocp.args.Composite(registry=ocp.args.JsonRestore()))["registry"]
        except Exception as e:  # noqa: BLE001 - any failure to read is damage
            raise CheckpointDamagedError(f"registry unreadable ({type(e).__name__}: {_first_line(e)})") from e
        saved = registry.get("model_signature")
        if saved != model_signature:
            raise CheckpointMismatchError(
                f"{self.directory}/{step}: written for model {saved}, but this run's model is {model_signature}; "
                f"use another train.out_dir or set train.resume=false")
        like = arrays_like(registry)
        if sorted(like) != registry.get("array_items"):
            raise CheckpointMismatchError(
                f"{self.directory}/{step}: holds {registry.get('array_items')}, this run needs {sorted(like)} "
                f"(was algo.kl_coef or an explore.* switch changed between the runs?); use another train.out_dir or set train.resume=false")
        abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), like)
        try:
            arrays = self.manager.restore(step, args=ocp.args.Composite(arrays=ocp.args.StandardRestore(abstract)))
        except Exception as e:  # noqa: BLE001
            raise CheckpointDamagedError(f"arrays unreadable ({type(e).__name__}: {_first_line(e)})") from e
        return arrays["arrays"], registry

    def restore_latest(self, arrays_like: Callable[[dict], dict], model_signature: dict, log=print):
        """(step, arrays, registry) of the newest intact checkpoint, or None when there is none at all.

        `arrays_like(registry)` gives live arrays whose structure and shardings the restored ones take.
        Damaged checkpoints are moved aside and reported; when none is intact, one clear error."""
        damaged = []
        for step in sorted(self.manager.all_steps(), reverse=True):
            try:
                arrays, registry = self._restore_one(step, arrays_like, model_signature)
            except CheckpointDamagedError as e:
                aside = self.directory.with_name(self.directory.name + ".damaged") / str(step)
                log(f"checkpoint {self.directory}/{step} is damaged: {e}; moved it to {aside} and trying an older one")
                if jax.process_index() == 0:  # one process moves it for all (a shared file system)
                    aside.parent.mkdir(parents=True, exist_ok=True)
                    shutil.rmtree(aside, ignore_errors=True)
                    shutil.move(str(self.directory / str(step)), str(aside))
                hosts.barrier(f"damaged-checkpoint-{step}")
                self.manager.reload()
                damaged.append(step)
                continue
            return step, arrays, registry
        if damaged:
            raise CheckpointDamagedError(
                f"{self.directory}: no intact checkpoint (damaged: {', '.join(map(str, damaged))}, moved to "
                f"{self.directory.name}.damaged/); set train.resume=false or use another train.out_dir to start over")
        return None

    def wait(self) -> None:
        self.manager.wait_until_finished()

    def close(self) -> None:
        self.manager.wait_until_finished()
        self.manager.close()


def free_bytes(directory: Path) -> int:
    """Free bytes on the file system that holds `directory` (or its nearest existing parent)."""
    path = Path(directory)
    while not path.exists() and path != path.parent:
        path = path.parent
    return shutil.disk_usage(path).free


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"


def _first_line(e: Exception) -> str:
    text = str(e).strip().splitlines()
    return text[0][:200] if text else ""
