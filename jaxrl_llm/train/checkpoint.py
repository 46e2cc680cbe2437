"""Checkpoints with orbax: named array trees (parameters, optimizer state, ...) and a JSON registry of
everything else (step, data iterator, model shape, metrics rows, and any state a controller registers).
Keep-N, asynchronous saves, restore straight into the live arrays' sharded layout.

Restore walks back from the newest checkpoint: one that is damaged (a file missing, truncated or not
decodable) is named in one line, moved aside into `<directory>.damaged/`, and the next older one is
tried, so keep-N protects a run against a save cut short by a crash. Any other failure to restore (a
shape that changed, device memory, an I/O error) is an error naming the cause, with nothing moved: those
checkpoints are intact. On a multi-host run the processes decide together (a process that alone found
damage would skip a collective the others enter). A read-only Checkpointer (`jaxrl-llm eval`) skips a
damaged checkpoint without moving it, and never deletes or creates anything.

A save of a step that already has a checkpoint writes nothing (that checkpoint is the state a run just
resumed from; deleting it first would leave none if the process died before the new one was written),
and a save orbax declines (a step not newer than its newest) is an error, never a silent no-op.

A save first checks free disk: the new checkpoint is written before keep-N deletes the oldest, so a
full disk would cut the save short (ENOSPC). When the file system has less room than the newest
checkpoint takes, the oldest kept ones are deleted early (never the newest); when even that is not
enough, the save is refused with the figures before anything is written, and the run ends with its
newest checkpoint intact (rerun the same command once there is room)."""

from __future__ import annotations

import json
import logging
import shutil
import sys
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


class CheckpointReadError(ValueError):
    """A checkpoint could not be restored for a reason other than damage; nothing was moved."""


class CheckpointSaveError(ValueError):
    pass


# tensorstore / OS outcomes that mean the run or the machine is at fault, not the files: never damage
NOT_DAMAGE = ("RESOURCE_EXHAUSTED", "UNAVAILABLE", "DEADLINE_EXCEEDED", "PERMISSION_DENIED", "CANCELLED",
              "ABORTED", "UNAUTHENTICATED", "not compatible with the stored shape")
# a file missing (NOT_FOUND), shorter than written (OUT_OF_RANGE), or bytes that do not decode
DAMAGE = ("NOT_FOUND:", "DATA_LOSS:", "OUT_OF_RANGE:", "Zstd", "decompress", "Truncated", "corrupt")


