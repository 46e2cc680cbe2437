"""The update batch as typed pytrees: one definition of the fields every producer (rollouts, SFT,
benchmarks, tests) fills and every consumer (rl/layout.py, rl/forward.py, rl/update.py) reads.

`RowBatch` describes the step's rows, and is also the `rows` layout the update takes: tokens
[N, L] (context, then the row's own tokens, pad), context_len [N] (the prompt, plus a given prefix:
the context the row is trained under), loss_mask / old_logp [N, L] at the positions of the tokens
they score, advantages, temperature, valid (False: batch padding) and hindsight [N] (HeRL revision
rows, trained with the hindsight weight instead of the clipped ratio).

`SharedBatch` is the shared-prefix layout (rl/layout.py): a leading micro-batch axis M, each
micro-batch's contexts once (ctx_tokens [M, G, Lc], ctx_len [M, G]) and its rows' own tokens
[M, R, Ls] with row_ctx [M, R] naming their context.
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
from flax import struct


@struct.dataclass
class RowBatch:
    tokens: np.ndarray
    context_len: np.ndarray
    loss_mask: np.ndarray
    old_logp: np.ndarray
    advantages: np.ndarray
    temperature: np.ndarray
    valid: np.ndarray
    hindsight: np.ndarray

    @classmethod
    def make(cls, tokens, loss_mask, *, context_len=None, old_logp=None, advantages=None, temperature=None,
             valid=None, hindsight=None) -> "RowBatch":
        """Rows with defaults for what a producer leaves out: context_len 1 (SFT rows train on everything
        after their first token that the mask selects), old_logp 0, advantages 1, temperature 1, every
        row valid, none hindsight."""
        tokens = np.asarray(tokens, np.int32)
        n, length = tokens.shape

        def per_row(x, fill, dtype):
            return np.full((n,), fill, dtype) if x is None else np.asarray(x, dtype).reshape(n)

        return cls(tokens=tokens, context_len=per_row(context_len, 1, np.int32),
                   loss_mask=np.asarray(loss_mask, bool).reshape(n, length),
                   old_logp=np.zeros((n, length), np.float32) if old_logp is None
                   else np.asarray(old_logp, np.float32).reshape(n, length),
                   advantages=per_row(advantages, 1.0, np.float32), temperature=per_row(temperature, 1.0, np.float32),
                   valid=per_row(valid, True, bool), hindsight=per_row(hindsight, False, bool))

    def take(self, idx) -> "RowBatch":
        return jax.tree.map(lambda x: x[idx], self)

    @property
    def rows(self) -> int:
        return int(self.tokens.shape[0])


@struct.dataclass
class SharedBatch:
    ctx_tokens: np.ndarray
    ctx_len: np.ndarray
    tokens: np.ndarray
    row_ctx: np.ndarray
    loss_mask: np.ndarray
    old_logp: np.ndarray
    advantages: np.ndarray
    temperature: np.ndarray
    valid: np.ndarray
    hindsight: np.ndarray


def shapes(batch) -> dict[str, list[int]]:
    """Field name -> shape, for logs and benchmark reports."""
    return {f.name: list(np.shape(getattr(batch, f.name))) for f in dataclasses.fields(batch)}


def positions(batch) -> int:
    """Positions that go through forward and backward: rows, plus contexts once each when shared."""
    extra = int(np.size(batch.ctx_tokens)) if isinstance(batch, SharedBatch) else 0
    return int(np.size(batch.tokens)) + extra
