"""Jitted prefill + KV-cache decode.

One program per (batch bucket, distinct-context bucket, context bucket, new-token bucket): temperature, top-p, top-k,
per-row token budgets and stop ids are traced arrays, so new values never recompile. Decoding is
a `lax.while_loop` that ends when every row has finished. Its KV cache grows with the rows: decode steps
attend over `prefill + first_level` slots while every row is within them, then over twice as many, and so on
up to the buffer (each level its own loop in the one program, the cache padded between levels), so a step's
attention costs what the filled part of the cache holds, within 2x, not the whole buffer. Weights enter as an
argument (the nnx state), never closed over, so the trainer's updated parameters feed straight in.

Layout of the token buffer [B, S]: row b holds its context (prompt, then an optional given prefix
of the response) in slots [0, context_len), generated tokens after it, pad to the right. Slot index
equals position, which is also the KV-cache slot, so rows of different lengths decode together and
each row computes exactly what it would alone. Row keys are independent of batch composition:
row i draws its t-th new token with `fold_in(row_key_i, t)`.

Shared prefill: rows often share their context (GRPO samples each prompt `group_size` times), so
the program prefills each distinct context once ([U, prefill] tokens, U <= B, also a power-of-two
bucket) and gives each row the cache rows and next-token logits of its context (`row_source`).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jax.sharding import Mesh

from jaxrl_llm.model.transformer import Transformer
from jaxrl_llm.parallel import hosts
from jaxrl_llm.parallel.hosts import tree_to_host
from jaxrl_llm.parallel.rules import row_sharding
from jaxrl_llm.sampling.buckets import bucket
from jaxrl_llm.sampling.decode import (FINISH_LENGTH, FINISH_STOP, RowSettings, RowState, decode_levels,  # noqa: F401
                                       decode_step, distinct_contexts, expand_cache, live_end, pad_cache, prefill,
                                       prefill_table)
from jaxrl_llm.sampling.slots import SlotDecoder

DECODE_LEVEL = 256  # decode's first cache level beyond the prefill (decode_levels); shorter buffers: one level


class PromptTooLongError(ValueError):
    """A context does not fit the cache with room for at least one new token."""


@dataclasses.dataclass(frozen=True)
class SampleOutput:
    """Host (numpy) arrays for N rows; L is the padded buffer length (a bucket)."""

    tokens: np.ndarray  # [N, L] int32: prompt, prefix, generated tokens, pad
    prompt_len: np.ndarray  # [N]
    prefix_len: np.ndarray  # [N] given partial-response tokens after the prompt (RRL / HeRL)
    num_generated: np.ndarray  # [N]
    logprobs: np.ndarray  # [N, L] float32, tempered, at generated positions (0 elsewhere)
    entropy: np.ndarray  # [N, L] float32, tempered, at generated positions (0 elsewhere)
    finish_reason: np.ndarray  # [N] FINISH_STOP or FINISH_LENGTH
    temperature: np.ndarray  # [N]
    pad_id: int = 0  # what fills tokens after a row's end

    _ROW_FIELDS = ("tokens", "prompt_len", "prefix_len", "num_generated", "logprobs", "entropy", "finish_reason",
                   "temperature")
    _WIDE_FIELDS = ("tokens", "logprobs", "entropy")  # [N, L]: padded when buffers of other lengths meet

    @property
    def rows(self) -> int:
        return int(self.tokens.shape[0])

    def take(self, idx) -> "SampleOutput":
        """Rows `idx` (an index array or a boolean mask), in that order."""
        return dataclasses.replace(self, **{f: getattr(self, f)[idx] for f in self._ROW_FIELDS})

    def widened(self, width: int) -> "SampleOutput":
        """The same rows in a buffer of `width` slots (>= the current one)."""
        extra = width - self.tokens.shape[1]
        if extra < 0:
            raise ValueError(f"cannot narrow a buffer of {self.tokens.shape[1]} slots to {width}")
        if extra == 0:
            return self
        pad = lambda x, v: np.pad(x, ((0, 0), (0, extra)), constant_values=v)  # noqa: E731
        return dataclasses.replace(self, tokens=pad(self.tokens, self.pad_id), logprobs=pad(self.logprobs, 0),
                                   entropy=pad(self.entropy, 0))

    @staticmethod
    def concat(outs: Sequence["SampleOutput"]) -> "SampleOutput":
        """Rows of several sampler calls (of any length buckets) in one output, in order."""
        width = max(o.tokens.shape[1] for o in outs)
        outs = [o.widened(width) for o in outs]
        return dataclasses.replace(outs[0], **{f: np.concatenate([getattr(o, f) for o in outs])
                                               for f in SampleOutput._ROW_FIELDS})

    def replace_rows(self, idx, other: "SampleOutput") -> "SampleOutput":
        """These rows with rows `idx` replaced by `other`'s rows, in order (buffers widened to fit)."""
        width = max(self.tokens.shape[1], other.tokens.shape[1])
        base, other = self.widened(width), other.widened(width)
        fields = {}
        for f in self._ROW_FIELDS:
            x = getattr(base, f).copy()
            x[np.asarray(idx)] = getattr(other, f)
            fields[f] = x
        return dataclasses.replace(base, **fields)

    def with_prompts(self, prompts: Sequence[Sequence[int]]) -> "SampleOutput":
        """The same responses (given prefix and generated tokens, with their log-probs and entropies)
        after other prompts: row i's context becomes prompts[i] + its prefix. For training a response
        under a context other than the one it was sampled in (HeRL's `train_on: original`); the
        log-probs stay those of sampling. The buffer is a bucket of the longest new row."""
        n = self.rows
        if len(prompts) != n:
            raise ValueError(f"{len(prompts)} prompts for {n} rows")
        plen = np.array([len(p) for p in prompts], np.int32)
        own = self.prefix_len + self.num_generated
        width = bucket(int((plen + own).max()), 16)
        tokens = np.full((n, width), self.pad_id, np.int32)
        logp, ent = np.zeros((n, width), np.float32), np.zeros((n, width), np.float32)
        for i in range(n):
            a, b = int(self.prompt_len[i]), int(self.prompt_len[i] + own[i])
            tokens[i, :plen[i]] = prompts[i]
            tokens[i, plen[i]:plen[i] + own[i]] = self.tokens[i, a:b]
            logp[i, plen[i]:plen[i] + own[i]] = self.logprobs[i, a:b]
            ent[i, plen[i]:plen[i] + own[i]] = self.entropy[i, a:b]
        return dataclasses.replace(self, tokens=tokens, prompt_len=plen, logprobs=logp, entropy=ent)

    @property
    def context_len(self) -> np.ndarray:
        return self.prompt_len + self.prefix_len

    def _span_mask(self, start, stop) -> np.ndarray:
        idx = np.arange(self.tokens.shape[1])[None, :]
        return (idx >= start[:, None]) & (idx < stop[:, None])

    @property
    def response_mask(self) -> np.ndarray:
        """[N, L] bool: tokens the sampler generated."""
        return self._span_mask(self.context_len, self.context_len + self.num_generated)

    @property
    def prefix_mask(self) -> np.ndarray:
        """[N, L] bool: the given prefix tokens (not generated, so never trained on as samples)."""
        return self._span_mask(self.prompt_len, self.context_len)

    def generated(self, i: int) -> list[int]:
        start = int(self.context_len[i])
        return self.tokens[i, start:start + int(self.num_generated[i])].tolist()


