"""Task items and their sources: reasoning-gym data sets (generated offline, seeded) and local
jsonl / parquet files (data/task_files.py reads them, each row as written: rows may differ in keys).

File schema (one row per task): `question` (str, required), `answer` (str, required),
`scorer` ("math" | "exact", default "math"), `reference` (str, optional: a worked solution for SFT),
`difficulty` (number in [0, 1], optional, 1 hardest: seeds E3's difficulty ranks). A row with a
`rubric` (a list of {description, weight, check, args?} items, rewards/rubrics.py) is a rubric task:
graded by its items (reward sum w m / sum w), `answer` optional. `data.source: rubric` generates
instruction-following rubric tasks offline (data/rubric_tasks.py).
"""

from __future__ import annotations

import dataclasses
import json

from jaxrl_llm.config import DataSection
from jaxrl_llm.data.task_files import DataError, read_rows
from jaxrl_llm.data.worked import worked_solution

EVAL_SEED_OFFSET = 1_000_003  # held-out items come from another generator stream
SFT_SEED_OFFSET = 2_000_003  # and separate SFT items (data.sft_size) from a third


@dataclasses.dataclass(frozen=True)
class TaskItem:
    uid: str
    question: str
    answer: str
    scorer: str  # "reasoning_gym:<name>" | "math" | "exact"
    entry_json: str = ""  # the reasoning-gym entry its scorer needs, as JSON
    reference: str = ""
    difficulty: float = float("nan")  # data-set difficulty rank in [0, 1] (1 hardest); NaN: not given
    rubric: str = ""  # rubric tasks (scorer "rubric"): the items as JSON text (rewards/rubrics.py dump_rubric)


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
    from jaxrl_llm.rewards.rubrics import RubricError, dump_rubric, parse_rubric

    try:
        rubric = parse_rubric(rubric_items, where)
    except RubricError as e:
        raise DataError(str(e)) from None
    text = dump_rubric(rubric)
    return TaskItem(uid=uid, question=question, answer=answer, scorer="rubric", entry_json=text,
                    reference=reference, difficulty=difficulty, rubric=text)


def _rubric_tasks(cfg: DataSection, split: str) -> list[TaskItem]:
    from jaxrl_llm.data.rubric_tasks import rubric_items

    if split == "sft":
        return []
    size = {"train": cfg.train_size, "eval": cfg.eval_size}[split]
    return [_rubric_item(f"rubric:{split}:{i}", row["question"], row["rubric"], f"rubric task {split} {i}")
            for i, row in enumerate(rubric_items(split, size, cfg.seed))]


def _file(path: str, kind: str) -> list[TaskItem]:
    rows = read_rows(path, kind)
    items = []
    for i, row in enumerate(rows):
        if row.get("rubric") is not None:  # a rubric task: graded by its items, an answer is optional
            if row.get("question") in (None, ""):
                raise DataError(f"{path}: row {i} has no 'question'")
            items.append(_rubric_item(f"{path}:{i}", str(row["question"]), row["rubric"], f"{path}: row {i}",
                                      answer=str(row.get("answer") or ""), reference=str(row.get("reference") or "")))
            continue
        for key in ("question", "answer"):
            if row.get(key) in (None, ""):
                raise DataError(f"{path}: row {i} has no {key!r}")
        scorer = row.get("scorer") or "math"
        if scorer not in ("math", "exact"):
            raise DataError(f"{path}: row {i} has scorer {scorer!r}; use 'math' or 'exact'")
        difficulty = row.get("difficulty")
        if difficulty is not None:
            try:
                difficulty = float(difficulty)
            except (TypeError, ValueError):
                difficulty = float("nan")
            if not 0.0 <= difficulty <= 1.0:
                raise DataError(f"{path}: row {i} has difficulty {row.get('difficulty')!r}; give a number in [0, 1] "
                                f"(1 hardest) or leave it out")
        items.append(TaskItem(uid=f"{path}:{i}", question=str(row["question"]), answer=str(row["answer"]),
                              scorer=scorer, reference=str(row.get("reference") or ""),
                              difficulty=float("nan") if difficulty is None else difficulty))
    return items


def load_items(cfg: DataSection, split: str) -> list[TaskItem]:
    """The items of one split ('train', 'eval' or 'sft') as the source gives them."""
    if cfg.source == "reasoning_gym":
        return _reasoning_gym(cfg, split) if split != "sft" or cfg.sft_size > 0 else []
    if cfg.source == "rubric":
        return _rubric_tasks(cfg, split)
    path = {"train": cfg.path, "eval": cfg.eval_path, "sft": cfg.sft_path}[split]
    return _file(path, cfg.source) if path else []


def load_splits(cfg: DataSection) -> tuple[list[TaskItem], list[TaskItem]]:
    """(train, held-out) items; held-out items never repeat a training (or separate SFT) question."""
    train = load_items(cfg, "train")
    seen = {it.question for it in train} | {it.question for it in load_items(cfg, "sft")}
    return train, [it for it in load_items(cfg, "eval") if it.question not in seen]


def load_sft_items(cfg: DataSection) -> list[TaskItem]:
    """Separate SFT items (data.sft_size / data.sft_path), never an RL training question; empty when
    the config has none (SFT then uses the RL training items)."""
    train = {it.question for it in load_items(cfg, "train")}
    return [it for it in load_items(cfg, "sft") if it.question not in train]
