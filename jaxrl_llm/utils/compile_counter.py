"""Counts XLA programs built in this process, so runs can log it and tests can assert it stays flat.

Every jit cache miss lowers a new module to MLIR, also when the persistent compilation cache then
serves the binary, so lowering events count programs built, cache or no cache.
"""

from __future__ import annotations

import threading

import jax

_LOWER_EVENT = "/jax/core/compile/jaxpr_to_mlir_module_duration"
_lock = threading.Lock()
_count = 0
_installed = False


def _listener(event: str, duration_secs: float, **kwargs) -> None:
    global _count
    if event == _LOWER_EVENT:
        with _lock:
            _count += 1


def install() -> None:
    global _installed
    with _lock:
        if not _installed:
            jax.monitoring.register_event_duration_secs_listener(_listener)
            _installed = True


def compilations() -> int:
    """Programs lowered since `install()` (installed on import of this module)."""
    return _count


install()
