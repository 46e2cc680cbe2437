"""A run's folder (train.out_dir): who may write it, what starting over does to it, and which config the
run was started with.

- One writer at a time. A run holds an exclusive `flock` on `<out_dir>/run.lock` while it builds, resumes
  and trains; the file names the holder (pid, host, start time, command), and a second trainer on the folder
  is refused with those. The kernel drops the lock when its process dies, even by SIGKILL, so a crashed run
  leaves no stale lock. On a multi-host run process 0 locks for the run (it writes every file but the
  checkpoints' array shards) and a refusal stops every process. `jaxrl-llm eval` reads only: it takes no
  lock, moves nothing and writes nothing into the folder. (Linux emulates flock over NFS with byte-range
  locks; on a file system without locks the run says so and goes on unlocked.)
- train.resume=false on a folder that holds a run is refused; with train.overwrite=true the old run's
  files are moved, never deleted, into the sibling `<out_dir>.overwritten-<UTC time>/`, itself a run
  folder that can be resumed or evaluated.
- Config: every checkpoint records the run's config as dotted keys, with the sha256 of each data file the
  config names (`data.path#sha256`: another file at the same path is caught) and of the model folder's
  files (`model.name#files`; files over 64 MiB, the weights, by name and size). A resume compares the
  record with the new config: keys in SAFE_TO_CHANGE may differ and are reported; any other difference is
  refused, naming each key, unless train.accept_changes names it (a key, a section such as `optim`, or
  `*`). Checkpoints written before the record existed resume with a one-line warning. `config.yaml` is
  the config of the latest start, `config_history.jsonl` one row per start (time, host, the checkpoint
  resumed, the keys changed, the whole config).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import fcntl
import functools
import hashlib
import json
import os
import shutil
import socket
import sys
import tempfile
from functools import cached_property
from pathlib import Path

import yaml

from jaxrl_llm.config import Config
from jaxrl_llm.parallel import hosts
from jaxrl_llm.rl.update import lr_schedule
from jaxrl_llm.train.checkpoint import CheckpointMismatchError
from jaxrl_llm.train.metrics import replace_text

LOCK_NAME = "run.lock"
HISTORY_NAME = "config_history.jsonl"
# what Run writes before a run of its own exists (the lock, the scratch tokenizer): not a run to protect
NOT_A_RUN = (LOCK_NAME, "tokenizer")
# keys a resume may change: how long it runs, how often it evaluates and checkpoints, what it logs, where
# it runs; none of them changes a step's numbers. train.seed: the checkpoint's seed is kept (said on resume)
SAFE_TO_CHANGE = ("train.steps", "sft.steps", "eval.every", "train.checkpoint_every", "train.keep_checkpoints",
                  "train.async_checkpoint", "train.tensorboard", "train.export_final", "train.memory_check",
                  "train.device_memory_gib", "train.maintenance_url", "train.out_dir", "train.seed",
                  "train.watchdog_floor_s", "train.watchdog_ceiling_s", "train.watchdog_stale_s", "reward.workers",
                  "reward.start_retries", "eval.revise_rounds", "eval.start_cache",
                  "mesh", "logging")
# how this start treats the folder, not what the run is: never compared
HOW_TO_START = ("train.resume", "train.overwrite", "train.accept_changes")
WHOLE_FILE_BYTES = 64 << 20  # model-folder files above this are fingerprinted by name and size only


class RunFolderBusyError(ValueError):
    pass


class RunFolderUsedError(ValueError):
    pass


class ConfigChangedError(CheckpointMismatchError):
    pass


def matches(key: str, patterns) -> bool:
    """`key` is one of `patterns`, inside a section named there, or a fingerprint of one (`data.path#sha256`)."""
    return any(p == "*" or key == p or key.startswith((p + ".", p + "#")) for p in patterns)


def config_record(cfg: Config) -> dict:
    """The config as flat dotted keys (JSON values), with the content digests of the files it names."""
    flat = json.loads(json.dumps(_flatten(cfg.to_dict())))
    for key in ("data.path", "data.eval_path", "data.sft_path"):
        if flat.get(key):
            flat[f"{key}#sha256"] = _digest(Path(flat[key]))
    local = [cfg.data.dataset] + _file_names(cfg.data.data_files) if cfg.data.source == "hf" else []
    for name in local:  # a Hub name is no local path: its revision is the datasets cache's business
        if name and Path(name).exists():
            flat[f"data.files#{name}#sha256"] = _digest(Path(name), whole_below=WHOLE_FILE_BYTES)
    if cfg.model.name != "scratch":
        from jaxrl_llm.model.registry import resolve

        flat["model.name#files"] = _digest(resolve(cfg.model.name), whole_below=WHOLE_FILE_BYTES)
    return flat


def config_changes(saved: dict, now: dict) -> dict:
    """{key: (saved value, new value)} for every key that differs. A key the saved record lacks (added to the
    config since) counts only when its new value is not the default, which the older run ran with."""
    defaults = _flatten(dataclasses.asdict(Config()))
    out = {}
    for key in sorted(saved.keys() | now.keys()):
        default = json.loads(json.dumps(defaults.get(key)))
        if key in HOW_TO_START or key not in now or (key not in saved and now[key] == default):
            continue
        if saved.get(key) != now[key]:
            out[key] = (saved.get(key), now[key])
    return out


def holding_folder(method):
    """A method of an object with a RunFolder `self.folder`, run with the folder held."""
    @functools.wraps(method)
    def held(self, *args, **kwargs):
        with self.folder.held():
            return method(self, *args, **kwargs)

    return held


class RunFolder:
    """train.out_dir as one run uses it: `held()` locks it (writers only), `prepare()` refuses or moves aside an
    old run when not resuming, `check`/`resumed`/`record_start` keep the config honest."""

    def __init__(self, cfg: Config, log=print, *, read_only: bool = False):
        self.cfg, self.log, self.read_only = cfg, log, read_only
        self.out_dir = Path(cfg.train.out_dir)
        self.accept = tuple(k.strip() for k in cfg.train.accept_changes.split(",") if k.strip())
        self._fd: int | None = None
        self._depth = 0
        self._tokenizer_dir = None
        self._resumed: tuple[str, dict] | None = None

    # -- the lock ---------------------------------------------------------------------------------
    @contextlib.contextmanager
    def held(self):
        """The folder locked for this process's run (re-entrant); a no-op for a read-only run."""
        if not self.read_only and self._depth == 0:
            self._lock()
        self._depth += 1
        try:
            yield self
        finally:
            self._depth -= 1
            if self._depth == 0:
                self._unlock()

    def _lock(self) -> None:
        busy = ""
        if hosts.index() == 0:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            path = self.out_dir / LOCK_NAME
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                busy = _holder(fd)
                os.close(fd)
            except OSError as e:  # a file system without locks: say so rather than refuse every run
                os.close(fd)
                self.log(f"{path}: cannot lock ({e}); a second run on this folder would not be refused")
            else:
                self._fd = fd
                os.ftruncate(fd, 0)
                os.pwrite(fd, json.dumps(_owner()).encode(), 0)
        if hosts.any_process(bool(busy)):
            raise RunFolderBusyError(
                f"{self.out_dir} is in use by another run ({busy or 'process 0 found it locked'}); wait for it to "
                f"end, or give this run another train.out_dir (`jaxrl-llm eval` can read a live run)")

    def _unlock(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the last descriptor releases the flock
            self._fd = None

    # -- starting over ----------------------------------------------------------------------------
    def prepare(self) -> None:
        """Before anything is written: train.resume=false on a folder holding a run is refused, or with
        train.overwrite=true the old run is moved aside (every process calls this; process 0 moves)."""
        t = self.cfg.train
        if self.read_only or t.resume:
            return
        used = self._used() if hosts.index() == 0 else []
        if not hosts.any_process(bool(used)):
            return
        if not t.overwrite:
            raise RunFolderUsedError(
                f"{self.out_dir} holds a run ({', '.join(used[:6]) or 'on process 0'}) and train.resume=false would "
                f"start another on top of it; resume it (train.resume=true), use another train.out_dir, or set "
                f"train.overwrite=true to move the old run aside into {self.out_dir.name}.overwritten-<time>/ "
                f"(nothing is deleted)")
        if hosts.index() == 0:
            aside = self._move_aside()
            self.log(f"train.overwrite=true: moved the run that was in {self.out_dir} to {aside}")
        hosts.barrier("run-folder-overwrite")

    def _used(self) -> list[str]:
        if not self.out_dir.is_dir():
            return []
        return sorted(p.name for p in self.out_dir.iterdir() if p.name not in NOT_A_RUN and _holds_data(p))

    def _move_aside(self) -> Path:
        stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d-%H%M%S")
        aside = self.out_dir.with_name(f"{self.out_dir.name}.overwritten-{stamp}")
        n = 1
        while aside.exists():
            n += 1
            aside = self.out_dir.with_name(f"{self.out_dir.name}.overwritten-{stamp}-{n}")
        aside.mkdir(parents=True)
        for entry in sorted(self.out_dir.iterdir()):
            if entry.name != LOCK_NAME:
                shutil.move(str(entry), str(aside / entry.name))
        return aside

    def policy_dir(self) -> Path:
        """Where the policy may write its tokenizer files: the run folder, or for a read-only run a temporary
        folder (eval never writes into the run)."""
        if not self.read_only:
            return self.out_dir
        if self._tokenizer_dir is None:
            self._tokenizer_dir = tempfile.TemporaryDirectory(prefix="jaxrl-llm-eval-")
        return Path(self._tokenizer_dir.name)

    # -- the config -------------------------------------------------------------------------------
    @cached_property
    def record(self) -> dict:
        return config_record(self.cfg)

    def check(self, registry: dict, where: str) -> None:
        """Refuse to resume checkpoint `where` (its `registry`) when keys outside SAFE_TO_CHANGE and
        train.accept_changes differ from the config it was written with (a read-only run only reports them)."""
        saved = registry.get("config")
        if saved is None or self.read_only:
            return
        refused = {k: v for k, v in config_changes(saved, self.record).items()
                   if not matches(k, SAFE_TO_CHANGE) and not matches(k, self.accept)}
        if refused:
            keys = ",".join(dict.fromkeys(k.split("#")[0] for k in refused))
            raise ConfigChangedError(
                f"{where} was written with another config: {_describe(refused)}. Resume with the run's values, "
                f"or accept the change with train.accept_changes={keys}, or start over with train.resume=false "
                f"train.overwrite=true")

    def resumed(self, registry: dict, where: str, step: int) -> None:
        """Report what a resume from `where` changed (one line each), and remember it for the history."""
        saved = registry.get("config")
        if saved is None:
            self.log(f"{where} has no config record (written before runs kept one): the config is not checked "
                     f"against it")
            self._resumed = (where, {})
            return
        changes = config_changes(saved, self.record)
        self._resumed = (where, changes)
        if changes:
            what = "evaluating with" if self.read_only else "resuming with"
            self.log(f"{what} a config that differs from {where}'s: {_describe(changes)}")
        old, new = saved.get("train.steps"), self.cfg.train.steps
        if "train.steps" in changes and self.cfg.optim.schedule == "cosine" and not self.read_only:
            before, after = (_lr(self.cfg, total, step) for total in (old, new))
            self.log(f"train.steps {old} -> {new} moves the cosine learning-rate schedule: it now decays to 0 at step "
                     f"{new}, so step {step + 1} learns at {after:.3g} instead of {before:.3g}")

    def record_start(self) -> None:
        """config.yaml (this start's config, replaced atomically) and a row of config_history.jsonl (process 0)."""
        if self.read_only or hosts.index() != 0:
            return
        config, history = self.out_dir / "config.yaml", self.out_dir / HISTORY_NAME
        if config.exists() and not history.exists():  # a run from before the history: keep its config first
            _append(history, {"time": None, "note": "config.yaml of the run before config_history.jsonl existed",
                              "config": yaml.safe_load(config.read_text())})
        where, changes = self._resumed or (None, {})
        _append(history, {"time": _now(), **{k: v for k, v in _owner().items() if k != "started"},
                          "resumed_from": where, "changes": {k: list(v) for k, v in changes.items()},
                          "config": self.cfg.to_dict()})
        replace_text(config, yaml.safe_dump(self.cfg.to_dict(), sort_keys=False))


def _flatten(tree: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in tree.items():
        # dict-valued fields (model.scratch, data.task_args) are one value each, not sections
        if isinstance(v, dict) and not _is_leaf_dict(prefix + k):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[prefix + k] = v
    return out


def _file_names(data_files) -> list[str]:
    """The file names in a `data.data_files` value (a name, a list, or a dict of either)."""
    if isinstance(data_files, str):
        return [data_files]
    values = data_files.values() if isinstance(data_files, dict) else data_files or []
    return [n for v in values for n in _file_names(v)]


def _is_leaf_dict(key: str) -> bool:
    return key in ("model.scratch", "data.task_args", "data.columns", "data.data_files")


def _digest(path: Path, whole_below: int | None = None) -> str:
    """sha256 of a file's bytes, or of a folder's files (relative names, and bytes or sizes above `whole_below`)."""
    h = hashlib.sha256()
    if not path.exists():
        return "missing"
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    for f in files:
        size = f.stat().st_size
        h.update(f"{f.relative_to(path) if f != path else ''}\0{size}\0".encode())
        if whole_below is None or size <= whole_below:
            with f.open("rb") as src:
                for block in iter(lambda: src.read(1 << 20), b""):
                    h.update(block)
    return h.hexdigest()


def _describe(changes: dict) -> str:
    def short(v):
        text = json.dumps(v) if not isinstance(v, str) else v
        return text if len(text) <= 40 else text[:16] + "..." + text[-16:]

    return ", ".join(f"{k} {short(a)} -> {short(b)}" for k, (a, b) in changes.items())


def _lr(cfg: Config, total_steps: int, step: int) -> float:
    per = cfg.algo.ppo_epochs * cfg.algo.minibatches  # updates per RL step, as loop.py counts them
    o = cfg.optim
    return float(lr_schedule(o.lr, warmup_steps=o.warmup_steps, schedule=o.schedule,
                             total_steps=total_steps * per)(step * per))


def _holds_data(path: Path) -> bool:
    if path.is_file():
        return path.stat().st_size > 0
    return path.is_dir() and any(p.is_file() for p in path.rglob("*"))


def _owner() -> dict:
    return {"pid": os.getpid(), "host": socket.gethostname(), "started": _now(), "command": " ".join(sys.argv)}


def _holder(fd: int) -> str:
    try:
        owner = json.loads(os.pread(fd, 1 << 16, 0).decode() or "{}")
        return (f"pid {owner['pid']} on {owner['host']}, locked since {owner['started']}, "
                f"command: {owner['command'][:200]}")
    except (ValueError, KeyError, OSError):
        return "its holder did not say who it is"


def _append(path: Path, row: dict) -> None:
    with path.open("a") as f:
        f.write(json.dumps(row, default=str) + "\n")


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
