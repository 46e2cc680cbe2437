"""Decode in a fixed number of slots that the host refills and compacts: finished rows stop costing.

The one-call sampler (sampler.py `generate_program`) decodes every row of a call together until the longest has
finished, so with lengths that spread most late steps compute rows that are done. Here a call's N rows pass
through `slots` decode rows (S <= N):
- `admit_program`: waiting rows take free slots; it prefills their distinct contexts once and writes each row's
  cache, next-token logits and settings into its slot;
- `decode_program`: every live slot decodes until an event the host must act on: enough slots have finished to
  admit waiting rows (or, with none waiting, to halve the slots), a live row reaches the end of the cache's
  current level, or every slot is done;
- between programs the host copies finished rows out, refills their slots, and with nothing waiting compacts the
  live rows into half as many slots (`regroup_program`), the cache growing to the next level (sampler.py's
  `decode_levels`) when a live row needs it and shrinking back when the long rows have gone.
A row's t-th token uses the key fold_in(row_key, t), as in the one-call sampler, so every row samples the tokens
it would sample there (up to float rounding in batches of another shape; tests/sampling/test_slots.py).
Programs: one per (slots, cache level) for decode and regrouping, one per (slots, distinct-context bucket, prefill
bucket, cache level) for admission; the calls and slot-steps of the last call are in `SlotStats`. The slot count is
a power of two (rounded up).
"""

from __future__ import annotations

import dataclasses
import functools
from collections import deque
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxrl_llm.model.transformer import KVCache
from jaxrl_llm.parallel import hosts
from jaxrl_llm.parallel.hosts import tree_to_host
from jaxrl_llm.parallel.rules import row_sharding
from jaxrl_llm.sampling.buckets import bucket
from jaxrl_llm.sampling.decode import (FINISH_LENGTH, RowSettings, RowState, cache_dtype, decode_levels, decode_step,
                                       distinct_contexts, live_end, prefill, prefill_table, resize_cache)


@dataclasses.dataclass
class SlotStats:
    """What one call did: program calls, and decode steps x slots computed (live or not)."""

    admits: int = 0
    decodes: int = 0
    regroups: int = 0
    slot_steps: int = 0  # sum over decode programs of steps x slots
    live_steps: int = 0  # tokens generated


@functools.partial(jax.jit, static_argnames=("graphdef",), donate_argnames=("rows",))
def decode_program(graphdef, state, rows: RowState, settings: RowSettings, stop_ids_K, free_target):
    """Decode every live slot until `free_target` slots are done, a live row reaches the cache's end, or all are
    done. Returns (rows, steps run)."""
    model = nnx.merge(graphdef, state)
    level = rows.cache.slots

    def cond(carry):
        _, rows = carry
        return (jnp.any(~rows.done) & (jnp.sum(rows.done) < free_target) & (live_end(rows) < level))

    def body(carry):
        steps, rows = carry
        return steps + 1, decode_step(model, settings, stop_ids_K, rows)

    steps, rows = jax.lax.while_loop(cond, body, (jnp.int32(0), rows))
    return rows, steps


@functools.partial(jax.jit, static_argnames=("graphdef",), donate_argnames=("rows", "settings"))
def admit_program(graphdef, state, rows: RowState, settings: RowSettings, slot_A, tokens_AL, context_len_A,
                  new: RowSettings, unique_tokens_UP, unique_len_U, row_source_A):
    """Rows entering slots `slot_A` (entries past the last slot are padding, dropped): prefill the U distinct
    contexts, give each row its context's cache in slots [0, P) and its next-token logits, and its settings."""
    model = nnx.merge(graphdef, state)
    cache_U, logits_UV = prefill(model, unique_tokens_UP, unique_len_U)
    p = unique_tokens_UP.shape[1]
    put = lambda dst, src: dst.at[slot_A].set(src, mode="drop")  # noqa: E731
    cache = KVCache([k.at[slot_A, :, :, :p].set(ck[row_source_A].astype(k.dtype), mode="drop")
                     for k, ck in zip(rows.cache.keys, cache_U.keys)],
                    [v.at[slot_A, :, :p].set(cv[row_source_A].astype(v.dtype), mode="drop")
                     for v, cv in zip(rows.cache.values, cache_U.values)])
    n = slot_A.shape[0]
    zeros = jnp.zeros(tokens_AL.shape, jnp.float32)
    rows = RowState(put(rows.tokens, tokens_AL), put(rows.logp, zeros), put(rows.ent, zeros), cache,
                    put(rows.logits, logits_UV[row_source_A]), put(rows.pos, context_len_A),
                    put(rows.count, jnp.zeros((n,), jnp.int32)), put(rows.done, new.max_new <= 0),
                    put(rows.reason, jnp.full((n,), FINISH_LENGTH, jnp.int32)))
    return rows, RowSettings(*[put(a, b) for a, b in zip(settings, new)])


