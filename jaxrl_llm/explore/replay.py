"""RRL replay array (ALGORITHMS.md §3): a fixed-capacity buffer of prefix states (prompt id, prefix
tokens) with Monte Carlo values, as one pytree with a leading capacity axis C, and the pure functions
that insert, sample, update, demote and drop its states. `jitted` compiles them once each, the
array donated; `state_shardings` lays the C axis over the mesh's batch axes.

Rules (rewards assumed in [0, 1]: RRL stores each row's Rollouts.success, in [0, 1] whatever reward
functions add to the total; visit counts whole numbers):

value     v_i = (prior_i + value_sum_i) / (1 + visits_i): the Monte Carlo mean of the continuations,
          with the prior (the reward of the response the prefix was cut from) as one pseudo-observation.
priority  p_i = s_i + c_ucb * sqrt(ln max(N, 1) / (1 + visits_i)) - DEMOTION * demoted_i, where N is
          the sum of visits over the occupied slots; empty slots -inf. The score s_i is set by `rule`:
          "value": s_i = v_i (ALGORITHMS.md §3: the most promising states);
          "uncertainty": s_i = 4 q_i (1 - q_i), q_i = (prior_i + value_sum_i + 1/2) / (visits_i + 2), the
          variance of a continuation's success under the state's estimate (scaled to [0, 1]), its mean
          shrunk toward 1/2 by one half-observation so that a single prior of 0 or 1 does not mark a state
          certain. A group-relative estimator learns only from groups whose rewards differ: a state whose
          continuations all succeed (value ~1, what "value" favours) gives its group zero advantage.
insert    candidates that are invalid, have a length outside 1..T, or exactly repeat (same prompt,
          length and tokens) a stored state or an earlier candidate of the call are skipped; the
          others get the priority of a state with that prior and no visits (N before the call).
          Candidates in decreasing priority (ties: lower index first) are paired with slots in
          increasing priority (empty slots first at -inf; ties: lower slot first); each candidate
          takes its slot when its priority is strictly higher. This equals inserting the candidates
          one by one, highest first, each replacing the current lowest slot if it beats it.
sample    k distinct slots, the top k of p_i / temperature + Gumbel noise (sampling without
          replacement proportional to softmax(p / temperature), Plackett-Luce), or the top k of p_i
          (ties: lower slot first) when temperature <= 0; empty slots only when fewer than k are
          occupied, and those come back with valid False.
backtrack with mean m_i = value_sum_i / visits_i over slots with at least `min_visits` visits: a
          longer state L is demoted when a state S of the same prompt whose tokens are a proper
          prefix of L's has m_S > m_L + margin, for every such pair with S or L among the slots
          just updated. Demotion is sticky until the slot is emptied or overwritten. Called after
          every `update_values` with the same slots, this demotes exactly what checking all pairs
          after every update would, since a pair's outcome changes only when one of its values does.

Duplicates are found through a 64-bit fingerprint of (prompt, length, tokens) and confirmed by
comparing tokens (past the length, tokens are ignored and stored as zeros), so no distinct state is
ever taken for a duplicate; a duplicate is missed only on a 64-bit fingerprint collision. Slot
indices returned by `sample` stay meaningful until the next `insert`, `drop_prompts` or
`drop_older`: call `update_values` and `backtrack` before those. `drop_older` empties states whose
prefix came from a policy version below a bound (stale states).
Costs: insert O(K C + K^2 + C log C), sample O(C log C), backtrack O(k C T), the rest O(C).
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
from flax import struct
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxrl_llm.parallel.rules import row_sharding

DEMOTION = 1.0  # priority penalty of a demoted state: one full reward unit
_SEEDS = (0x9E3779B9, 0x7F4A7C15)  # one per 32-bit half of the fingerprint


@struct.dataclass
class ReplayState:
    tokens: jax.Array  # [C, T] int32, zero past the length
    length: jax.Array  # [C] int32, 0 = empty slot
    prompt: jax.Array  # [C] int32 training-set item id
    value_sum: jax.Array  # [C] float32 sum of continuation rewards (their Rollouts.success)
    visits: jax.Array  # [C] float32 number of continuations
    prior: jax.Array  # [C] float32 reward of the response the prefix was cut from
    inserted_at: jax.Array  # [C] int32 step
    version: jax.Array  # [C] int32 policy version that produced the prefix
    demoted: jax.Array  # [C] bool, set by backtracking
    fingerprint: jax.Array  # [C, 2] uint32 hash of (prompt, length, tokens), for duplicate search
    inserts: jax.Array  # () int32 states inserted so far
    evictions: jax.Array  # () int32 occupied slots overwritten by inserts so far
    drops: jax.Array  # () int32 states removed because their prompt was solved (Rollouts.correct)

    @property
    def capacity(self) -> int:
        return self.tokens.shape[0]

    @property
    def max_prefix_tokens(self) -> int:
        return self.tokens.shape[1]


def empty(capacity: int, max_prefix_tokens: int) -> ReplayState:
    def zeros(dtype, *shape):  # a buffer per field: donation needs every leaf distinct
        return jnp.zeros((capacity,) + shape, dtype)

    return ReplayState(tokens=zeros(jnp.int32, max_prefix_tokens), length=zeros(jnp.int32), prompt=zeros(jnp.int32),
                       value_sum=zeros(jnp.float32), visits=zeros(jnp.float32), prior=zeros(jnp.float32),
                       inserted_at=zeros(jnp.int32), version=zeros(jnp.int32), demoted=zeros(bool),
                       fingerprint=zeros(jnp.uint32, 2), inserts=jnp.zeros((), jnp.int32),
                       evictions=jnp.zeros((), jnp.int32), drops=jnp.zeros((), jnp.int32))


def state_shardings(mesh: Mesh, capacity: int) -> ReplayState:
    """NamedShardings of a ReplayState: the C axis over the mesh axes of the `batch` rule, counters whole."""
    rows, rows2 = row_sharding(mesh, capacity, 1), row_sharding(mesh, capacity, 2)
    whole = NamedSharding(mesh, PartitionSpec())
    return ReplayState(tokens=rows2, length=rows, prompt=rows, value_sum=rows, visits=rows, prior=rows,
                       inserted_at=rows, version=rows, demoted=rows, fingerprint=rows2, inserts=whole,
                       evictions=whole, drops=whole)


def _total_visits(state: ReplayState):
    return jnp.sum(jnp.where(state.length > 0, state.visits, 0.0))


def _bonus(total, visits, c_ucb):
    return c_ucb * jnp.sqrt(jnp.log(jnp.maximum(total, 1.0)) / (1.0 + visits))


def value(state: ReplayState) -> jax.Array:
    """[C] Monte Carlo value of every slot, the prior counted as one observation (module docstring)."""
    return (state.prior + state.value_sum) / (1.0 + state.visits)


RULES = ("uncertainty", "value")


def score(prior, value_sum, visits, rule: str):
    """The score s of states (module docstring) under `rule`, elementwise."""
    if rule == "value":
        return (prior + value_sum) / (1.0 + visits)
    if rule == "uncertainty":
        q = (prior + value_sum + 0.5) / (visits + 2.0)
        return 4.0 * q * (1.0 - q)
    raise ValueError(f"replay priority rule {rule!r}: choose from {RULES}")


def priority(state: ReplayState, c_ucb, rule: str = "value") -> jax.Array:
    """[C] float32 priority of every slot (module docstring); + 0.0 turns -0.0 into 0.0 for top_k."""
    p = score(state.prior, state.value_sum, state.visits, rule) + _bonus(_total_visits(state), state.visits, c_ucb) \
        - DEMOTION * state.demoted
    return jnp.where(state.length > 0, p + 0.0, -jnp.inf).astype(jnp.float32)


def _fmix(x):
    """murmur3's 32-bit finaliser."""
    x = x ^ (x >> 16)
    x = x * jnp.uint32(0x85EBCA6B)
    x = x ^ (x >> 13)
    x = x * jnp.uint32(0xC2B2AE35)
    return x ^ (x >> 16)


