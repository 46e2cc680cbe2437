"""The prompt pipeline (grain): per-epoch shuffling, batches of item indices, and an iterator whose state
goes into every checkpoint.

Every process of a multi-host run draws the same GLOBAL batch (a few integers): the row plan and the
explorers' decisions are made identically on every host from it, and the rows are then split over the
hosts for sampling, scoring and the update (parallel/hosts.py). The order does not depend on the number
of processes, so a run on 2 hosts trains on the same prompts as on one."""

from __future__ import annotations

import grain


def prompt_batches(num_items: int, batch_size: int, seed: int):
    """An endless iterator of global index batches [batch_size] over the items."""
    ds = grain.MapDataset.source(list(range(num_items)))
    if len(ds) < batch_size:
        raise ValueError(f"{len(ds)} prompts cannot fill a batch of {batch_size}")
    # computed in the calling thread, one batch when asked: grain's default read options run 16 threads that keep
    # 500 batches ahead, which for a few integers a step cost 16 % of a tiny HeRL trainer run's CPU samples (grain's
    # index shuffle); the order and the iterator's state are the same
    sync = grain.ReadOptions(num_threads=0, prefetch_buffer_size=0)
    return ds.shuffle(seed=seed).repeat(None).batch(batch_size, drop_remainder=True).to_iter_dataset(sync).__iter__()
