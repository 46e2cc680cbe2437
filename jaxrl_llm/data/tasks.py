"""Task items and their sources: reasoning-gym data sets (generated offline, seeded), local jsonl / parquet
files (data/task_files.py reads them, each row as written: rows may differ in keys) and any data set the
`datasets` library loads (`data.source: hf`, data/hf_rows.py).

Row schema (one row per task): `question` (str, required), `answer` (str, required),
`scorer` ("math" | "exact", default "math"), `reference` (str, optional: a worked solution for SFT),
`difficulty` (number in [0, 1], optional, 1 hardest: seeds E3's difficulty ranks). A row with a
`rubric` (a list of {description, weight, check, args?} items, rewards/rubrics.py) is a rubric task:
graded by its items (reward sum w m / sum w), `answer` optional. `data.source: rubric` generates
instruction-following rubric tasks offline (data/rubric_tasks.py). A row may carry `messages` (system and
few-shot turns ending in a user turn) instead of `question`: the prompt is those turns in the chat template,
TaskItem.question the last user turn.

Rows of files and data sets first go through data.preprocess, data.columns and data.answer_preset
(data/rows.py); columns no field reads reach reward functions as TaskItem.extra. Rows the preprocess hook
drops (returns None) or the answer preset finds no answer in are skipped and counted, with a warning naming
the first of them (logger "jaxrl_llm.data"): one bad row in thousands does not stop a run. When the preset
finds no answer in more than half of a split's rows, the preset or the answer column is wrong: an error.
"""

from __future__ import annotations

import dataclasses
import json
import logging

from jaxrl_llm.config import DataSection
from jaxrl_llm.data import rubric_tasks
from jaxrl_llm.data.hf_rows import hf_rows
from jaxrl_llm.data.rows import chat_turns, check_columns, extra_json, gold_answer, load_hook, map_columns, run_hook
from jaxrl_llm.data.task_files import read_rows
from jaxrl_llm.data.types import DataError, TaskItem
from jaxrl_llm.data.worked import worked_solution
from jaxrl_llm.rewards.rubrics import RubricError, dump_rubric, parse_rubric

log = logging.getLogger("jaxrl_llm.data")
SHOWN_ROWS = 5  # rows a skip warning or error names

EVAL_SEED_OFFSET = 1_000_003  # held-out items come from another generator stream
SFT_SEED_OFFSET = 2_000_003  # and separate SFT items (data.sft_size) from a third


def _reasoning_gym(cfg: DataSection, split: str) -> list[TaskItem]:
    import reasoning_gym

    size = {"train": cfg.train_size, "eval": cfg.eval_size, "sft": cfg.sft_size}[split]
    seed = cfg.seed + {"train": 0, "eval": EVAL_SEED_OFFSET, "sft": SFT_SEED_OFFSET}[split]
    try:
        ds = reasoning_gym.create_dataset(cfg.task, size=size, seed=seed, **cfg.task_args)
    except Exception as e:  # unknown name or bad task_args
        raise DataError(f"reasoning-gym task {cfg.task!r} with {cfg.task_args}: {e}") from e
    from jaxrl_llm.rewards.verifiers import check_gym_tasks  # a task whose scorer runs answers as code is refused

    check_gym_tasks({cfg.task, *(e["metadata"].get("source_dataset", cfg.task) for e in ds)})
    try:
        refs = [worked_solution(cfg.task, e, cfg.worked) for e in ds]
    except (KeyError, ValueError) as e:
        raise DataError(f"data.worked={cfg.worked!r} on reasoning-gym task {cfg.task!r} with {cfg.task_args}: {e}") \
            from e
    return [TaskItem(uid=f"{cfg.task}:{split}:{i}", question=e["question"], answer=str(e["answer"]),
                     scorer=f"reasoning_gym:{e['metadata'].get('source_dataset', cfg.task)}",
                     entry_json=json.dumps(e, default=str), reference=ref) for i, (e, ref) in enumerate(zip(ds, refs))]


