"""The prompt pipeline (grain): per-epoch shuffling, per-host sharding, batches of item indices, and an
iterator whose state goes into every checkpoint."""

from __future__ import annotations

import grain
import jax


def prompt_batches(num_items: int, batch_size: int, seed: int):
    """An endless iterator of index batches [batch_size] over this host's share of the items."""
    ds = grain.MapDataset.source(list(range(num_items)))
    ds = ds[jax.process_index()::jax.process_count()]
    if len(ds) < batch_size:
        raise ValueError(f"{len(ds)} prompts on this host cannot fill a batch of {batch_size}")
    return ds.shuffle(seed=seed).repeat(None).batch(batch_size, drop_remainder=True).to_iter_dataset().__iter__()
