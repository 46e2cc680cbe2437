"""What a multi-host (multi-controller) run needs beyond one process: every process runs the same step
on the same global view, and the heavy work is split by rows.

How a step runs on H processes (parallel/distributed.py starts them):
    - every process draws the same global prompt batch (a few integers) and makes the same row plan, so
      explorer decisions (E3 budgets, RRL slots, HeRL candidates) and explorer state are identical on every
      host without being sent anywhere;
    - device programs (sampling, update, replay-array ops) take global arrays: `put` fills each process's
      own devices' shards from the global value (jax.make_array_from_callback; any device order);
    - each process scores only its share of the rows (`share`) in its own reward pool, and the rewards
      are gathered (`gather_rows`), so every host holds the step's full rollouts;
    - values coming back from devices: `to_host` gathers a row-sharded array's shards from every process;
    - only process 0 writes logs, metrics and exports; orbax saves and restores across processes;
    - a stop asked on any host (SIGTERM) is agreed on at the end of the step (`any_process`) so every
      process checkpoints the same step and exits together;
    - a process that falls silent (dies, freezes) would block the others in a collective forever: the watchdog
      around that agreement (parallel/watchdog.py) then makes every live process name it and exit with the
      resume status.

With one process every function here is the identity (no collective runs).
"""

from __future__ import annotations

import jax
import numpy as np


def count() -> int:
    return jax.process_count()


def index() -> int:
    return jax.process_index()


def share(n: int) -> slice:
    """The rows [start, stop) of n that this process handles (contiguous, as even as possible)."""
    h, i = count(), index()
    per = -(-n // h)
    return slice(min(n, i * per), min(n, (i + 1) * per))


def _allgather(x: np.ndarray) -> np.ndarray:
    """[H, *x.shape]: every process's x (same shape and dtype on every process)."""
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(np.asarray(x), tiled=False))


def gather_rows(local: np.ndarray, n: int) -> np.ndarray:
    """The global [n, ...] array of which this process holds rows `share(n)` (`local`): every process's share,
    in order. Shares are padded to one size for the collective."""
    if count() == 1:
        return np.asarray(local)
    per = -(-n // count())
    local = np.asarray(local)
    padded = np.zeros((per,) + local.shape[1:], local.dtype)
    padded[:len(local)] = local
    return _allgather(padded).reshape((count() * per,) + local.shape[1:])[:n]


def max_int(value: int) -> int:
    """The largest of every process's `value` (shapes that must agree across processes)."""
    if count() == 1:
        return int(value)
    return int(_allgather(np.array(value, np.int64)).max())


def sum_int(value: int) -> int:
    """The sum of every process's `value` (counters each process keeps for its own share)."""
    if count() == 1:
        return int(value)
    return int(_allgather(np.array(value, np.int64)).sum())


def any_process(flag: bool) -> bool:
    """True on every process when `flag` is true on any (a stop asked on one host stops all at one step)."""
    if count() == 1:
        return bool(flag)
    return bool(_allgather(np.array(bool(flag))).any())


def digest(*arrays) -> int:
    """A 63-bit fingerprint of host values (numpy arrays, nested tuples of ints)."""
    import hashlib

    h = hashlib.blake2b(digest_size=8)
    for a in arrays:
        a = np.ascontiguousarray(np.asarray(a))
        h.update(str((a.dtype.str, a.shape)).encode())
        h.update(a.tobytes())
    return int.from_bytes(h.digest(), "little") >> 1


def check_same(fingerprint: int, what: str) -> None:
    """Raise on every process if the processes' `fingerprint`s differ: decisions every host makes on its own
    (the row plan) must agree, or the hosts would feed rows of different plans into one step."""
    if count() == 1:
        return
    seen = _allgather(np.array(fingerprint, np.int64))
    if len(set(seen.tolist())) > 1:
        raise RuntimeError(f"the processes disagree on {what} (fingerprints by process: {seen.tolist()}); "
                           f"every host must make the same decisions from the same global batch")


def to_host(x) -> np.ndarray:
    """The global value of a device array as numpy, on every process: arrays whose shards all live in
    this process (or are replicated) are read directly; row-sharded arrays of a multi-host mesh gather
    their shards from every process (a collective: every process must call it at the same point)."""
    if isinstance(x, jax.Array) and not x.is_fully_addressable and not x.is_fully_replicated:
        from jax.experimental import multihost_utils

        return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(x)


def put(x, sharding):
    """`jax.device_put(x, sharding)` of a host value every process holds in full. On a multi-host mesh each
    process fills its own devices' shards, each with its index into x (jax.make_array_from_callback): a
    process's rows need not be one block (a TPU slice's mesh follows the torus, so one host's chips hold rows
    0, 4, 16 and 20 of 32; feeding the hull of its rows was refused there)."""
    if count() == 1 or sharding.is_fully_addressable:
        return jax.device_put(x, sharding)
    x = np.asarray(x)
    return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])


def put_tree(tree, shardings):
    """`put` over a pytree and a matching tree of shardings."""
    return jax.tree.map(put, tree, shardings)


def tree_to_host(tree):
    return jax.tree.map(to_host, tree)


def barrier(name: str) -> None:
    """Every process waits here until all have arrived (file operations one process makes for all)."""
    if count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)