@functools.partial(jax.jit, static_argnames=("graphdef", "first_level"), donate_argnames=("tokens_BS",))
def generate_program(graphdef, state, tokens_BS, context_len_B, max_new_B, temperature_B, top_p_B, top_k_B,
                     keys_B, stop_ids_K, unique_tokens_UP, unique_len_U, row_source_B, first_level: int = 0):
    """The device program: prefill the U distinct contexts (`unique_tokens_UP` [U, P]: the first P
    slots), copy each row's context cache and logits from `row_source_B`, then decode until all rows
    finish, the cache growing through `decode_levels` (first_level 0: the whole buffer from the start).
    `tokens_BS` holds every row's context too (it becomes the output)."""
    model: Transformer = nnx.merge(graphdef, state)
    batch, slots = tokens_BS.shape
    prefill_len = unique_tokens_UP.shape[1]
    cache_U, logits_UV = prefill(model, unique_tokens_UP, unique_len_U)
    # the B-row cache is a fresh buffer that the decode loop carries and updates in place; the U-row
    # prefill cache is dead after this copy
    levels = decode_levels(prefill_len, slots, first_level)
    settings = RowSettings(max_new_B, temperature_B, top_p_B, top_k_B, keys_B)
    zeros_BS = jnp.zeros((batch, slots), jnp.float32)
    rows = RowState(tokens_BS, zeros_BS, zeros_BS, expand_cache(cache_U, row_source_B, levels[0]),
                    logits_UV[row_source_B], context_len_B, jnp.zeros((batch,), jnp.int32), max_new_B <= 0,
                    jnp.full((batch,), FINISH_LENGTH, jnp.int32))

    def cond(carry, level_slots):
        step, rows = carry
        going = (step < slots - prefill_len + 1) & ~jnp.all(rows.done)
        if level_slots == slots:  # the last level: a live row is always below the last slot
            return going
        return going & (live_end(rows) < level_slots)  # every live row writes its next key inside the level

    def body(carry):
        step, rows = carry
        return step + 1, decode_step(model, settings, stop_ids_K, rows)

    carry = (jnp.int32(0), rows)
    for level_slots in levels:  # a loop per cache length; a level no row reaches runs no step
        carry = (carry[0], carry[1]._replace(cache=pad_cache(carry[1].cache, level_slots)))
        carry = jax.lax.while_loop(functools.partial(cond, level_slots=level_slots), body, carry)
    rows = carry[1]
    return rows.tokens, rows.logp, rows.ent, rows.count, rows.reason


