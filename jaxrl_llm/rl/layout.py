"""Host-side update batches in the two layouts rl/forward.py computes on.

The trainer describes its rows once, whatever produced them (fresh samples, replayed prefixes,
hindsight revisions), as an rl/batch.py `RowBatch`.

`rows_layout` takes rows as they are. `shared_layout` encodes each distinct context once: rows are
sorted by context and cut into micro-batches of `micro_rows` rows (a context whose rows straddle a
cut appears in both micro-batches; its gradient sums over them), each micro-batch holding only the
contexts its rows use. Lengths are buckets of the longest context and of the longest row, so a run
compiles a handful of programs, never one per step.
"""

from __future__ import annotations

import numpy as np

from jaxrl_llm.rl.batch import RowBatch, SharedBatch
from jaxrl_llm.sampling.buckets import bucket


def rows_layout(rows: RowBatch, idx: np.ndarray) -> RowBatch:
    return rows.take(idx)


def _own_len(rows: RowBatch, idx: np.ndarray) -> np.ndarray:
    """Tokens after the context up to the last one that carries loss (at least 1)."""
    mask = rows.loss_mask[idx]
    last = np.where(mask.any(axis=1), mask.shape[1] - np.argmax(mask[:, ::-1], axis=1), 0)
    return np.maximum(last - rows.context_len[idx], 1)


def contexts_bound(micro_rows: int, group_size: int, *, exact: bool = True, cap: int | None = None) -> int:
    """Most contexts a micro-batch of `micro_rows` rows sorted by context can hold, passed to
    shared_layout as `min_contexts` so the context axis keeps one shape for a whole run. `exact`:
    every group has `group_size` rows (plain GRPO); otherwise groups have at least `group_size` rows
    and any sizes (explorers: E3 budgets, replayed groups), and `cap` is the most distinct contexts
    a step can have at all (its prompts, plus any contexts explorers add)."""
    if not exact:
        return min(micro_rows, 1 + -(-(micro_rows - 1) // group_size), cap or micro_rows)
    if micro_rows % group_size == 0:
        return micro_rows // group_size
    if group_size % micro_rows == 0:
        return 1
    return -(-micro_rows // group_size) + 1


def shared_layout(rows: RowBatch, idx: np.ndarray, micro_rows: int, *, min_contexts: int = 1, min_context: int = 16,
                  min_length: int = 8) -> SharedBatch:
    """The shared-prefix form of rows `idx`: arrays with a leading micro-batch axis M. The context axis
    holds `min_contexts` contexts, or a power-of-two bucket of the most a micro-batch needs where that is more;
    the context length is `min_context`, or a power-of-two bucket of the longest context where that is longer."""
    tokens, ctx_len = rows.tokens[idx], rows.context_len[idx].astype(np.int32)
    n = len(idx)
    if (ctx_len < 1).any():
        raise ValueError("every row needs a context of at least one token")
    keys = [tokens[i, :ctx_len[i]].tobytes() for i in range(n)]
    ctx_id = np.unique(np.array(keys, dtype=object), return_inverse=True)[1].reshape(-1)
    own = _own_len(rows, idx)
    # a run-constant floor is taken as it is when the step fits it: it is already one shape for the whole run,
    # and rounding it up to a power of two would pad every context of every step (explorers' floors: rl/spec.py)
    lc = min_context if int(ctx_len.max()) <= min_context else bucket(int(ctx_len.max()))
    ls = bucket(int(own.max()), min_length)
    r = min(micro_rows, n)
    m = -(-n // r)
    order = np.argsort(ctx_id, kind="stable")
    order = np.concatenate([order, np.full(m * r - n, -1)])  # -1: padding rows (valid False)
    per_micro = [order[j * r:(j + 1) * r] for j in range(m)]
    needed = max(len(np.unique(ctx_id[p[p >= 0]])) for p in per_micro)
    g = min_contexts if needed <= min_contexts else bucket(needed)

    out = {"ctx_tokens": np.zeros((m, g, lc), np.int32), "ctx_len": np.ones((m, g), np.int32),
           "tokens": np.zeros((m, r, ls), np.int32), "row_ctx": np.zeros((m, r), np.int32),
           "loss_mask": np.zeros((m, r, ls), bool), "old_logp": np.zeros((m, r, ls), np.float32),
           "advantages": np.zeros((m, r), np.float32), "temperature": np.ones((m, r), np.float32),
           "valid": np.zeros((m, r), bool), "hindsight": np.zeros((m, r), bool)}
    width = tokens.shape[1]
    for j, part in enumerate(per_micro):
        local: dict[int, int] = {}
        for k, i in enumerate(part):
            if i < 0:
                continue
            if int(ctx_id[i]) not in local:  # the first row of a context in this micro-batch brings it
                c = local[int(ctx_id[i])] = len(local)
                out["ctx_tokens"][j, c, :ctx_len[i]] = tokens[i, :ctx_len[i]]
                out["ctx_len"][j, c] = ctx_len[i]
            c = local[int(ctx_id[i])]
            start, stop = int(ctx_len[i]), min(int(ctx_len[i]) + ls, width)
            src = idx[i]
            out["tokens"][j, k, :stop - start] = tokens[i, start:stop]
            out["loss_mask"][j, k, :stop - start] = rows.loss_mask[src, start:stop]
            out["old_logp"][j, k, :stop - start] = rows.old_logp[src, start:stop]
            out["row_ctx"][j, k] = c
            for name in ("advantages", "temperature", "valid", "hindsight"):
                out[name][j, k] = getattr(rows, name)[src]
    return SharedBatch(**out)
