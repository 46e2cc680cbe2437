"""A step's rows as the trainer and the explorers share them.

`RowPlan` is what the sampler is asked for, frozen before sampling: for each of the N rows the
prompt it answers (its index in the training set, so a row may answer a prompt outside the step's
batch, e.g. a replayed one), its group (advantages are
computed within groups, whatever their sizes), its temperature, an optional given prefix of the
response (context, never trained on), per-row flags, and its random key. `Rollouts` is the plan
sampled and scored: the sampler's output, a scalar reward per row, the rubric items each row met
(tasks with rubrics), the decoded texts, and at the end the advantages.

What counts as solved is the run's, not the reward's: with reward functions the total reward may be
reached by a wrong answer (a format bonus) or missed by a right one (a length penalty), so the scorer
(train/rollout.py `score`) also fills each row's `correct` (Scores.correct: the built-in scorer's full
marks, or reward.correctness) and `success` (the [0, 1] value `correct` is full marks of). Every
explorer decision that means "solved" reads `correct`; the per-prompt averages that assume rewards in
[0, 1] (E3's difficulty, RRL's state values and priors) read `success`. Rows built without them (no
reward functions: the reward is the built-in scorer's) get `correct` = full marks of `scored` and
`success` = `scored`, which is what every explorer read before.

Both can be cut (`take`), joined (`concat`) and patched (`replace_rows`), so an explorer can add
rows or swap some for others sampled in another length bucket.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import jax
import numpy as np

from jaxrl_llm.sampling.sampler import SampleOutput, row_key_data


@dataclasses.dataclass(frozen=True)
class RowPlan:
    prompt: np.ndarray  # [N] int: the training item the row answers (index into the training set)
    group: np.ndarray  # [N] int: group id
    temperature: np.ndarray  # [N] float32
    prefix: tuple[tuple[int, ...], ...]  # [N] given response prefix tokens (empty: sample from the prompt)
    replayed: np.ndarray  # [N] bool: continues a stored prefix state (RRL)
    hindsight: np.ndarray  # [N] bool: a hindsight revision (HeRL)
    row_keys: np.ndarray  # [N, ...] raw key data: row i samples with fold_in(row_keys[i], t)
    # [N] int32: the replay slot a replayed row continues, -1 for the others. What RRL's observe reads back of
    # its plan: it travels with the rows, so nothing is held between the phases (default: all -1)
    replay_slot: np.ndarray | None = None
    # [N] bool: a copy of another row of its group (HeRL's keep_best_original), not a sample of its own
    copied: np.ndarray | None = None

    _ROW_FIELDS = ("prompt", "group", "temperature", "replayed", "hindsight", "row_keys", "replay_slot", "copied")

    def __post_init__(self):
        if self.replay_slot is None:
            object.__setattr__(self, "replay_slot", np.full(len(self.group), -1, np.int32))
        if self.copied is None:
            object.__setattr__(self, "copied", np.zeros(len(self.group), bool))

    @property
    def fresh(self) -> np.ndarray:
        """[N] bool: the rows sampled from their prompt as they are (no replayed prefix, no revision, no copy):
        the rows every step figure and explorer tracker counts."""
        return ~self.replayed & ~self.hindsight & ~self.copied

    @classmethod
    def groups(cls, sizes: Sequence[int], temperature, key: jax.Array, prompt_ids=None) -> "RowPlan":
        """Prompt i (training item prompt_ids[i], default i) sampled sizes[i] times from scratch: group
        i, rows in prompt order, row r's key fold_in(key, r). `temperature`: one, or one per row."""
        sizes = np.asarray(sizes, np.int64)
        group = np.repeat(np.arange(len(sizes)), sizes)
        n = len(group)
        ids = np.arange(len(sizes)) if prompt_ids is None else np.asarray(prompt_ids)
        temp = np.broadcast_to(np.asarray(temperature, np.float32), (n,)).copy()
        return cls(prompt=ids[group], group=group, temperature=temp, prefix=((),) * n,
                   replayed=np.zeros(n, bool), hindsight=np.zeros(n, bool), row_keys=np.asarray(row_key_data(key, n)))

    @property
    def rows(self) -> int:
        return len(self.group)

    @property
    def group_sizes(self) -> np.ndarray:
        return np.bincount(self.group)

    def take(self, idx) -> "RowPlan":
        idx = np.arange(self.rows)[idx]
        return dataclasses.replace(self, prefix=tuple(self.prefix[i] for i in idx),
                                   **{f: getattr(self, f)[idx] for f in self._ROW_FIELDS})

    @staticmethod
    def concat(plans: Sequence["RowPlan"]) -> "RowPlan":
        return dataclasses.replace(plans[0], prefix=tuple(p for plan in plans for p in plan.prefix),
                                   **{f: np.concatenate([getattr(p, f) for p in plans]) for f in RowPlan._ROW_FIELDS})

    def replace_rows(self, idx, other: "RowPlan") -> "RowPlan":
        idx = np.arange(self.rows)[idx]
        prefix = list(self.prefix)
        for i, p in zip(idx, other.prefix):
            prefix[i] = p
        fields = {}
        for f in self._ROW_FIELDS:
            x = getattr(self, f).copy()
            x[idx] = getattr(other, f)
            fields[f] = x
        return dataclasses.replace(self, prefix=tuple(prefix), **fields)


