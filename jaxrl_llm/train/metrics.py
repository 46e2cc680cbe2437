"""Step metrics: pass@k, group statistics, and the writer (metrics.jsonl + TensorBoard, process 0 only; what a
run reports beyond these, W&B and completion samples, is train/tracking.py).

On a resume, metrics.jsonl keeps the rows written up to the checkpoint and drops the rest: the kept rows
go to a temporary file that is renamed over it, so a crash (or a full disk) mid-way leaves the old file
whole. TensorBoard event files cannot be cut, so each stage writes its own folder (`tensorboard/sft`:
SFT and the pre-SFT evaluation, by SFT step; `tensorboard/rl`: RL steps and evaluations, by RL step)
and a resumed writer starts with TensorBoard's purge marker (SessionLog.START at the first step it will
write again): TensorBoard then hides the dropped steps' old events instead of showing those steps twice.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import time
from pathlib import Path

import jax
import numpy as np


PASS_KS = (1, 2, 4, 8, 16)  # the k of pass@k that steps and evaluations report (where groups have k rows)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k: 1 - C(n - c, k) / C(n, k)."""
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def group_stats(correct_N: np.ndarray, group_N: np.ndarray, ks=PASS_KS) -> dict:
    """pass@k over the groups of at least k rows (groups vary in size under E3), and the share of
    all-wrong / all-right groups."""
    groups = [correct_N[group_N == g] for g in np.unique(group_N)]
    out = {"groups_all_wrong": float(np.mean([not g.any() for g in groups])),
           "groups_all_right": float(np.mean([g.all() for g in groups]))}
    for k in ks:
        big = [g for g in groups if len(g) >= k]
        if big:
            out[f"pass@{k}"] = float(np.mean([pass_at_k(len(g), int(g.sum()), k) for g in big]))
    return out


def read_rows(path: Path) -> list[dict]:
    """The rows of a metrics.jsonl, in order; a line that is not JSON is an error naming it."""
    rows = []
    for i, line in enumerate(Path(path).read_text().splitlines()):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}: line {i + 1} is not JSON ({e})") from None
    return rows


class MetricsWriter:
    """Appends one JSON row per call to metrics.jsonl (and TensorBoard). `rows` counts every row written
    to the file, so a checkpoint can record it and a resume from that checkpoint keeps exactly the
    rows written before it, of every kind (SFT, evaluation, train), and drops the ones after."""

    def __init__(self, out_dir: Path, *, tensorboard: bool = True, keep_rows: int = 0):
        self.enabled = jax.process_index() == 0
        self.path = Path(out_dir) / "metrics.jsonl"
        self.tb_dir = Path(out_dir) / "tensorboard" if tensorboard else None
        self.tb: dict = {}  # stage -> SummaryWriter, opened on its first row
        self.rows = keep_rows
        if not self.enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        kept = None
        if self.path.exists():
            kept = [ln for ln in self.path.read_text().splitlines() if ln.strip()][:keep_rows]
            replace_text(self.path, "".join(ln + "\n" for ln in kept))
        # per stage, the first step a resumed run writes again (0 when it kept none): events from there on are stale
        self.purge = None if kept is None else {stage: 1 + max(
            [json.loads(ln)["step"] for ln in kept if stage_of(json.loads(ln)["kind"]) == stage], default=-1)
            for stage in ("sft", "rl")}

    def write(self, step: int, metrics: dict, kind: str = "train") -> dict | None:
        """Row number `self.rows` (counting from 1); returns the row as written (None on processes other than 0)."""
        self.rows += 1
        if not self.enabled:
            return None
        row = {"step": step, "kind": kind, "wall_time": time.time(), **{k: _plain(v) for k, v in metrics.items()}}
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        if self.tb_dir is not None:
            tb = self._tb(stage_of(kind))
            for k, v in scalars(row).items():
                tb.add_scalar(f"{kind}/{k}", v, step)
            tb.flush()
        return row

    def _tb(self, stage: str):
        if stage not in self.tb:
            from tensorboardX import SummaryWriter

            # the file name is tensorboardX's (whole seconds, host) plus ours: a restart within the same second
            # would otherwise write over the earlier session's file
            self.tb[stage] = SummaryWriter(str(self.tb_dir / stage), filename_suffix=f".{time.time_ns()}",
                                           purge_step=None if self.purge is None else self.purge[stage])
        return self.tb[stage]

    def close(self) -> None:
        for tb in self.tb.values():
            tb.close()


def stage_of(kind: str) -> str:
    """The stage a metrics row belongs to, whose step it counts: "sft" (SFT steps) or "rl" (RL steps)."""
    return "sft" if kind in ("sft", "eval_before_sft") else "rl"


def scalars(row: dict) -> dict:
    """The numbers of a metrics row that trackers plot (lists, strings and the step itself are not)."""
    return {k: v for k, v in row.items() if isinstance(v, (int, float)) and k != "step"}


def replace_text(path: Path, text: str) -> None:
    """Write `path` whole or not at all: a temporary file beside it, flushed to disk, renamed over it."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _plain(v):
    if isinstance(v, (np.generic, np.ndarray)) or hasattr(v, "item"):
        return np.asarray(v).item() if np.asarray(v).size == 1 else np.asarray(v).tolist()
    return v
