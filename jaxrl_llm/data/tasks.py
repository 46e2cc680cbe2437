"""Task items and their sources: reasoning-gym data sets (generated offline, seeded) and local
jsonl / parquet files loaded through `datasets`.

File schema (one row per task): `question` (str, required), `answer` (str, required),
`scorer` ("math" | "exact", default "math"), `reference` (str, optional: a worked solution for SFT).
"""

from __future__ import annotations

import dataclasses
import json

from jaxrl_llm.config import DataSection

EVAL_SEED_OFFSET = 1_000_003  # held-out items come from another generator stream


class DataError(ValueError):
    pass


@dataclasses.dataclass(frozen=True)
class TaskItem:
    uid: str
    question: str
    answer: str
    scorer: str  # "reasoning_gym:<name>" | "math" | "exact"
    entry_json: str = ""  # the reasoning-gym entry its scorer needs, as JSON
    reference: str = ""


def _reasoning_gym(cfg: DataSection, split: str) -> list[TaskItem]:
    import reasoning_gym

    size = cfg.train_size if split == "train" else cfg.eval_size
    seed = cfg.seed if split == "train" else cfg.seed + EVAL_SEED_OFFSET
    try:
        ds = reasoning_gym.create_dataset(cfg.task, size=size, seed=seed, **cfg.task_args)
    except Exception as e:  # unknown name or bad task_args
        raise DataError(f"reasoning-gym task {cfg.task!r} with {cfg.task_args}: {e}") from e
    return [TaskItem(uid=f"{cfg.task}:{split}:{i}", question=e["question"], answer=str(e["answer"]),
                     scorer=f"reasoning_gym:{e['metadata'].get('source_dataset', cfg.task)}",
                     entry_json=json.dumps(e, default=str)) for i, e in enumerate(ds)]


def _file(path: str, kind: str) -> list[TaskItem]:
    import datasets

    try:
        rows = datasets.load_dataset("json" if kind == "jsonl" else "parquet", data_files=path, split="train")
    except FileNotFoundError:
        raise DataError(f"{path}: no such file") from None
    except Exception as e:
        raise DataError(f"{path}: could not be read as {kind}: {e}") from e
    items = []
    for i, row in enumerate(rows):
        for key in ("question", "answer"):
            if row.get(key) in (None, ""):
                raise DataError(f"{path}: row {i} has no {key!r}")
        scorer = row.get("scorer") or "math"
        if scorer not in ("math", "exact"):
            raise DataError(f"{path}: row {i} has scorer {scorer!r}; use 'math' or 'exact'")
        items.append(TaskItem(uid=f"{path}:{i}", question=str(row["question"]), answer=str(row["answer"]),
                              scorer=scorer, reference=str(row.get("reference") or "")))
    return items


def load_items(cfg: DataSection, split: str) -> list[TaskItem]:
    """The items of one split ('train' or 'eval') as the source gives them."""
    if cfg.source == "reasoning_gym":
        return _reasoning_gym(cfg, split)
    path = cfg.path if split == "train" else cfg.eval_path
    return _file(path, cfg.source) if path else []


def load_splits(cfg: DataSection) -> tuple[list[TaskItem], list[TaskItem]]:
    """(train, held-out) items; held-out items never repeat a training question."""
    train = load_items(cfg, "train")
    seen = {it.question for it in train}
    return train, [it for it in load_items(cfg, "eval") if it.question not in seen]