def fingerprint(tokens_KxT, length_K, prompt_K):
    """[K, 2] uint32: a sum of position-keyed token hashes (wrapping, so order-free and exact), mixed
    with the prompt and length."""
    pos = jnp.arange(tokens_KxT.shape[1], dtype=jnp.uint32)
    live = pos[None, :] < length_K[:, None].astype(jnp.uint32)
    halves = []
    for seed in _SEEDS:
        per_token = _fmix(tokens_KxT.astype(jnp.uint32) * jnp.uint32(0x01000193) + _fmix(pos + jnp.uint32(seed)))
        h = jnp.sum(jnp.where(live, per_token, jnp.uint32(0)), axis=1, dtype=jnp.uint32)
        head = _fmix(prompt_K.astype(jnp.uint32) ^ jnp.uint32(seed)) + length_K.astype(jnp.uint32) * jnp.uint32(
            0x27D4EB2F)
        halves.append(_fmix(h ^ _fmix(head)))
    return jnp.stack(halves, axis=1)


def _same_state(tokens_a, length_a, prompt_a, tokens_b, length_b, prompt_b):
    """[K] exact equality of canonical states (tokens zero past the length)."""
    return (prompt_a == prompt_b) & (length_a == length_b) & jnp.all(tokens_a == tokens_b, axis=1)


