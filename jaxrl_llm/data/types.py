"""The values every data module shares: a task item and the error that names a bad file, row or task.

Its own module, importing nothing of the package, so that the task sources (data/tasks.py, rubric_tasks.py,
task_files.py, rows.py, hf_rows.py) and the packages above them import these from one place.
"""

from __future__ import annotations

import dataclasses


class DataError(ValueError):
    """A task file, row or task name that cannot be used; the message names it."""


@dataclasses.dataclass(frozen=True)
class TaskItem:
    uid: str
    question: str
    answer: str
    scorer: str  # "reasoning_gym:<name>" | "math" | "exact" | "rubric"
    entry_json: str = ""  # the reasoning-gym entry its scorer needs, as JSON (rubric tasks: the rubric)
    reference: str = ""
    difficulty: float = float("nan")  # data-set difficulty rank in [0, 1] (1 hardest); NaN: not given
    rubric: str = ""  # rubric tasks (scorer "rubric"): the items as JSON text (rewards/rubrics.py dump_rubric)
    extra: str = ""  # the row's other columns as a JSON object: handed to reward functions (reward.functions)
    messages: str = ""  # a multi-turn prompt: its [{role, content}] turns as JSON (question: the last user turn)
