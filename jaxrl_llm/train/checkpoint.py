"""Checkpoints with orbax: parameters, optimizer state, and a JSON registry of everything else
(step, data iterator, model shape, and any state a controller registers). Keep-N, asynchronous saves,
restore straight into the live arrays' sharded layout."""

from __future__ import annotations

from pathlib import Path

import jax
import orbax.checkpoint as ocp


class CheckpointMismatchError(ValueError):
    pass


class Checkpointer:
    def __init__(self, directory: Path, *, keep: int = 3, async_save: bool = True):
        self.directory = Path(directory).absolute()
        self.manager = ocp.CheckpointManager(
            self.directory, item_names=("arrays", "registry"),
            options=ocp.CheckpointManagerOptions(max_to_keep=keep, enable_async_checkpointing=async_save))

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def save(self, step: int, arrays, registry: dict, *, wait: bool = False) -> None:
        self.manager.save(step, args=ocp.args.Composite(arrays=ocp.args.StandardSave(arrays),
                                                        registry=ocp.args.JsonSave(registry)))
        if wait:
            self.manager.wait_until_finished()

    def restore(self, arrays_like, model_signature: dict, step: int | None = None):
        """(arrays, registry) of `step` (default: latest), placed like `arrays_like`."""
        step = self.latest_step() if step is None else step
        registry = self.manager.restore(step, args=ocp.args.Composite(registry=ocp.args.JsonRestore()))["registry"]
        saved = registry.get("model_signature")
        if saved != model_signature:
            raise CheckpointMismatchError(
                f"{self.directory}/{step}: written for model {saved}, but this run's model is {model_signature}; "
                f"use another train.out_dir or set train.resume=false")
        abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), arrays_like)
        arrays = self.manager.restore(step, args=ocp.args.Composite(arrays=ocp.args.StandardRestore(abstract)))
        return arrays["arrays"], registry

    def wait(self) -> None:
        self.manager.wait_until_finished()

    def close(self) -> None:
        self.manager.wait_until_finished()
        self.manager.close()