@dataclasses.dataclass(frozen=True)
class Rollouts:
    plan: RowPlan
    out: SampleOutput
    rewards: np.ndarray  # [N] float32
    texts: tuple[str, ...]  # [N] decoded response (given prefix + generated tokens)
    met: np.ndarray | None = None  # [N, K] bool: rubric items met (tasks with rubrics), else None
    advantages: np.ndarray | None = None  # [N] float32, computed last
    # [N] the rewards as scored, before any explorer adjusted `rewards` (e.g. HeRL's bonus); trackers read these
    scored: np.ndarray | None = None
    correct: np.ndarray | None = None  # [N] bool: the row counts as solved; default full marks of `scored`
    success: np.ndarray | None = None  # [N] float32 in [0, 1], `correct` its full marks; default `scored`

    def __post_init__(self):
        if self.scored is None:
            object.__setattr__(self, "scored", self.rewards)
        if self.correct is None:
            object.__setattr__(self, "correct", full_marks(self.scored))
        if self.success is None:
            object.__setattr__(self, "success", self.scored)

    @property
    def rows(self) -> int:
        return self.plan.rows

    def take(self, idx) -> "Rollouts":
        idx = np.arange(self.rows)[idx]
        return Rollouts(self.plan.take(idx), self.out.take(idx), self.rewards[idx],
                        tuple(self.texts[i] for i in idx), None if self.met is None else self.met[idx],
                        None if self.advantages is None else self.advantages[idx], self.scored[idx],
                        self.correct[idx], self.success[idx])

    @staticmethod
    def concat(parts: Sequence["Rollouts"]) -> "Rollouts":
        mets = [p.met for p in parts]
        met = None
        if not any(m is None for m in mets):
            k = max(m.shape[1] for m in mets)
            met = np.concatenate([_widen_met(m, k) for m in mets])
        return Rollouts(RowPlan.concat([p.plan for p in parts]), SampleOutput.concat([p.out for p in parts]),
                        np.concatenate([p.rewards for p in parts]), tuple(t for p in parts for t in p.texts),
                        met, scored=np.concatenate([p.scored for p in parts]),
                        correct=np.concatenate([p.correct for p in parts]),
                        success=np.concatenate([p.success for p in parts]))

    def replace_rows(self, idx, other: "Rollouts") -> "Rollouts":
        """These rollouts with rows `idx` replaced by `other`'s (advantages are dropped: compute them
        again over the rows the step ends with)."""
        idx = np.arange(self.rows)[idx]
        rewards, scored, texts = self.rewards.copy(), self.scored.copy(), list(self.texts)
        correct, success = self.correct.copy(), self.success.copy()
        rewards[idx] = other.rewards
        scored[idx] = other.scored
        correct[idx] = other.correct
        success[idx] = other.success
        for i, t in zip(idx, other.texts):
            texts[i] = t
        met = None
        if self.met is not None and other.met is not None:  # rubrics of other lengths: padded with False
            k = max(self.met.shape[1], other.met.shape[1])
            met = _widen_met(self.met, k).copy()
            met[idx] = _widen_met(other.met, k)
        return Rollouts(self.plan.replace_rows(idx, other.plan), self.out.replace_rows(idx, other.out), rewards,
                        tuple(texts), met, scored=scored, correct=correct, success=success)


def full_marks(rewards) -> np.ndarray:
    """[N] bool: rewards at full marks (1, within float error), what `correct` is without reward functions."""
    return np.asarray(rewards) >= 1.0 - 1e-6


def _widen_met(met: np.ndarray, k: int) -> np.ndarray:
    """Items-met [N, K'] padded with False to K columns."""
    return np.pad(met, ((0, 0), (0, k - met.shape[1])))
