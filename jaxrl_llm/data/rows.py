"""What a raw row of a task file or data set goes through before it is a task item (data/tasks.py):

1. `data.preprocess` ("module:function" or "file.py:function"): called with each raw row dict (the data set's
   own columns); returns the row dict, or None to drop the row (counted). The module must be importable
   (installed or on PYTHONPATH); a file path works from any working directory.
2. `data.columns` ({our field: the row's column}) maps the row's columns onto FIELDS; a field without a mapping
   reads the column of its own name. Every column no field reads is kept in TaskItem.extra (a JSON object) for
   reward functions.
3. `data.answer_preset` reads the gold answer out of the answer text: "gsm8k" the text after the last "####"
   with thousands commas removed ("#### 1,200" -> "1200"), "boxed" the content of the last \\boxed{...}
   (nested braces kept). A row where the preset finds nothing is skipped (see data/tasks.py).
4. `messages` (a list of {role, content}: system and few-shot turns ending in a user turn) is a multi-turn
   prompt instead of `question`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

from jaxrl_llm.data.types import DataError
from jaxrl_llm.rewards.functions import import_module_or_file
from jaxrl_llm.rewards.verifiers import extract_answer

FIELDS = ("question", "answer", "scorer", "reference", "difficulty", "rubric", "messages")


def check_columns(columns: dict) -> None:
    """Refuses a `data.columns` entry that names no field or no column."""
    for field, column in columns.items():
        if field not in FIELDS:
            raise DataError(f"data.columns.{field}: {field!r} is no task field; map any of {', '.join(FIELDS)} "
                            f"(the row's other columns reach TaskItem.extra unmapped)")
        if not isinstance(column, str) or not column:
            raise DataError(f"data.columns.{field} must name a column, got {column!r}")


def load_hook(spec: str) -> Callable[[dict], dict | None] | None:
    """The `data.preprocess` function, or None when none is set; one that cannot be imported is refused here,
    before any row is read, naming it."""
    if not spec:
        return None
    target, sep, name = spec.rpartition(":")
    if not (sep and target and name):
        raise DataError(f"data.preprocess={spec!r}: write it as module:function or file.py:function")
    if target.endswith(".py") and not Path(target).is_file():
        raise DataError(f"data.preprocess={spec!r}: {target}: no such file")
    try:
        module = import_module_or_file(target, is_file=target.endswith(".py"))
    except Exception as e:  # ModuleNotFoundError, or whatever the module raises while it is imported
        raise DataError(f"data.preprocess={spec!r}: cannot import {target!r}: {type(e).__name__}: {e}") from None
    fn = getattr(module, name, None)
    if not callable(fn):
        raise DataError(f"data.preprocess={spec!r}: {target!r} has no function {name!r}")
    return fn


def run_hook(hook, spec: str, row: dict, where: str) -> dict | None:
    try:
        out = hook(dict(row))  # a copy: the hook may change it in place
    except Exception as e:
        raise DataError(f"{where}: data.preprocess={spec!r} raised {type(e).__name__}: {e}") from e
    if out is not None and not isinstance(out, dict):
        raise DataError(f"{where}: data.preprocess={spec!r} returned {type(out).__name__}; return the row dict, "
                        f"or None to drop the row")
    return out


def map_columns(row: dict, columns: dict, where: str) -> tuple[dict, dict]:
    """(the row's FIELDS, its other columns). A mapped column the row lacks is an error naming both."""
    for field, column in columns.items():
        if column not in row:
            raise DataError(f"{where}: no column {column!r} (data.columns.{field}); its columns: "
                            f"{', '.join(map(str, row))}")
    sources = {field: columns.get(field, field) for field in FIELDS}
    fields = {field: row[column] for field, column in sources.items() if column in row}
    used = set(sources.values())
    return fields, {k: v for k, v in row.items() if k not in used}


def extra_json(extra: dict) -> str:
    """The columns no field reads as a JSON object ("" when there are none); values JSON cannot hold (dates,
    bytes) as their str()."""
    return json.dumps(extra, ensure_ascii=False, default=str) if extra else ""


def gold_answer(text: str, preset: str) -> str | None:
    """The gold answer `preset` reads out of `text`; None when it finds none."""
    if preset == "none":
        return text
    if preset == "gsm8k":
        if "####" not in text:
            return None
        found = text.rsplit("####", 1)[1].strip().replace(",", "")
    elif preset == "boxed":
        found = (extract_answer(text, "boxed") or "").strip()
    else:
        raise ValueError(f"answer preset {preset!r}: use none, gsm8k or boxed")
    return found or None


def chat_turns(value, where: str) -> list[dict[str, str]]:
    """A row's `messages` (a list, or its JSON text) as [{role, content}], ending in a user turn."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise DataError(f"{where}: 'messages' is text but not JSON: {e.msg}") from None
    if not isinstance(value, list) or not value:
        raise DataError(f"{where}: 'messages' must be a non-empty list of {{role, content}} turns, got "
                        f"{type(value).__name__}")
    turns = []
    for j, turn in enumerate(value):
        if not (isinstance(turn, dict) and isinstance(turn.get("role"), str) and isinstance(turn.get("content"), str)):
            raise DataError(f"{where}: messages[{j}] must be {{role, content}} with text values, got {turn!r:.120}")
        turns.append({"role": turn["role"], "content": turn["content"]})
    if turns[-1]["role"] != "user":
        raise DataError(f"{where}: its messages end with a {turns[-1]['role']!r} turn; a prompt ends with a user turn")
    return turns