class Checkpointer:
    def __init__(self, directory: Path, *, keep: int = 3, async_save: bool = True, log=print,
                 read_only: bool = False):
        self.directory = Path(directory).absolute()
        self.keep, self.log, self.read_only = keep, log, read_only
        options = ocp.CheckpointManagerOptions(
            read_only=True, create=False, max_to_keep=None, save_interval_steps=0, cleanup_tmp_directories=False,
        ) if read_only else ocp.CheckpointManagerOptions(max_to_keep=keep, enable_async_checkpointing=async_save)
        self.manager = ocp.CheckpointManager(self.directory, item_names=("arrays", "registry"), options=options)

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def save(self, step: int, arrays: dict, registry: dict, *, wait: bool = False) -> bool:
        """Save `arrays` (a dict of array trees) and `registry` as checkpoint `step`; False, writing nothing,
        when checkpoint `step` exists already (a run stopped right after resuming from it)."""
        self.manager.wait_until_finished()
        if step in self.manager.all_steps():
            return False
        self._make_room(arrays)
        shapes = {jax.tree_util.keystr(k): list(x.shape) for k, x in jax.tree_util.tree_leaves_with_path(arrays)}
        registry = {**registry, "array_items": sorted(arrays), "array_shapes": shapes}
        if not self.manager.save(step, args=ocp.args.Composite(arrays=ocp.args.StandardSave(arrays),
                                                               registry=ocp.args.JsonSave(registry))):
            raise CheckpointSaveError(
                f"{self.directory}: orbax declined to save step {step} (a save must be newer than the newest "
                f"checkpoint, step {self.manager.latest_step()}); nothing was written")
        if wait:
            self.manager.wait_until_finished()
        return True

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

    def _restore_one(self, step: int, arrays_like: Callable[[dict], dict], model_signature: dict, check):
        where = f"{self.directory}/{step}"

        def read_registry():
            registry = self.manager.restore(step, args=ocp.args.Composite(registry=ocp.args.JsonRestore()))["registry"]
            saved = registry.get("model_signature")
            if saved != model_signature:
                raise CheckpointMismatchError(
                    f"{where}: written for model {saved}, but this run's model is {model_signature}; "
                    f"use another train.out_dir or set train.resume=false")
            like = arrays_like(registry)
            if sorted(like) != registry.get("array_items"):
                raise CheckpointMismatchError(
                    f"{where}: holds {registry.get('array_items')}, this run needs {sorted(like)} (was "
                    f"algo.kl_coef or an explore.* switch changed between the runs?); use another train.out_dir "
                    f"or set train.resume=false")
            if check is not None:
                check(registry, where)
            _check_shapes(where, registry.get("array_shapes"), like)
            return registry, like

        registry, like = self._agreed(where, "registry", read_registry)
        abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), like)
        arrays = self._agreed(where, "arrays", lambda: self.manager.restore(
            step, args=ocp.args.Composite(arrays=ocp.args.StandardRestore(abstract)))["arrays"])
        return arrays, registry

    def _agreed(self, where: str, what: str, read: Callable):
        """read() on every process with one outcome for all: its value; an error (ours as raised, orbax's
        named) when any process had one; or damage when any process found it, and none an error."""
        try:
            value, failure, kind = read(), None, "ok"
        except CheckpointMismatchError as e:
            value, failure, kind = None, e, "error"
        except Exception as e:  # noqa: BLE001 - sorted into damage or error below
            value, failure, kind = None, e, "damaged" if is_damage(e) else "error"
        error, damaged = hosts.any_process(kind == "error"), hosts.any_process(kind == "damaged")
        if error:
            if isinstance(failure, CheckpointMismatchError):
                raise failure
            cause = f"{type(_root(failure)).__name__}: {_first_line(_root(failure))}" if kind == "error" else \
                "another process could not read it; its log names the cause"
            raise CheckpointReadError(
                f"{where}: could not restore its {what} ({cause}). The files look intact, so nothing was moved "
                f"aside; fix the cause and run the same command again") from failure
        if damaged:
            cause = f"{type(_root(failure)).__name__}: {_first_line(_root(failure))}" if failure else \
                "damaged as another process read it"
            raise CheckpointDamagedError(f"{what} unreadable ({cause})") from None
        return value

    def restore_latest(self, arrays_like: Callable[[dict], dict], model_signature: dict, log=print, check=None):
        """(step, arrays, registry) of the newest intact checkpoint, or None when there is none at all.

        `arrays_like(registry)` gives live arrays whose structure and shardings the restored ones take;
        `check(registry, where)` may refuse a checkpoint (raising CheckpointMismatchError). Damaged
        checkpoints are moved aside (left in place when read-only) and reported; none intact: one clear error."""
        _quiet_closed_loop_reports()  # before any read: a failed one's reports arrive while orbax is still unwinding
        damaged = []
        for step in sorted(self.manager.all_steps(), reverse=True):
            try:
                arrays, registry = self._restore_one(step, arrays_like, model_signature, check)
            except CheckpointDamagedError as e:
                damaged.append(step)
                if self.read_only:
                    log(f"checkpoint {self.directory}/{step} is damaged: {e}; left in place (read-only), trying an "
                        f"older one")
                    continue
                aside = self.directory.with_name(self.directory.name + ".damaged") / str(step)
                log(f"checkpoint {self.directory}/{step} is damaged: {e}; moved it to {aside} and trying an older one")
                if jax.process_index() == 0:  # one process moves it for all (a shared file system)
                    aside.parent.mkdir(parents=True, exist_ok=True)
                    shutil.rmtree(aside, ignore_errors=True)
                    shutil.move(str(self.directory / str(step)), str(aside))
                hosts.barrier(f"damaged-checkpoint-{step}")
                self.manager.reload()
                continue
            return step, arrays, registry
        if damaged:
            moved = "left in place" if self.read_only else f"moved to {self.directory.name}.damaged/"
            raise CheckpointDamagedError(
                f"{self.directory}: no intact checkpoint (damaged: {', '.join(map(str, damaged))}, {moved}); set "
                f"train.resume=false train.overwrite=true or use another train.out_dir to start over")
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


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0][:300] if text else ""