def _rubric_item(uid: str, question: str, rubric_items, where: str, answer: str = "", reference: str = "",
                 difficulty: float = float("nan")) -> TaskItem:
    try:
        rubric = parse_rubric(rubric_items, where)
    except RubricError as e:
        raise DataError(str(e)) from None
    text = dump_rubric(rubric)
    return TaskItem(uid=uid, question=question, answer=answer, scorer="rubric", entry_json=text,
                    reference=reference, difficulty=difficulty, rubric=text)


def _rubric_tasks(cfg: DataSection, split: str) -> list[TaskItem]:
    if split == "sft":
        return []
    size = {"train": cfg.train_size, "eval": cfg.eval_size}[split]
    return [_rubric_item(f"rubric:{split}:{i}", row["question"], row["rubric"], f"rubric task {split} {i}")
            for i, row in enumerate(rubric_tasks.rubric_items(split, size, cfg.seed))]


def _difficulty(row: dict, where: str) -> float:
    value = row.get("difficulty")
    if value is None:
        return float("nan")
    try:
        difficulty = float(value)
    except (TypeError, ValueError, OverflowError):
        difficulty = float("nan")
    if not 0.0 <= difficulty <= 1.0:
        raise DataError(f"{where} has difficulty {value!r:.80}; give a number in [0, 1] (1 hardest) or leave it out")
    return difficulty


def _row_item(fields: dict, extra: dict, cfg: DataSection, uid: str, where: str) -> TaskItem | None:
    """The item of one mapped row; None when the answer preset finds no answer in it."""
    messages = ""
    if fields.get("messages") not in (None, "", []):
        if fields.get("question") not in (None, ""):
            raise DataError(f"{where} has both 'question' and 'messages'; give one (drop the other with "
                            f"data.preprocess)")
        turns = chat_turns(fields["messages"], where)
        messages = json.dumps(turns, ensure_ascii=False)
        fields["question"] = next(t["content"] for t in reversed(turns) if t["role"] == "user")
    if fields.get("question") in (None, ""):
        raise DataError(f"{where} has no 'question'" + (f" (data.columns.question={cfg.columns['question']!r})"
                                                        if "question" in cfg.columns else ""))
    reference = str(fields.get("reference") or "")
    if fields.get("rubric") is not None:  # a rubric task: graded by its items, an answer is optional
        item = _rubric_item(uid, str(fields["question"]), fields["rubric"], where,
                            answer=str(fields.get("answer") or ""), reference=reference)
        return dataclasses.replace(item, extra=extra_json(extra), messages=messages)
    if fields.get("answer") in (None, ""):
        raise DataError(f"{where} has no 'answer'" + (f" (data.columns.answer={cfg.columns['answer']!r})"
                                                      if "answer" in cfg.columns else ""))
    answer = gold_answer(str(fields["answer"]), cfg.answer_preset)
    if answer is None:
        return None
    if cfg.answer_preset != "none":
        reference = reference or str(fields["answer"])  # the worked solution the answer came from
    scorer = fields.get("scorer") or "math"
    if scorer not in ("math", "exact"):
        raise DataError(f"{where} has scorer {scorer!r}; use 'math' or 'exact'")
    return TaskItem(uid=uid, question=str(fields["question"]), answer=answer, scorer=scorer, reference=reference,
                    difficulty=_difficulty(fields, where), extra=extra_json(extra), messages=messages)


def _shown(rows: list[int]) -> str:
    return ", ".join(map(str, rows[:SHOWN_ROWS])) + (", ..." if len(rows) > SHOWN_ROWS else "")


