"""The train state: everything a run's progress is, saved and restored as one unit.

Fields marked `arrays` are array pytrees (orbax, restored straight into the live arrays' sharded
layout); every other field is plain data kept in the checkpoint's JSON registry. Saving and
restoring walk the dataclass fields, so a field added here is checkpointed without another line
anywhere. `opt_state` is the optimizer state of the stage the run is in (SFT's during SFT, RL's
after); `explore` holds each explorer's state (explore/base.py) by name.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax

from jaxrl_llm.model import lora

# the trainer's key phases (explorers' own start at 16: explore/base.py KEY_PHASE)
PHASE_ROLLOUT, PHASE_EVAL, PHASE_SFT, PHASE_MINIBATCH = 1, 2, 3, 4


def phase_key(root: jax.Array, phase: int, step: int) -> jax.Array:
    """fold_in(root, phase, step): a resumed run draws the same numbers as an uninterrupted one."""
    return jax.random.fold_in(jax.random.fold_in(root, phase), step)


def _arrays(**kw):
    return dataclasses.field(metadata={"arrays": True}, **kw)


@dataclasses.dataclass
class TrainState:
    params: Any = _arrays(default=None)
    opt_state: Any = _arrays(default=None)
    # the KL reference (the policy when RL starts; with LoRA its adapters only, over the same base); None when
    # kl_coef == 0
    ref_params: Any = _arrays(default=None)
    explore: dict = _arrays(default_factory=dict)
    stage: str = "start"  # start -> sft -> rl (rl: SFT and the step-0 evaluation are behind us)
    step: int = 0  # RL steps done
    sft_step: int = 0
    seed: int = 0  # the key root: every random key is fold_in(key(seed), phase, step)
    data: dict | None = None  # the prompt iterator's state
    metrics_rows: int = 0  # rows of metrics.jsonl written up to this state
    # the run's counts of what went wrong up to this state (reward_errors, judge_parse_failures, ...: Run.counts);
    # a resumed run counts on from them, so its rows equal an uninterrupted run's
    counts: dict = dataclasses.field(default_factory=dict)

    @staticmethod
    def array_fields() -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(TrainState) if f.metadata.get("arrays"))

    def root(self) -> jax.Array:
        return jax.random.key(self.seed)

    def split(self) -> tuple[dict, dict]:
        """(arrays, registry): the array fields that hold something, and the plain fields. With LoRA adapters the
        parameters saved are the adapters alone: the frozen base is the model the run was built from."""
        arrays, registry = {}, {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if not f.metadata.get("arrays"):
                registry[f.name] = value
            elif value is not None and jax.tree.leaves(value):
                arrays[f.name] = lora.trainable(value) if f.name == "params" else value
        return arrays, registry

    def joined(self, arrays: dict, registry: dict) -> "TrainState":
        """This state with the saved fields put back (array fields not saved become None). Explorer state
        without arrays (HeRL's: {"herl": {}}) is never saved, so this state's, freshly initialised by the
        run's explorers, stays: dropping it lost the explorers' names and a resumed HeRL run failed."""
        kw = {f.name: registry[f.name] for f in dataclasses.fields(self) if not f.metadata.get("arrays")
              and f.name in registry}
        for name in self.array_fields():
            kw[name] = arrays.get(name, self.explore if name == "explore" else None)
        if kw["params"] is not None:  # adapters saved alone go back onto this state's frozen base
            kw["params"] = lora.combine(kw["params"], lora.frozen(self.params))
        return dataclasses.replace(self, **kw)
