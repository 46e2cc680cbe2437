"""Step metrics: pass@k, group statistics, and the writer (metrics.jsonl + TensorBoard, process 0 only)."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import jax
import numpy as np


def solved(rewards: np.ndarray) -> np.ndarray:
    """Rows whose reward is full marks: what accuracy, pass@k and strict rewards count."""
    return rewards >= 1.0 - 1e-6


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k: 1 - C(n - c, k) / C(n, k)."""
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def group_stats(correct_N: np.ndarray, group_N: np.ndarray, ks=(1, 2, 4, 8, 16)) -> dict:
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
        self.tb = None
        self.rows = keep_rows
        if not self.enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.exists():
            kept = [ln for ln in self.path.read_text().splitlines() if ln.strip()][:keep_rows]
            self.path.write_text("".join(ln + "\n" for ln in kept))
        if tensorboard:
            from tensorboardX import SummaryWriter

            self.tb = SummaryWriter(str(Path(out_dir) / "tensorboard"))

    def write(self, step: int, metrics: dict, kind: str = "train") -> None:
        self.rows += 1
        if not self.enabled:
            return
        row = {"step": step, "kind": kind, "wall_time": time.time(), **{k: _plain(v) for k, v in metrics.items()}}
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        if self.tb is not None:
            for k, v in row.items():
                if isinstance(v, (int, float)) and k != "step":
                    self.tb.add_scalar(f"{kind}/{k}", v, step)
            self.tb.flush()

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()


def _plain(v):
    if isinstance(v, (np.generic, np.ndarray)) or hasattr(v, "item"):
        return np.asarray(v).item() if np.asarray(v).size == 1 else np.asarray(v).tolist()
    return v