def rows_to_items(rows: list[dict], cfg: DataSection, name: str) -> list[TaskItem]:
    """The items of a file's or data set's rows (`name` names it in ids and errors), through data.preprocess,
    data.columns and data.answer_preset; skipped rows are counted in a warning (the module docstring)."""
    check_columns(cfg.columns)
    hook = load_hook(cfg.preprocess)
    items, dropped, unanswered, first_text = [], [], [], ""
    for i, raw in enumerate(rows):
        where = f"{name}: row {i}"
        row = run_hook(hook, cfg.preprocess, raw, where) if hook else raw
        if row is None:
            dropped.append(i)
            continue
        fields, extra = map_columns(row, cfg.columns, where)
        item = _row_item(fields, extra, cfg, f"{name}:{i}", where)
        if item is None:
            first_text = first_text or str(fields["answer"])
            unanswered.append(i)
            continue
        items.append(item)
    if 2 * len(unanswered) > len(rows):
        raise DataError(f"{name}: data.answer_preset={cfg.answer_preset!r} finds no answer in {len(unanswered)} of "
                        f"{len(rows)} rows (rows {_shown(unanswered)}; row {unanswered[0]}'s answer ends "
                        f"{first_text[-120:]!r}): is the preset, or data.columns.answer, right?")
    if unanswered:
        log.warning(f"{name}: skipped {len(unanswered)} of {len(rows)} rows where data.answer_preset="
                    f"{cfg.answer_preset!r} finds no answer (rows {_shown(unanswered)})")
    if dropped:
        log.warning(f"{name}: data.preprocess={cfg.preprocess!r} dropped {len(dropped)} of {len(rows)} rows "
                    f"(rows {_shown(dropped)})")
    if not items:
        raise DataError(f"{name}: no rows left ({len(dropped)} dropped by data.preprocess, {len(unanswered)} without "
                        f"an answer)")
    return items


def prompt_messages(item: TaskItem, system_prompt: str = "", instruction: str = "") -> list[dict[str, str]]:
    """The chat turns of an item's prompt: its own turns (multi-turn rows) or its question as one user turn;
    `system_prompt` goes first unless the turns have a system turn, `instruction` ends the last user turn."""
    turns = json.loads(item.messages) if item.messages else [{"role": "user", "content": item.question}]
    if system_prompt and turns[0]["role"] != "system":
        turns = [{"role": "system", "content": system_prompt}, *turns]
    if instruction:
        turns[-1] = {**turns[-1], "content": f"{turns[-1]['content']}\n{instruction}"}
    return turns


def load_items(cfg: DataSection, split: str) -> list[TaskItem]:
    """The items of one split ('train', 'eval' or 'sft') as the source gives them."""
    if cfg.source == "reasoning_gym":
        return _reasoning_gym(cfg, split) if split != "sft" or cfg.sft_size > 0 else []
    if cfg.source == "rubric":
        return _rubric_tasks(cfg, split)
    if cfg.source == "hf":
        got = hf_rows(cfg, split)
        return rows_to_items(got[1], cfg, got[0]) if got else []
    path = {"train": cfg.path, "eval": cfg.eval_path, "sft": cfg.sft_path}[split]
    return rows_to_items(read_rows(path, cfg.source), cfg, path) if path else []


def load_splits_counted(cfg: DataSection) -> tuple[list[TaskItem], list[TaskItem], int]:
    """(train, held-out items, how many held-out items were left out): held-out items never repeat a training
    (or separate SFT) question."""
    train = load_items(cfg, "train")
    seen = {it.question for it in train} | {it.question for it in load_items(cfg, "sft")}
    held = load_items(cfg, "eval")
    kept = [it for it in held if it.question not in seen]
    return train, kept, len(held) - len(kept)


def load_splits(cfg: DataSection) -> tuple[list[TaskItem], list[TaskItem]]:
    """(train, held-out) items; held-out items never repeat a training (or separate SFT) question."""
    return load_splits_counted(cfg)[:2]


def load_sft_items(cfg: DataSection) -> list[TaskItem]:
    """Separate SFT items (data.sft_size / data.sft_path), never an RL training question; empty when
    the config has none (SFT then uses the RL training items)."""
    train = {it.question for it in load_items(cfg, "train")}
    return [it for it in load_items(cfg, "sft") if it.question not in train]