def _chain(e: BaseException):
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        yield e
        e = e.__cause__ or (None if e.__suppress_context__ else e.__context__)  # as Python prints the chain


def _root(e: BaseException) -> BaseException:
    """The innermost exception of e's chain: tensorstore's own words, under orbax's wrapping."""
    return list(_chain(e))[-1]


def is_damage(e: BaseException) -> bool:
    """Whether a restore failure says the checkpoint's files are damaged: a file missing or not decodable as
    written (truncated, corrupt bytes, broken JSON). Anything else (device memory, a shape this run does not
    have, permissions, a transient I/O error) leaves the checkpoint alone."""
    chain = list(_chain(e))
    texts = [str(c) for c in chain]
    if any(isinstance(c, (MemoryError, PermissionError)) for c in chain) or \
            any(word in t for t in texts for word in NOT_DAMAGE):
        return False
    if any(isinstance(c, (FileNotFoundError, json.JSONDecodeError)) for c in chain):
        return True
    if any(isinstance(c, KeyError) and "was not found in the checkpoint" in str(c) for c in chain):
        return True  # a whole item folder (arrays/, registry/) is missing
    return any(word in t for t in texts for word in DAMAGE)


def _check_shapes(where: str, saved: dict | None, like: dict) -> None:
    """Name the arrays whose shapes differ between checkpoint and run before orbax reads any (orbax's own
    error names no array). Checkpoints from before shapes were recorded go straight to the restore."""
    if saved is None:
        return
    now = {jax.tree_util.keystr(k): list(x.shape) for k, x in jax.tree_util.tree_leaves_with_path(like)}
    differ = [f"{k} {saved[k]} -> {now[k]}" for k in now if k in saved and saved[k] != now[k]]
    if differ:
        raise CheckpointMismatchError(
            f"{where}: arrays of other shapes than this run's ({'; '.join(differ[:4])}"
            f"{f'; {len(differ) - 4} more' if len(differ) > 4 else ''}); did the data (per-item explorer state) or "
            f"the model change? Nothing was moved; resume with the run's config or use another train.out_dir")


def _quiet_closed_loop_reports() -> None:
    """orbax reads arrays through tensorstore futures on an event loop it closes as soon as one read fails.
    Each read still pending then reports 'RuntimeError: Event loop is closed' through sys.unraisablehook as it
    completes, and each other failed read 'Future (or Task) exception was never retrieved' through asyncio's logger:
    about 95 tracebacks for a small model around the one line that matters. Drop exactly those (tensorstore
    reads that failed after the restore had already failed), pass anything else on."""
    previous = sys.unraisablehook
    if getattr(previous, "drops_closed_loop_reports", False):
        return

    def hook(unraisable):
        if isinstance(unraisable.exc_value, RuntimeError) and str(unraisable.exc_value) == "Event loop is closed":
            return
        previous(unraisable)

    hook.drops_closed_loop_reports = True
    sys.unraisablehook = hook
    logging.getLogger("asyncio").addFilter(_unretrieved_read_failure)


def _unretrieved_read_failure(record: logging.LogRecord) -> bool:
    """False (drop) for asyncio's report of a failed tensorstore read nobody awaited any more."""
    exc = record.exc_info[1] if record.exc_info else None
    return not (str(record.msg).startswith(("Future exception was never retrieved",
                                            "Task exception was never retrieved"))
                and exc is not None
                and "tensorstore_spec" in str(exc))
