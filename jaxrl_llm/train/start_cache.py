"""A step-0 evaluation shared by runs that start from the same policy (`eval.start_cache: DIR`).

The arms of an ablation differ in what they do from RL step 1 on (an explorer, a loss weight, a learning rate):
at a seed they all start from the same weights and evaluate them with the same keys, so every arm's step-0
evaluation is the same numbers (checked over the archived grids: equal in every pair of arms whose differences
act after step 0). With a cache folder, a run keeps its step-0 evaluation there under a key of
- its config as flat keys (run_dir.config_record: the files it names by content), less the keys that act only
  after step 0 (AFTER_START), and
- a digest of its starting weights (after any SFT: every byte of every parameter, `params_digest`),
and a later run with the same key takes the row and the per-problem outcomes from there instead of sampling them
again. (An explorer may widen the sampler's context bucket, RRL's prefixes; over the archived RRL grids that left
every step-0 figure equal too.) What it writes is the stored row (its `time_eval_s` the evaluation's own, so that
arms' wall times stay comparable) with `start_reused: 1`; the log names the entry. Anything else evaluates: another
key, an entry that cannot be read (said in the log, never fatal), more than one process (the decision would have to
be agreed across hosts).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import jax
import numpy as np

# config keys that act only after the step-0 evaluation: a run that differs from another only in these starts
# from the same weights (the digest checks that) and evaluates them the same way
AFTER_START = ("explore", "algo", "optim", "eval.every", "eval.start_cache", "train.steps",
               "train.checkpoint_every", "train.keep_checkpoints", "train.async_checkpoint", "train.tensorboard",
               "train.export_final", "train.memory_check", "train.device_memory_gib", "train.maintenance_url",
               "train.out_dir", "train.resume", "train.overwrite", "train.accept_changes", "train.watchdog_floor_s",
               "train.watchdog_ceiling_s", "train.watchdog_stale_s", "reward.workers", "reward.start_retries",
               "logging")
VERSION = 1


def params_digest(params) -> str:
    """sha256 over every parameter's path, dtype, shape and bytes (host copies, one leaf at a time)."""
    h = hashlib.sha256()
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        a = np.asarray(jax.device_get(leaf))
        h.update(f"{jax.tree_util.keystr(path)}|{a.dtype}|{a.shape}|".encode())
        h.update(np.ascontiguousarray(a).reshape(-1).view(np.uint8))  # the bytes, without a copy
    return h.hexdigest()


# ...except where the evaluation reads them: test-time revise rounds fill HeRL's revise template
READ_BY_EVAL = {"explore.herl.revise_template": "eval.revise_rounds"}


def compared(record: dict) -> dict:
    """The flat config record less the keys that act only after step 0."""
    from jaxrl_llm.train.run_dir import matches

    def acts_before(k):
        return not matches(k, AFTER_START) or bool(record.get(READ_BY_EVAL.get(k, ""), 0))

    return {k: v for k, v in sorted(record.items()) if acts_before(k)}


def entry_path(cache_dir, record: dict, digest: str) -> Path:
    text = json.dumps({"version": VERSION, "config": compared(record), "params": digest}, sort_keys=True)
    return Path(cache_dir) / f"{hashlib.sha256(text.encode()).hexdigest()[:32]}.json"


def load(cache_dir, record: dict, digest: str, log=print) -> dict | None:
    """The stored entry for this config and these weights ({"row", "outcomes", "source"}), or None."""
    path = entry_path(cache_dir, record, digest)
    if not path.is_file():
        return None
    try:
        entry = json.loads(path.read_text())
        if entry.get("config") != compared(record) or entry.get("params") != digest:
            raise ValueError("its config or weights digest is not this run's")
        if not isinstance(entry.get("row"), dict) or not isinstance(entry.get("outcomes"), str):
            raise ValueError("no row or outcomes")
        return entry
    except (OSError, ValueError) as e:
        log(f"step 0: the shared start evaluation {path} cannot be used ({type(e).__name__}: {e}); evaluating")
        return None


def store(cache_dir, record: dict, digest: str, row: dict, outcomes_text: str, source) -> Path:
    """Keep this run's step-0 evaluation for the runs that start like it (written whole: tmp file, rename)."""
    from jaxrl_llm.train.metrics import replace_text

    path = entry_path(cache_dir, record, digest)
    path.parent.mkdir(parents=True, exist_ok=True)
    entry = {"version": VERSION, "config": compared(record), "params": digest, "source": str(source),
             "row": {k: v for k, v in row.items() if k not in ("step", "kind", "wall_time")},
             "outcomes": outcomes_text}
    replace_text(path, json.dumps(entry) + "\n")
    return path