@functools.partial(jax.jit, static_argnames=("level",))
def regroup_program(rows: RowState, settings: RowSettings, take_S, level: int):
    """Slots `take_S` of these (in that order), the cache resized to `level` slots."""
    rows = jax.tree.map(lambda x: x[take_S], rows)
    return rows._replace(cache=resize_cache(rows.cache, level)), jax.tree.map(lambda x: x[take_S], settings)


class SlotDecoder:
    """Host driver of the three programs for one call's rows. `mesh`: slots are split over its batch axes."""

    def __init__(self, graphdef, *, slots: int, first_level: int, pad_id: int, mesh=None, min_slots: int = 1):
        if slots < 1:
            raise ValueError(f"decode slots must be >= 1, got {slots}")
        self.graphdef, self.slots, self.first_level = graphdef, bucket(slots), first_level
        self.pad_id, self.mesh, self.min_slots = pad_id, mesh, max(1, min_slots)

    def _put(self, x):
        x = np.asarray(x)
        return jnp.asarray(x) if self.mesh is None else hosts.put(x, row_sharding(self.mesh, x.shape[0], x.ndim))

    def _empty(self, state, s: int, buffer: int, level: int, key_shape):
        """S idle slots (done, nothing to harvest), made on the devices (row-sharded on a mesh)."""
        model = nnx.merge(self.graphdef, state)
        cfg = model.cfg
        shape = (s, buffer, level, cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, cfg.vocab_size,
                 str(cache_dtype(model.embed[...].dtype)), tuple(key_shape))
        return _empty_program(shape, self.mesh)()

    def __call__(self, state, contexts: Sequence[tuple[int, ...]], settings: RowSettings, *, prefill_len: int,
                 buffer: int, stop_ids, share_prefill: bool = True, min_unique: int = 1, min_rows: int = 0):
        """Decode N rows (contexts, and their settings as host arrays of N rows) in a buffer of `buffer` slots with
        contexts prefilled in `prefill_len`. Returns (tokens [N, L], logp, ent, count [N], reason [N], stats).
        `min_rows`: start with the slots of a call of that many rows (calls of varying size, such as HeRL's
        revisions, then visit the programs the step's call compiled; idle slots are compacted away at once)."""
        n = len(contexts)
        s = min(self.slots, bucket(max(n, min_rows)))
        levels = decode_levels(prefill_len, buffer, self.first_level)
        level = levels[0]
        ctx_len = np.array([len(c) for c in contexts], np.int32)
        out_tokens = np.full((n, buffer), self.pad_id, np.int32)
        for i, c in enumerate(contexts):
            out_tokens[i, :len(c)] = c
        out_logp, out_ent = np.zeros((n, buffer), np.float32), np.zeros((n, buffer), np.float32)
        out_count, out_reason = np.zeros((n,), np.int32), np.full((n,), FINISH_LENGTH, np.int32)
        stops = jnp.asarray(np.array(tuple(stop_ids) or (-1,), np.int32))
        stats = SlotStats()

        host = settings
        rows, settings = self._empty(state, s, buffer, level, host.keys.shape[1:])
        slot_row = np.full((s,), -1)  # which row each slot holds (-1: free)
        pos = np.zeros((s,), np.int32)
        waiting = deque(range(n))
        while True:
            free = np.flatnonzero(slot_row < 0)
            if waiting and free.size:  # refill: waiting rows, in order, into the lowest free slots
                take = [waiting.popleft() for _ in range(min(free.size, len(waiting)))]
                rows, settings = self._admit(state, rows, settings, free[:len(take)], take, contexts, out_tokens,
                                             ctx_len, host, prefill_len, share_prefill, min_unique)
                slot_row[free[:len(take)]] = take
                pos[free[:len(take)]] = ctx_len[take]
                stats.admits += 1
            live = np.flatnonzero(slot_row >= 0)
            if live.size == 0:
                break
            # with no row waiting, at most half the slots live: halve them (live rows first, in slot order)
            target_s = s
            while not waiting and target_s // 2 >= max(live.size, self.min_slots) and target_s > self.min_slots:
                target_s //= 2
            end = int(pos[live].max())  # the slot the furthest live row writes next
            want_level = next(lv for lv in levels if lv > end)
            if target_s != s or want_level != level:
                order = np.concatenate([live, np.flatnonzero(slot_row < 0)])[:target_s]
                rows, settings = regroup_program(rows, settings, self._put(order.astype(np.int32)), level=want_level)
                slot_row, pos, s, level = slot_row[order], pos[order], target_s, want_level
                stats.regroups += 1
                live = np.flatnonzero(slot_row >= 0)
            idle = s - live.size
            if waiting:
                target = idle + min(len(waiting), max(1, s // 4))
            elif s > self.min_slots:
                target = s - s // 2  # live <= s / 2: compact
            else:
                target = s + 1  # run until every slot is done or the level is full
            rows, steps = decode_program(self.graphdef, state, rows, settings, stops, jnp.int32(target))
            done, pos, count, reason, steps = map(np.array, tree_to_host((rows.done, rows.pos, rows.count,
                                                                         rows.reason, steps)))
            stats.decodes += 1
            stats.slot_steps += int(steps) * s
            finished = np.flatnonzero(done & (slot_row >= 0))
            if finished.size:
                tokens, logp, ent = tree_to_host((rows.tokens, rows.logp, rows.ent))
                for j in finished:
                    i = slot_row[j]
                    out_tokens[i], out_logp[i], out_ent[i] = tokens[j], logp[j], ent[j]
                    out_count[i], out_reason[i] = count[j], reason[j]
                    stats.live_steps += int(count[j])
                slot_row[finished] = -1
        return out_tokens, out_logp, out_ent, out_count, out_reason, stats

    def _admit(self, state, rows, settings, slots_free, take, contexts, out_tokens, ctx_len, host: RowSettings,
               prefill_len, share_prefill, min_unique):
        """Put rows `take` into slots `slots_free` (one admission of up to S rows, padded to S entries; `host`: every
        row's settings)."""
        s = rows.pos.shape[0]
        pad = s - len(take)
        source, unique = distinct_contexts([contexts[i] for i in take], share_prefill)
        unique_tokens, unique_len = prefill_table(unique, min(bucket(len(unique), max(1, min_unique)), s),
                                                  prefill_len, self.pad_id)
        idx = np.array(take + [take[0]] * pad)
        slot = np.concatenate([slots_free, np.full((pad,), s)]).astype(np.int32)  # s: past the last slot, dropped
        new = RowSettings(*[self._put(np.asarray(x)[idx]) for x in host])
        return admit_program(self.graphdef, state, rows, settings, self._put(slot), self._put(out_tokens[idx]),
                             self._put(ctx_len[idx]), new, self._put(unique_tokens), self._put(unique_len),
                             self._put(np.array(source + [0] * pad, np.int32)))


@functools.lru_cache(maxsize=64)
def _empty_program(shape, mesh):
    """A jitted maker of idle slots of `shape` (see SlotDecoder._empty), row-sharded over `mesh` when given."""
    s, buffer, level, layers, kv, head_dim, vocab, dtype, key_shape = shape

    def make():
        zeros_SL = jnp.zeros((s, buffer), jnp.float32)
        cache = KVCache([jnp.zeros((s, kv, head_dim, level), dtype) for _ in range(layers)],
                        [jnp.zeros((s, kv, level, head_dim), dtype) for _ in range(layers)])
        rows = RowState(jnp.zeros((s, buffer), jnp.int32), zeros_SL, zeros_SL, cache,
                        jnp.zeros((s, vocab), jnp.float32),
                        jnp.zeros((s,), jnp.int32), jnp.zeros((s,), jnp.int32), jnp.ones((s,), bool),
                        jnp.full((s,), FINISH_LENGTH, jnp.int32))
        settings = RowSettings(jnp.zeros((s,), jnp.int32), jnp.zeros((s,), jnp.float32), jnp.ones((s,), jnp.float32),
                               jnp.zeros((s,), jnp.int32), jnp.zeros((s,) + key_shape, jnp.uint32))
        return rows, settings

    shardings = None if mesh is None else jax.tree.map(lambda a: row_sharding(mesh, a.shape[0], a.ndim),
                                                       jax.eval_shape(make))
    return jax.jit(make, out_shardings=shardings)
