"""The exploration seam: what an explorer may do to a step, and how several compose.

A step (train/loop.py) runs, for the explorers in their fixed order (ALGORITHMS.md §4: E3, RRL,
HeRL):

    plan     each explorer may change the row plan: group sizes, temperatures, prefix rows
    sample   one sampler call for the plan
    score    a reward per row, whether it counts as solved (Rollouts.correct, the run's definition:
             never read "solved" off the reward, which reward functions' terms move), rubric items met
    revise   each explorer may add or replace rows, with `sample` and `score` callables it is
             handed (so explore/ never imports train/), and returns metrics of what it did
    advantages over the rows the step ended with, then the update
    observe  each explorer updates its state from the scored rollouts and returns metrics

An explorer object holds its config only. `init(setup)` returns its state and its `Footprint`: the state
is a pytree whose array leaves are checkpointed with the train state and restored exactly, and whose
static (non-leaf) field holds what the explorer derives from the Setup for the run (sizes, tables, the
tokenizer), rebuilt by init on resume. That field compares by the explorer's config and the run's sizes
only (its data-derived members are `compare=False`), so two runs' states tree-map together; jitted code
takes those members as arguments, never baked in. What plan() decides and observe() needs rides in the
plan's rows (RowPlan.replay_slot), never on `self`. Each explorer draws its randomness from its own key
phase (`StepInfo.key`). The defaults do nothing, so plain GRPO is the empty composition.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import jax
import numpy as np

from jaxrl_llm.explore.rows import RowPlan, Rollouts
from jaxrl_llm.sampling.sampler import SampleOutput

# the fixed order explorers run in, and the key phase of each (the trainer's own phases are below 16)
ORDER = ("e3", "rrl", "herl")
KEY_PHASE = {name: 16 + i for i, name in enumerate(ORDER)}

# sample(plan, contexts=None, min_rows=0, min_context=0): the plan's rows from their prompts (contexts[i]
# instead, e.g. a revise prompt), with optional floors of the sampler's shape buckets; score(plan, out):
# rewards against the ORIGINAL items of the plan's rows; logprobs(out): the current policy's tempered
# log-probs [N, L] of out's tokens (a teacher-forced pass, e.g. after SampleOutput.with_prompts)
SampleFn = Callable[..., SampleOutput]
ScoreFn = Callable[[RowPlan, SampleOutput], Rollouts]
# (out, *, min_rows=0): the current policy's log-probs of out's tokens, the pass padded to min_rows rows
LogprobFn = Callable[..., np.ndarray]


@dataclasses.dataclass(frozen=True)
class Setup:
    """What an explorer may size its state by and build rows from, fixed for the run."""

    num_items: int  # training prompts (trackers index them by their position in the data set)
    prompts_per_step: int  # B
    group_size: int  # nominal rollouts per prompt n
    rows: int  # N = n * B, the static rollout batch
    total_steps: int
    steps_per_epoch: int
    vocab_size: int
    temperature: float  # the configured sampling temperature
    item_difficulty: np.ndarray | None = None  # [num_items] data-set rank in [0, 1] (1 hardest), NaN: not given
    items: Sequence[Any] = ()  # [num_items] the training TaskItems (question, answer, scorer, rubrics)
    prompts: Sequence[Sequence[int]] = ()  # [num_items] their prompt tokens as the policy sees them
    tokenizer: Any = None  # to decode responses and encode new contexts (e.g. revise prompts)
    encode: Callable[[str], list] | None = None  # a user message -> prompt tokens as the policy sees prompts
    max_new_tokens: int = 0  # rollout.max_new_tokens: a response's token budget (a given prefix counts)
    mesh: Any = None  # the run's device mesh (explorer arrays may be laid out over its batch axes)


@dataclasses.dataclass(frozen=True)
class StepInfo:
    step: int  # 1-based RL step
    prompt_ids: np.ndarray  # [B] training-set index of each of the step's prompts (RowPlan.prompt's values)
    key: jax.Array  # the explorer's key for this step (its own phase)


@dataclasses.dataclass(frozen=True)
class Footprint:
    """What an explorer may add to a step, declared by init so that the run's shapes and memory plan are
    known before anything big is built."""

    extra_contexts: int = 0  # most distinct contexts (prompt + prefix, or its own) it adds to a step beyond its prompts
    prefix_tokens: int = 0  # longest given prefix it puts after a prompt (0: none)
    context_tokens: int = 0  # longest context of its own (not a training prompt) it has rows trained under (0: none)
    # the smallest group it can create, None when it leaves group sizes alone (the update's shared layout is sized
    # by it)
    min_group_size: int | None = None
    # (rows, context length) of the largest sampler calls of its own in a step (the memory plan sizes the sampler's
    # KV cache for the largest call of the run)
    sampling_calls: tuple[tuple[int, int], ...] = ()

    @staticmethod
    def combine(footprints: Sequence["Footprint"], nominal: int) -> "Footprint":
        """Several explorers' footprints as one: contexts add up, lengths take the longest, calls all count; the
        smallest group is None when every group keeps `nominal` rows, else the smallest any explorer can make."""
        sizes = [f.min_group_size for f in footprints if f.min_group_size is not None]
        return Footprint(extra_contexts=sum(f.extra_contexts for f in footprints),
                         prefix_tokens=max([0] + [f.prefix_tokens for f in footprints]),
                         context_tokens=max([0] + [f.context_tokens for f in footprints]),
                         min_group_size=min([nominal] + sizes) if sizes else None,
                         sampling_calls=tuple(call for f in footprints for call in f.sampling_calls))


class Explorer:
    """No-op defaults; subclasses override what they change."""

    name = "none"

    def init(self, setup: Setup) -> tuple[Any, Footprint]:
        return {}, Footprint()

    def plan(self, state, plan: RowPlan, info: StepInfo) -> RowPlan:
        return plan

    def revise(self, state, rollouts: Rollouts, info: StepInfo, sample: SampleFn, score: ScoreFn,
               logprobs: LogprobFn | None = None) -> tuple[Rollouts, dict]:
        return rollouts, {}

    def observe(self, state, rollouts: Rollouts, info: StepInfo) -> tuple[Any, dict]:
        return state, {}


class Explorers:
    """Explorers composed in the fixed ORDER; states are a dict name -> pytree."""

    def __init__(self, explorers: Sequence[Explorer]):
        unknown = [e.name for e in explorers if e.name not in ORDER]
        if unknown:
            raise ValueError(f"unknown explorers {unknown}; known: {ORDER}")
        self.explorers = sorted(explorers, key=lambda e: ORDER.index(e.name))

    @property
    def names(self) -> list[str]:
        return [e.name for e in self.explorers]

    def start(self, setup: Setup) -> tuple[dict, Footprint]:
        """Every explorer's initial state, and their footprints combined."""
        states, footprints = {}, []
        for e in self.explorers:
            states[e.name], footprint = e.init(setup)
            footprints.append(footprint)
        return states, Footprint.combine(footprints, setup.group_size)

    # -- a step ---------------------------------------------------------------------------------------
    def plan(self, states: dict, plan: RowPlan, info: dict[str, StepInfo]) -> RowPlan:
        for e in self.explorers:
            plan = e.plan(states[e.name], plan, info[e.name])
        return plan

    def revise(self, states: dict, rollouts: Rollouts, info: dict[str, StepInfo], sample: SampleFn,
               score: ScoreFn, logprobs: LogprobFn | None = None) -> tuple[Rollouts, dict]:
        metrics = {}
        for e in self.explorers:
            rollouts, m = e.revise(states[e.name], rollouts, info[e.name], sample, score, logprobs)
            metrics.update(m)
        return rollouts, metrics

    def observe(self, states: dict, rollouts: Rollouts, info: dict[str, StepInfo]) -> tuple[dict, dict]:
        states, metrics = dict(states), {}
        for e in self.explorers:
            states[e.name], m = e.observe(states[e.name], rollouts, info[e.name])
            metrics.update(m)
        return states, metrics