@functools.partial(jax.jit, static_argnums=1)
def row_key_data(key: jax.Array, rows: int) -> jax.Array:
    """Raw key data [rows, ...] of fold_in(key, i): row i's key, whatever the batch around it."""
    return jax.random.key_data(jax.vmap(jax.random.fold_in, in_axes=(None, 0))(key, jnp.arange(rows)))


def _per_row(value, n: int, dtype, name: str) -> np.ndarray:
    arr = np.asarray(value, dtype=dtype)
    if arr.ndim == 0:
        return np.full((n,), arr, dtype)
    if arr.shape != (n,):
        raise ValueError(f"{name}: expected a scalar or {n} values, got shape {arr.shape}")
    return arr


class Sampler:
    """Host wrapper: pads to buckets, derives row keys, calls the jitted program, returns numpy.

    `graphdef` comes from `nnx.split(model)`; each call takes the matching state, so the same
    sampler serves every policy version.
    """

    def __init__(self, graphdef, *, pad_id: int, stop_ids: Sequence[int] = (), max_cache_len: int = 4096,
                 min_batch: int = 1, min_context: int = 16, min_new: int = 16, mesh: Mesh | None = None,
                 share_prefill: bool = True, min_unique: int = 1, decode_level: int = DECODE_LEVEL,
                 decode_slots: int = 0):
        self.graphdef = graphdef
        # > 0: a call's rows decode through this many slots that finished rows leave and waiting rows refill
        # (sampling/slots.py); 0: every row of a call decodes in one program until the last has finished
        self.decode_slots = int(decode_slots)
        self.slot_stats = None  # the last slot-decoded call's SlotStats
        # decode attends over prefill + this many slots first, doubling as rows grow (0: the whole buffer)
        self.decode_level = int(decode_level)
        # prefill each distinct context (prompt + prefix) once; False prefills every row (a benchmark's baseline)
        self.share_prefill = bool(share_prefill)
        self.mesh = mesh  # when set, rows are split over the mesh's batch axes
        self.pad_id = int(pad_id)
        self.stop_ids = tuple(int(s) for s in stop_ids)
        self.max_cache_len = int(max_cache_len)
        self.min_batch, self.min_context, self.min_new = min_batch, min_context, min_new
        # at least this many distinct contexts are prefilled (a bucket), so calls whose count of distinct
        # contexts varies (RRL's replayed prefixes) keep one program
        self.min_unique = int(min_unique)

    @classmethod
    def for_model(cls, model: Transformer, **kwargs) -> tuple["Sampler", nnx.State]:
        graphdef, state = nnx.split(model)
        kwargs.setdefault("max_cache_len", model.cfg.max_position_embeddings)
        kwargs.setdefault("stop_ids", model.cfg.eos_token_ids)
        return cls(graphdef, **kwargs), state

    def fits(self, context_len: int) -> bool:
        """Whether a context of this many tokens leaves the cache room for a new token (else PromptTooLongError)."""
        return 0 < context_len and context_len + 1 <= self.max_cache_len

    def shapes(self, n_rows: int, max_context: int, max_new: int) -> tuple[int, int, int]:
        """(batch bucket, prefill length, buffer slots) for a call of this size."""
        prefill = bucket(max_context, self.min_context)
        slots = prefill + bucket(max_new, self.min_new)
        return bucket(n_rows, self.min_batch), prefill, slots

    def __call__(self, state, prompts: Sequence[Sequence[int]], *, max_new_tokens=128, temperature=1.0,
                 top_p=1.0, top_k=0, key: jax.Array | None = None, row_keys: jax.Array | None = None,
                 prefixes: Sequence[Sequence[int]] | None = None, stop_ids: Sequence[int] | None = None,
                 min_rows: int = 0, min_context: int = 0) -> SampleOutput:
        """`min_rows` / `min_context`: floors of this call's batch and context buckets (calls whose sizes
        vary, such as HeRL's guided revisions, keep one program); the distinct-context bucket then is
        the batch bucket."""
        kwargs = dict(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, top_k=top_k, key=key,
                      row_keys=row_keys, prefixes=prefixes, stop_ids=stop_ids, min_rows=min_rows,
                      min_context=min_context)
        if self.decode_slots:
            h = self._host_rows(prompts, **kwargs)
            n = h["n"]
            decoder = SlotDecoder(self.graphdef, slots=self.decode_slots, first_level=self.decode_level,
                                  pad_id=self.pad_id, mesh=self.mesh)
            settings = RowSettings(h["max_new"], h["temperature"], h["top_p"], h["top_k"], h["key_data"][:n])
            *out, self.slot_stats = decoder(
                state, h["contexts"], settings, prefill_len=h["prefill"], buffer=h["slots"], stop_ids=h["stops"],
                share_prefill=self.share_prefill, min_unique=self.min_unique, min_rows=min_rows)
        else:
            args, h = self._inputs(prompts, **kwargs)
            n = h["n"]
            # rows are sharded over the mesh; on a multi-host mesh every process gathers all of them
            out = [x[:n] for x in tree_to_host(generate_program(self.graphdef, state, *args,
                                                                 first_level=self.decode_level))]
        tokens, logp, ent, count, reason = out
        return SampleOutput(
            tokens=tokens, prompt_len=h["prompt_len"], prefix_len=h["prefix_len"], num_generated=count,
            logprobs=logp, entropy=ent, finish_reason=reason, temperature=h["temperature"], pad_id=self.pad_id)

    def lower(self, state, prompts: Sequence[Sequence[int]], **kwargs) -> jax.stages.Lowered:
        """The program a call with these arguments runs, lowered (not run): for cost analysis and tests."""
        args, _ = self._inputs(prompts, **kwargs)
        return generate_program.lower(self.graphdef, state, *args, first_level=self.decode_level)

    def _host_rows(self, prompts, *, max_new_tokens=128, temperature=1.0, top_p=1.0, top_k=0, key=None,
                   row_keys=None, prefixes=None, stop_ids=None, min_rows=0, min_context=0) -> dict:
        """A call's rows as host arrays, checked, and its buckets: contexts, per-row settings (n rows), key data
        (b rows: padding rows repeat row 0's key), stop ids, and (b, prefill, slots) of `shapes`."""
        n = len(prompts)
        if n == 0:
            raise ValueError("no prompts given")
        prefixes = prefixes if prefixes is not None else [()] * n
        if len(prefixes) != n:
            raise ValueError(f"{len(prefixes)} prefixes for {n} prompts")
        contexts = [tuple(int(t) for t in p) + tuple(int(t) for t in x) for p, x in zip(prompts, prefixes)]
        ctx_len = np.array([len(c) for c in contexts], np.int32)
        for i, c in enumerate(ctx_len):
            if c == 0:
                raise ValueError(f"row {i}: empty prompt")
            if not self.fits(c):
                raise PromptTooLongError(
                    f"row {i}: context of {c} tokens leaves no room in a cache of {self.max_cache_len} "
                    f"(max_cache_len); shorten the prompt or raise max_cache_len")
        max_new = _per_row(max_new_tokens, n, np.int32, "max_new_tokens")
        max_new = np.minimum(max_new, self.max_cache_len - ctx_len)
        b, prefill, slots = self.shapes(max(n, min_rows), max(int(ctx_len.max()), min_context), int(max_new.max()))
        if row_keys is None:
            key_data = np.asarray(row_key_data(jax.random.key(0) if key is None else key, b))
        else:
            key_data = np.asarray(jax.random.key_data(row_keys))
            if key_data.shape[0] != n:
                raise ValueError(f"row_keys has {key_data.shape[0]} keys for {n} prompts")
            key_data = np.concatenate([key_data, np.repeat(key_data[:1], b - n, axis=0)])
        return dict(n=n, contexts=contexts, ctx_len=ctx_len, max_new=max_new, b=b, prefill=prefill, slots=slots,
                    key_data=key_data, temperature=_per_row(temperature, n, np.float32, "temperature"),
                    top_p=_per_row(top_p, n, np.float32, "top_p"), top_k=_per_row(top_k, n, np.int32, "top_k"),
                    stops=self.stop_ids if stop_ids is None else tuple(stop_ids),
                    prompt_len=np.array([len(p) for p in prompts], np.int32),
                    prefix_len=np.array([len(x) for x in prefixes], np.int32))

    def _inputs(self, prompts, **kwargs) -> tuple[list[jax.Array], dict]:
        """Padded, bucketed (and, with a mesh, row-sharded) device arguments of generate_program after
        `graphdef, state`, and host facts for the output."""
        h = self._host_rows(prompts, **kwargs)
        n, contexts, ctx_len, max_new, b, prefill, slots = (h[k] for k in ("n", "contexts", "ctx_len", "max_new", "b",
                                                                             "prefill", "slots"))
        min_rows = kwargs.get("min_rows", 0)
        tokens = np.full((b, slots), self.pad_id, np.int32)
        for i, c in enumerate(contexts):
            tokens[i, :len(c)] = c
        pad_rows = b - n

        # distinct contexts in order of first appearance, padding rows reading context 0; without sharing every
        # row is its own context (padding rows included, as before sharing existed)
        source, unique = distinct_contexts(contexts, self.share_prefill)
        if self.share_prefill:
            u = b if min_rows else min(bucket(len(unique), max(self.min_batch, self.min_unique)), b)
            source = np.array(source + [0] * pad_rows, np.int32)
        else:
            u, source = b, np.arange(b, dtype=np.int32)
        unique_tokens, unique_len = prefill_table(unique, u, prefill, self.pad_id)

        def padded(x, fill):
            return np.concatenate([x, np.full((pad_rows,), fill, x.dtype)])

        rows = [tokens, padded(ctx_len, 1), padded(max_new, 0), padded(h["temperature"], 0.0),
                padded(h["top_p"], 1.0), padded(h["top_k"], 0), h["key_data"]]
        unique = [unique_tokens, unique_len]
        if self.mesh is not None:
            rows = [hosts.put(x, row_sharding(self.mesh, b, x.ndim)) for x in rows]
            unique = [hosts.put(x, row_sharding(self.mesh, u, x.ndim)) for x in unique]
            source = hosts.put(source, row_sharding(self.mesh, b, 1))
        args = [*map(jnp.asarray, rows), jnp.asarray(np.array(h["stops"] or (-1,), np.int32)),
                *map(jnp.asarray, unique), jnp.asarray(source)]
        return args, h
