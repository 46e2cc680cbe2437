"""Logical axis names -> mesh axes: the one table that decides how parameters and activations shard.

Parameters name their dimensions (`embed`, `mlp`, `heads`, ...) in the model; a run maps those
names onto mesh axes (`data`, `fsdp`, `tensor`) here. A dimension whose size does not divide the
product of its mesh axes stays replicated, so tiny test models run on any mesh.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import jax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

MeshAxes = str | tuple[str, ...] | None

DEFAULT_RULES: Mapping[str, MeshAxes] = {
    "batch": ("data", "fsdp"),
    "length": None,
    "vocab": "tensor",
    "embed": "fsdp",
    "mlp": "tensor",
    "heads": "tensor",
    "kv_heads": "tensor",
    "head_dim": None,
    "norm": None,
    "lora": None,  # an adapter's rank (model/lora.py): small, never split
}


def spec_for(shape: Sequence[int], axes: Sequence[str | None], mesh: Mesh,
             rules: Mapping[str, MeshAxes] = DEFAULT_RULES) -> PartitionSpec:
    if len(shape) != len(axes):
        raise ValueError(f"logical axes {tuple(axes)} do not match shape {tuple(shape)}")
    used: set[str] = set()
    out = []
    for size, name in zip(shape, axes):
        if name is not None and name not in rules:
            raise KeyError(f"logical axis {name!r} has no rule; known: {sorted(rules)}")
        target = rules.get(name) if name else None
        mesh_axes = (target,) if isinstance(target, str) else tuple(target or ())
        mesh_axes = tuple(a for a in mesh_axes if a in mesh.shape and mesh.shape[a] > 1 and a not in used)
        n = 1
        for a in mesh_axes:
            n *= mesh.shape[a]
        if not mesh_axes or size % n:
            out.append(None)
            continue
        used.update(mesh_axes)
        out.append(mesh_axes[0] if len(mesh_axes) == 1 else mesh_axes)
    return PartitionSpec(*out)


def state_shardings(state: nnx.State, mesh: Mesh, rules: Mapping[str, MeshAxes] = DEFAULT_RULES):
    """NamedShardings for every variable of an nnx State (abstract or concrete), as a pure dict."""

    def one(var):
        axes = var.get_metadata().get("logical_axes")
        if axes is None:
            return NamedSharding(mesh, PartitionSpec())
        return NamedSharding(mesh, spec_for(var.get_value().shape, axes, mesh, rules))

    return nnx.to_pure_dict(jax.tree.map(one, state, is_leaf=lambda x: isinstance(x, nnx.Variable)))


def sharding_tree(state: nnx.State, mesh: Mesh, rules: Mapping[str, MeshAxes] = DEFAULT_RULES) -> nnx.State:
    """NamedShardings in the structure of `state` itself (for jit in/out_shardings, device_put)."""
    out = jax.tree.map(lambda x: x, state)  # fresh Variables; `state` itself is left as it is
    nnx.replace_by_pure_dict(out, state_shardings(state, mesh, rules))
    return out


def shard_state(state: nnx.State, mesh: Mesh, rules: Mapping[str, MeshAxes] = DEFAULT_RULES) -> nnx.State:
    """`state` with every array placed in its sharded layout on `mesh`."""
    return jax.device_put(state, sharding_tree(state, mesh, rules))


def row_sharding(mesh: Mesh, rows: int, ndim: int = 1,
                 rules: Mapping[str, MeshAxes] = DEFAULT_RULES) -> NamedSharding:
    """Sharding of an [rows, ...] batch array: rows over the mesh axes of the `batch` rule (when they
    divide `rows`), every other dimension whole."""
    return NamedSharding(mesh, spec_for((rows,) + (1,) * (ndim - 1), ("batch",) + (None,) * (ndim - 1), mesh, rules))