def _first_match(match_KxM):
    """(any match [K], index of the first match [K])."""
    return jnp.any(match_KxM, axis=1), jnp.argmax(match_KxM, axis=1)


def insert(state: ReplayState, tokens_KxT, length_K, prompt_K, prior_K, valid_K, step, version, c_ucb,
           rule: str = "value"):
    """Insert up to K candidate states (module docstring for the rule). Returns (state, stats) with
    stats {inserted, evicted, duplicates} int32 scalars."""
    capacity, max_tokens = state.tokens.shape
    num = tokens_KxT.shape[0]
    length = length_K.astype(jnp.int32)
    prompt = prompt_K.astype(jnp.int32)
    valid = valid_K.astype(bool) & (length >= 1) & (length <= max_tokens)
    tokens = jnp.where(jnp.arange(max_tokens)[None, :] < length[:, None], tokens_KxT, 0).astype(jnp.int32)
    fp = fingerprint(tokens, length, prompt)

    stored = (state.length > 0)[None, :] & jnp.all(fp[:, None, :] == state.fingerprint[None, :, :], axis=2)
    hit, slot = _first_match(stored)
    dup_stored = hit & _same_state(tokens, length, prompt, state.tokens[slot], state.length[slot], state.prompt[slot])
    earlier = jnp.tril(jnp.ones((num, num), bool), -1) & valid[None, :]
    earlier &= jnp.all(fp[:, None, :] == fp[None, :, :], axis=2)
    hit, first = _first_match(earlier)
    dup_batch = hit & _same_state(tokens, length, prompt, tokens[first], length[first], prompt[first])
    duplicate = valid & (dup_stored | dup_batch)
    new = valid & ~duplicate

    pairs = min(num, capacity)
    total = _total_visits(state)
    cand_score = score(prior_K.astype(jnp.float32), 0.0, 0.0, rule)
    cand_priority = jnp.where(new, cand_score + _bonus(total, 0.0, c_ucb) + 0.0, -jnp.inf).astype(jnp.float32)
    cand_p, cand = jax.lax.top_k(cand_priority, pairs)
    neg_slot_p, slot = jax.lax.top_k(0.0 - priority(state, c_ucb, rule), pairs)  # lowest first, ties lower slot
    slot_p = -neg_slot_p
    take = cand_p > slot_p
    evicted = take & (slot_p > -jnp.inf)
    dest = jnp.where(take, slot, capacity)  # capacity: out of bounds, dropped

    def put(field, values):
        return field.at[dest].set(values, mode="drop")

    zeros = jnp.zeros((pairs,), jnp.float32)
    inserted, evicted = jnp.sum(take, dtype=jnp.int32), jnp.sum(evicted, dtype=jnp.int32)
    new_state = state.replace(
        tokens=put(state.tokens, tokens[cand]), length=put(state.length, length[cand]),
        prompt=put(state.prompt, prompt[cand]), value_sum=put(state.value_sum, zeros),
        visits=put(state.visits, zeros), prior=put(state.prior, prior_K.astype(jnp.float32)[cand]),
        inserted_at=put(state.inserted_at, jnp.full((pairs,), step, jnp.int32)),
        version=put(state.version, jnp.full((pairs,), version, jnp.int32)),
        demoted=put(state.demoted, jnp.zeros((pairs,), bool)), fingerprint=put(state.fingerprint, fp[cand]),
        inserts=state.inserts + inserted, evictions=state.evictions + evicted)
    return new_state, {"inserted": inserted, "evicted": evicted, "duplicates": jnp.sum(duplicate, dtype=jnp.int32)}


def sample(state: ReplayState, key, k: int, c_ucb, temperature, now=0, age_penalty=0.0, rule: str = "value"):
    """(indices [k] int32, valid [k] bool): k distinct slots by priority (module docstring), each
    priority lowered by age_penalty x (now - version): stale states are drawn less."""
    if k > state.capacity:
        raise ValueError(f"sample: k={k} exceeds the capacity {state.capacity}")
    age = jnp.maximum(jnp.asarray(now, jnp.int32) - state.version, 0).astype(jnp.float32)
    p = priority(state, c_ucb, rule) - jnp.asarray(age_penalty, jnp.float32) * age
    tau = jnp.asarray(temperature, jnp.float32)
    noisy = p / jnp.where(tau > 0, tau, 1.0) + jax.random.gumbel(key, p.shape, jnp.float32)
    score = jnp.where(p > -jnp.inf, jnp.where(tau > 0, noisy, p), -jnp.inf)
    top, idx = jax.lax.top_k(score, k)
    return idx.astype(jnp.int32), top > -jnp.inf


