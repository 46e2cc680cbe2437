"""Device mesh construction.

Axis types are Auto on purpose: parameters and batches carry NamedShardings and XLA's sharding
propagation (GSPMD) places everything in between. Explicit axes would make every einsum name its
output sharding, which buys nothing for this model family.
"""

from __future__ import annotations

from typing import Mapping

import jax
import numpy as np
from jax.sharding import AxisType, Mesh

AXES = ("data", "fsdp", "tensor")


def make_mesh(shape: Mapping[str, int] | None = None, devices=None) -> Mesh:
    """A mesh over axes (data, fsdp, tensor); one size may be -1 to take the remaining devices."""
    devices = list(devices if devices is not None else jax.devices())
    shape = dict(shape or {"data": -1})
    unknown = set(shape) - set(AXES)
    if unknown:
        raise ValueError(f"unknown mesh axes {sorted(unknown)}; axes are {AXES}")
    sizes = [int(shape.get(a, 1)) for a in AXES]
    if sizes.count(-1) > 1:
        raise ValueError(f"mesh {shape}: at most one axis may be -1")
    fixed = int(np.prod([s for s in sizes if s != -1]))
    if -1 in sizes:
        if len(devices) % fixed:
            raise ValueError(f"mesh {shape}: {len(devices)} devices are not a multiple of {fixed}")
        sizes[sizes.index(-1)] = len(devices) // fixed
    if int(np.prod(sizes)) != len(devices):
        raise ValueError(f"mesh {dict(zip(AXES, sizes))} needs {int(np.prod(sizes))} devices, have {len(devices)}")
    return jax.make_mesh(tuple(sizes), AXES, axis_types=(AxisType.Auto,) * len(AXES), devices=devices)
