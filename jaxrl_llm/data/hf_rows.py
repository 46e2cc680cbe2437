"""Rows of a data set read through the `datasets` library (`data.source: hf`), as its users write it:
`datasets.load_dataset(data.dataset, data.subset, data_files=data.data_files, split=data.split)`.

`data.dataset` is a Hub name ("openai/gsm8k"), a local folder, or a builder name ("parquet", "json", "csv")
with `data.data_files` (a path or glob, a list, or a {split: files} dict, relative paths from the working
directory); `data.split` / `data.eval_split` / `data.sft_split` take `datasets`' slices ("train[:1000]").
Hub data sets load when the Hub can be reached or are in the local Hub cache (the CLI turns offline mode on
when the Hub cannot be reached: jaxrl_llm/hub.py); this module never changes the HF_* environment.
"""

from __future__ import annotations

import os

from jaxrl_llm.config import DataSection
from jaxrl_llm.data.task_files import parquet_rubric
from jaxrl_llm.data.types import DataError

SPLIT_KEYS = {"train": "split", "eval": "eval_split", "sft": "sft_split"}


def describe(cfg: DataSection, split: str) -> str:
    """How errors and item ids name the data set and split: "openai/gsm8k (main) [test]", or by its files
    ("data/gsm8k/main/test-00000-of-00001.parquet [test]"); a row number counts the split's rows."""
    files = cfg.data_files
    if isinstance(files, dict):  # {split: files}; a slice or sum ("train[:100]", "train+test") names its first
        files = files.get(split.split("[")[0].split("+")[0].strip(), "")
    if isinstance(files, list):
        files = files[0] if len(files) == 1 else f"{files[0]} (+{len(files) - 1} files)" if files else ""
    name = files or cfg.dataset
    return f"{name}{f' ({cfg.subset})' if cfg.subset else ''} [{split}]"


def _offline_hint(cfg: DataSection) -> str:
    local = os.path.exists(cfg.dataset) or cfg.data_files
    if local or not any(os.environ.get(k, "").lower() in ("1", "true", "yes", "on")
                        for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")):
        return ""
    return ("; offline mode is on (HF_HUB_OFFLINE or the CLI found the Hub unreachable): a Hub data set loads "
            "only from the local Hub cache")


def hf_rows(cfg: DataSection, which: str) -> tuple[str, list[dict]] | None:
    """(name of the data set and split, its rows as dicts) for 'train', 'eval' or 'sft'; None when the config
    names no split for it. Errors name the data set, the split and the load_dataset call."""
    split = getattr(cfg, SPLIT_KEYS[which])
    if not split:
        return None
    try:
        import datasets
    except ImportError:
        raise DataError("data.source=hf needs the `datasets` package: pip install 'datasets>=3'") from None
    name = describe(cfg, split)
    try:
        ds = datasets.load_dataset(cfg.dataset, cfg.subset or None, data_files=cfg.data_files or None, split=split)
    except Exception as e:  # DatasetNotFoundError, DataFilesNotFoundError, ValueError on an unknown split, ...
        call = ", ".join([repr(cfg.dataset), *([repr(cfg.subset)] if cfg.subset else []),
                          *([f"data_files={cfg.data_files!r}"] if cfg.data_files else []), f"split={split!r}"])
        raise DataError(f"{name} (data.{SPLIT_KEYS[which]}): datasets.load_dataset({call}) failed: "
                        f"{type(e).__name__}: {e}{_offline_hint(cfg)}") from None
    if len(ds) == 0:
        raise DataError(f"{name}: no rows")
    # a struct column holds the union of every row's keys: rubric items get their own keys back (task_files.py)
    return name, [{**row, "rubric": parquet_rubric(row["rubric"])} if row.get("rubric") is not None else row
                  for row in ds.to_list()]