def update_values(state: ReplayState, idx_k, reward_sum_k, count_k, valid_k) -> ReplayState:
    """Add continuation reward sums and counts to the given slots (repeated slots add up); invalid
    rows and empty slots are ignored."""
    ok = valid_k.astype(bool) & (state.length[idx_k] > 0)
    dest = jnp.where(ok, idx_k, state.capacity)
    return state.replace(value_sum=state.value_sum.at[dest].add(reward_sum_k.astype(jnp.float32), mode="drop"),
                         visits=state.visits.at[dest].add(count_k.astype(jnp.float32), mode="drop"))


def backtrack(state: ReplayState, idx_k, valid_k, min_visits=1.0, margin=0.0):
    """Demote longer prefixes beaten by a shorter prefix of theirs, over the pairs that involve the
    slots `idx_k` (module docstring). Returns (state, {"demoted": newly demoted count})."""
    capacity, max_tokens = state.tokens.shape
    seen = (state.length > 0) & (state.visits >= jnp.maximum(min_visits, 1.0))
    mean = state.value_sum / jnp.maximum(state.visits, 1.0)
    u = jnp.where(valid_k, idx_k, 0)
    used = valid_k.astype(bool) & seen[u]
    pair = used[:, None] & seen[None, :] & (state.prompt[u][:, None] == state.prompt[None, :])
    pair &= u[:, None] != jnp.arange(capacity)[None, :]
    len_u, len_c = state.length[u][:, None], state.length[None, :]
    shorter = jnp.minimum(len_u, len_c)[:, :, None]
    agree = (state.tokens[u][:, None, :] == state.tokens[None, :, :]) | (jnp.arange(max_tokens) >= shorter)
    pair &= jnp.all(agree, axis=2)  # [k, C]: one state is a prefix of the other
    mean_u = mean[u][:, None]
    demote_u = jnp.any(pair & (len_c < len_u) & (mean[None, :] > mean_u + margin), axis=1)
    demote_c = jnp.any(pair & (len_u < len_c) & (mean_u > mean[None, :] + margin), axis=0)
    demoted = (state.demoted | demote_c).at[jnp.where(demote_u, u, capacity)].set(True, mode="drop")
    return state.replace(demoted=demoted), {"demoted": jnp.sum(demoted & ~state.demoted, dtype=jnp.int32)}


def _clear(state: ReplayState, gone_C) -> ReplayState:
    def wipe(field):
        return jnp.where(gone_C.reshape(gone_C.shape + (1,) * (field.ndim - 1)), jnp.zeros((), field.dtype), field)

    return state.replace(tokens=wipe(state.tokens), length=wipe(state.length), prompt=wipe(state.prompt),
                         value_sum=wipe(state.value_sum), visits=wipe(state.visits), prior=wipe(state.prior),
                         inserted_at=wipe(state.inserted_at), version=wipe(state.version),
                         demoted=wipe(state.demoted), fingerprint=wipe(state.fingerprint))


def drop_prompts(state: ReplayState, solved_P) -> ReplayState:
    """Empty the slots whose prompt is marked solved in `solved_P` [num_items] bool."""
    gone = (state.length > 0) & solved_P[state.prompt]
    return _clear(state, gone).replace(drops=state.drops + jnp.sum(gone, dtype=jnp.int32))


def drop_older(state: ReplayState, oldest_version) -> ReplayState:
    """Empty the slots whose prefix came from a policy version below `oldest_version` (stale states);
    counted with the drops."""
    gone = (state.length > 0) & (state.version < oldest_version)
    return _clear(state, gone).replace(drops=state.drops + jnp.sum(gone, dtype=jnp.int32))


class Jitted(NamedTuple):
    insert: Callable
    sample: Callable
    update_values: Callable
    backtrack: Callable
    drop_prompts: Callable
    drop_older: Callable


def jitted(shardings: ReplayState | None = None) -> Jitted:
    """The functions above, jitted once each with the state donated; given `state_shardings(...)`,
    the returned state keeps that layout and everything else comes back whole."""
    whole = None if shardings is None else NamedSharding(shardings.length.mesh, PartitionSpec())

    def jit(fn, out, **kw):
        return jax.jit(fn, **kw) if shardings is None else jax.jit(fn, out_shardings=out, **kw)

    return Jitted(insert=jit(insert, (shardings, whole), donate_argnums=0, static_argnames="rule"),
                  sample=jit(sample, whole, static_argnames=("k", "rule")),
                  update_values=jit(update_values, shardings, donate_argnums=0),
                  backtrack=jit(backtrack, (shardings, whole), donate_argnums=0),
                  drop_prompts=jit(drop_prompts, shardings, donate_argnums=0),
                  drop_older=jit(drop_older, shardings, donate_argnums=0))
