"""Bucketed static shapes: inputs are padded up to a small set of sizes so varied batches and
prompt lengths reuse a bounded number of compiled programs."""

from __future__ import annotations


def bucket(n: int, minimum: int = 1) -> int:
    """Smallest power of two >= max(n, minimum)."""
    n = max(int(n), int(minimum), 1)
    return 1 << (n - 1).bit_length()
