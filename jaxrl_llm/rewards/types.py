"""What a scoring job returns (`Score`) and what scoring reads of a task item (`ScoredTask`).

Its own module, importing nothing of the package, because every scorer returns a Score: rewards/verifiers.py and
rubrics.py in the workers, rewards/functions.py for the user's functions, rewards/pool.py in between, and
rewards/scoring.py, which gathers them, imports those.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping, Protocol


@dataclasses.dataclass(frozen=True)
class Score:
    """One job's result. `reward`: the built-in scorer's (rubric tasks: sum w m / sum w); `met`: a rubric's items
    met, 0/1 in rubric order (None from scorers that grade no rubric); `components`: a reward function's named
    values (None from the built-in scorers; `reward` is then their sum); `failed`: the job raised, ran out of
    time or memory, or ended its worker, so it scores 0 (the pool counts it by kind)."""

    reward: float = 0.0
    met: tuple[int, ...] | None = None
    components: Mapping[str, float] | None = None
    failed: bool = False

    @staticmethod
    def of_components(values: Mapping[str, float]) -> "Score":
        """A reward function's result: its components, their sum the reward."""
        values = {str(k): float(v) for k, v in values.items()}
        return Score(sum(values.values()), components=values)


FAILED = Score(failed=True)


class ScoredTask(Protocol):
    """The fields of a task item (data/types.py TaskItem) that scoring reads."""

    @property
    def question(self) -> str: ...

    @property
    def answer(self) -> str: ...

    @property
    def scorer(self) -> str: ...  # "reasoning_gym:<name>" | "math" | "exact" | "rubric"

    @property
    def entry_json(self) -> str: ...  # the scorer's entry: a reasoning-gym entry, or a rubric as JSON

    @property
    def rubric(self) -> str: ...  # a rubric task's items as JSON ("" for the others)

    @property
    def extra(self) -> str: ...  # the row's other columns as a JSON object, for reward functions
