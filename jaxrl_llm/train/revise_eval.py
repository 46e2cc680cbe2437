"""Test-time self-revision rounds (HeRL's "experience-guided self-improvement at test time").

After evaluation's first answers, every rubric-graded answer not solved goes back to the policy
with the revise prompt training uses (explore.herl.revise_template, filled by explore/herl.py
`revise_text`: the question, the rubric items the answer meets and misses, the answer as the draft) and
its new answer replaces it; eval.revise_rounds rounds. Each new answer is scored against the ORIGINAL
item and rubric. Solved is what the Scores say (train/rollout.py: the built-in scorer's full marks, or
reward.correctness), not full marks of a total that reward functions move. A solved answer is never sent
back, so it stays solved: accuracy can only rise from round to round, the mean reward can fall. Answers to
tasks without a rubric are never sent back.

Figures of round r (1..k), over all the pass's answers (problems for greedy, samples for sampled):
    r{r}_accuracy     share solved after round r (each answer the last one it got)
    r{r}_reward_mean  their mean reward
    r{r}_sent         share sent back in round r
    r{r}_improved     share whose reward round r raised; r{r}_worse: lowered (of all answers, not of those sent)
    r{r}_tokens       tokens generated in round r
    best_accuracy     share solved in any of rounds 0..k (equal to r{k}_accuracy by the rule above)
    best_reward_mean  each answer's best reward over rounds 0..k (it can exceed the last)

Revise prompts are longer than task prompts: every revise call is padded to the same rows (the rollout
batch) and to one context floor (`context_floor`: the longest revise prompt of the evaluated items with a
full-length draft), so all rounds of all passes share one compiled sampler program.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import numpy as np

from jaxrl_llm.config import Config
from jaxrl_llm.data.types import TaskItem
from jaxrl_llm.explore.herl import revise_text
from jaxrl_llm.rewards.rubrics import rubric_items
from jaxrl_llm.rewards.scoring import solved
from jaxrl_llm.rl.spec import rows_per_step
from jaxrl_llm.sampling.buckets import bucket

TIE = 1e-6  # rewards closer than this count as unchanged


@dataclasses.dataclass(frozen=True)
class Answers:
    """Scored answers: reward [m], rubric items met [m, K] (False past a rubric's end), text, solved [m] (the
    Scores' `correct`; default full marks of the reward, what it is without reward functions)."""

    rewards: np.ndarray
    met: np.ndarray
    texts: tuple[str, ...]
    correct: np.ndarray | None = None

    def __post_init__(self):
        if self.correct is None:
            object.__setattr__(self, "correct", solved(self.rewards))

    def take(self, rows: np.ndarray) -> "Answers":
        return Answers(self.rewards[rows], self.met[rows], tuple(self.texts[i] for i in rows), self.correct[rows])


# revise(round, rows, drafts) -> (new answers for `rows`, tokens each generated); drafts = the current answers at rows
Revise = Callable[[int, np.ndarray, Answers], tuple[Answers, np.ndarray]]


def widen(met: np.ndarray | None, rows: int, width: int) -> np.ndarray:
    """`met` [rows, any width] (None: no rubric row) as [rows, width]: cut, or False in the columns it lacks."""
    out = np.zeros((rows, width), bool)
    if met is not None:
        out[:, :min(width, met.shape[1])] = met[:, :width]
    return out


class RevisePrompts:
    """The revise prompts of a list of task items: the template, each item's question as the policy saw
    it (with data.instruction), its rubric; `encode` turns a text into prompt ids (the run's chat template)."""

    def __init__(self, template: str, instruction: str, items: Sequence[TaskItem], encode: Callable[[str], list]):
        self.template, self.encode = template, encode
        self.questions = [it.question + (f"\n{instruction}" if instruction else "") for it in items]
        self.rubrics = [rubric_items(it.rubric) if it.scorer == "rubric" and it.rubric else () for it in items]
        self.uids = [it.uid for it in items]
        self.width = max((len(r) for r in self.rubrics), default=0)

    @property
    def graded(self) -> np.ndarray:
        """Which items have a rubric (the only ones ever sent back)."""
        return np.array([bool(r) for r in self.rubrics], bool)

    def text(self, item: int, met: np.ndarray, draft: str) -> str:
        rubric = self.rubrics[item]
        met = widen(np.asarray(met, bool)[None], 1, len(rubric))[0]
        return revise_text(self.template, self.questions[item], [r.description for k, r in enumerate(rubric) if met[k]],
                           [r.description for k, r in enumerate(rubric) if not met[k]], draft)

    def ids(self, item: int, met: np.ndarray, draft: str) -> list[int]:
        return self.encode(self.text(item, met, draft))

    def context_floor(self, max_new: int, max_cache_len: int) -> int:
        """The context bucket of every revise call: the longest revise prompt (every item listed, empty draft)
        plus a draft of `max_new` tokens. Refused, naming the item, when that leaves a revision less than the
        first answers' `max_new` tokens in the model's `max_cache_len` positions (the sampler would cut it short,
        and the rounds' figures would compare answers of unequal budgets)."""
        lengths = [(len(self.ids(i, np.zeros(len(r), bool), "")), i) for i, r in enumerate(self.rubrics) if r]
        longest, item = max(lengths, default=(0, -1))
        if item >= 0 and longest + 2 * max_new > max_cache_len:
            raise ValueError(f"eval.revise_rounds: the revise prompt of item {self.uids[item]} is {longest} tokens "
                             f"before its draft of up to {max_new}, which leaves less than the {max_new} tokens of a "
                             f"first answer to revise in the model's {max_cache_len} positions; shorten "
                             f"explore.herl.revise_template or eval.max_new_tokens, or set eval.revise_rounds=0")
        return bucket(longest + max_new, 16)


def eval_prompts(cfg: Config, items: Sequence[TaskItem], encode: Callable[[str], list]) -> RevisePrompts | None:
    """The revise prompts of evaluation `items` under `cfg`; None when eval.revise_rounds is 0 or no item has a
    rubric (the rounds would send nothing back)."""
    if not cfg.eval.revise_rounds:
        return None
    prompts = RevisePrompts(cfg.explore.herl.revise_template, cfg.data.instruction, items, encode)
    return prompts if prompts.graded.any() else None


def call_shape(cfg: Config, prompts: RevisePrompts, max_cache_len: int) -> tuple[int, int]:
    """(rows, context floor) of every revise call: the rollout batch's rows (evaluation's chunk) and the
    prompts' context floor; the form of an explorer's `sampling_calls()` entry, for the memory plan."""
    max_new = cfg.eval.max_new_tokens or cfg.rollout.max_new_tokens
    return rows_per_step(cfg), prompts.context_floor(max_new, max_cache_len)


def run_rounds(first: Answers, graded: np.ndarray, rounds: int, revise: Revise) -> dict:
    """The round figures (module docstring) of `rounds` revise rounds from the `first` answers; `graded` [m]:
    the answers that may be sent back (rubric tasks). A round sends back the graded answers not solved and
    calls `revise` only when there is one."""
    cur, best, ever = first, first.rewards.astype(np.float64), first.correct.copy()
    m = len(first.rewards)
    out = {}
    for r in range(1, rounds + 1):
        sent = np.flatnonzero(graded & ~cur.correct)
        improved = worse = tokens = 0
        if len(sent):
            new, lengths = revise(r, sent, cur.take(sent))
            before = cur.rewards[sent]
            improved, worse = int(np.sum(new.rewards > before + TIE)), int(np.sum(new.rewards < before - TIE))
            tokens = int(np.sum(lengths))
            rewards, met, texts, correct = cur.rewards.copy(), cur.met.copy(), list(cur.texts), cur.correct.copy()
            rewards[sent], met[sent], correct[sent] = new.rewards, new.met, new.correct
            for j, i in enumerate(sent):
                texts[i] = new.texts[j]
            cur = Answers(rewards, met, tuple(texts), correct)
            best, ever = np.maximum(best, cur.rewards), ever | cur.correct
        out.update({f"r{r}_accuracy": float(np.mean(cur.correct)),
                    f"r{r}_reward_mean": float(np.mean(cur.rewards, dtype=np.float64)), f"r{r}_sent": len(sent) / m,
                    f"r{r}_improved": improved / m, f"r{r}_worse": worse / m, f"r{r}_tokens": tokens})
    out.update({"best_accuracy": float(np.mean(ever)), "best_reward_mean": float(np.mean(best))})
    return out
