"""Rows of a local task file (jsonl or parquet) as plain dicts, read without `datasets`.

`datasets` casts the rows of a file to one schema: rubric items whose `args` differ from row to row (one
{"keywords": [...]}, another {"N": 3}) came back merged into one struct (jsonl with datasets 3 and 4, parquet with
every version), every row carrying every key (null where it had none), so checks saw arguments they do not take
and 'judge' items args they must not have. Here jsonl is read line by line with the json module (each row exactly
as written), and parquet with pyarrow.

Parquet stores one type per column, so a struct-typed `args` column holds the union of every row's keys; a
key whose value is null reads as absent (the rows that never had it), in rubric items and in their `args`.
Write `args` as a parquet map (string keys) to keep keys per row in the file itself; either way reads the same.
"""

from __future__ import annotations

import json
from pathlib import Path

from jaxrl_llm.data.types import DataError

KINDS = ("jsonl", "parquet")


def _jsonl_rows(path: str) -> list[dict]:
    rows = []
    try:
        with open(path, encoding="utf-8") as fh:
            for line_no, line in enumerate(fh, start=1):
                if not line.strip():
                    continue
                where = f"{path}: line {line_no}"
                try:
                    row = json.loads(line.rstrip("\r\n"))
                except json.JSONDecodeError as e:
                    raise DataError(f"{where}: not JSON: {e.msg} (column {e.colno})") from None
                except (ValueError, RecursionError) as e:  # a 5,000-digit integer, nesting deeper than Python's stack
                    raise DataError(f"{where}: not a row this reader can take: {type(e).__name__}: {e}"[:300]) \
                        from None
                if not isinstance(row, dict):
                    raise DataError(f"{where}: a row must be a JSON object, got {type(row).__name__}")
                rows.append(row)
    except FileNotFoundError:
        raise DataError(f"{path}: no such file") from None
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except IsADirectoryError:
        raise DataError(f"{path}: is a folder, not a jsonl file") from None
    return rows


def _without_nulls(value):
    return {k: v for k, v in value.items() if v is not None} if isinstance(value, dict) else value


def parquet_rubric(rubric):
    """Rubric items of one parquet row with the union-of-rows nulls removed (see the module docstring)."""
    if not isinstance(rubric, list):
        return rubric
    items = []
    for item in rubric:
        item = _without_nulls(item)
        if isinstance(item, dict) and "args" in item:
            item["args"] = _without_nulls(item["args"])
        items.append(item)
    return items


def _parquet_rows(path: str) -> list[dict]:
    import pyarrow.parquet as pq

    if not Path(path).exists():
        raise DataError(f"{path}: no such file")
    try:
        rows = pq.read_table(path).to_pylist(maps_as_pydicts="strict")
    except Exception as e:  # pyarrow's errors (ArrowInvalid, OSError, KeyError on a duplicate map key) vary
        raise DataError(f"{path}: could not be read as parquet: {type(e).__name__}: {e}") from None
    return [{**row, "rubric": parquet_rubric(row["rubric"])} if row.get("rubric") is not None else row
            for row in rows]


def read_rows(path: str | Path, kind: str) -> list[dict]:
    """Every row of a jsonl (blank lines skipped) or parquet file, in file order; errors name the file, and the
    line of a jsonl row that is not a JSON object. A file without rows is an error."""
    if kind not in KINDS:
        raise ValueError(f"kind {kind!r}: use one of {KINDS}")
    rows = _jsonl_rows(str(path)) if kind == "jsonl" else _parquet_rows(str(path))
    if not rows:
        raise DataError(f"{path}: no rows")
    return rows
