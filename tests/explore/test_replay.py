"""RRL replay array (ALGORITHMS.md §3): insert / update / drop / backtrack / greedy sample against a
brute-force Python buffer on random operation sequences (full array, evictions, duplicates), the
Gumbel sampler against the Plackett-Luce distribution, hand-built backtracking cases, one compile
per function, donation, and the array on 8 fake devices equal bit for bit to one device."""

import itertools
import math

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec

from jaxrl_llm.explore import replay
from jaxrl_llm.parallel.mesh import make_mesh

C, T, K, KS, P = 16, 6, 6, 4, 5  # capacity, prefix tokens, insert batch, sample/update batch, prompts
FIELDS = ("tokens", "length", "prompt", "value_sum", "visits", "prior", "inserted_at", "version", "demoted",
          "fingerprint", "inserts", "evictions", "drops")
OPS = replay.jitted()
# the oracle-side calls jitted too: every eager op on a new shape compiles a program of its own
PRIORITY = jax.jit(replay.priority, static_argnames="rule")
SCORE = jax.jit(replay.score, static_argnames="rule")


def snapshot(state):
    return {f: np.array(getattr(state, f)) for f in FIELDS}


class Reference:
    """The rules of replay.py read literally: a list of slots, candidates inserted one at a time."""

    def __init__(self, capacity, rule="value"):
        self.slots = [None] * capacity
        self.inserts = self.evictions = self.drops = 0
        self.rule = rule

    def score(self, prior, value_sum, visits):
        if self.rule == "value":
            return (prior + value_sum) / (1 + visits)
        q = (prior + value_sum + 0.5) / (visits + 2)  # "uncertainty": a continuation's success variance, x 4
        return 4 * q * (1 - q)

    def total(self):
        return sum(s["visits"] for s in self.slots if s)

    def priority(self, i, c_ucb):
        s = self.slots[i]
        if s is None:
            return -math.inf
        n = max(self.total(), 1.0)
        return self.score(s["prior"], s["value_sum"], s["visits"]) + c_ucb * math.sqrt(math.log(n) / (1 + s["visits"])) - replay.DEMOTION * s["demoted"]

    def insert(self, tokens, length, prompt, prior, valid, step, version, c_ucb):
        current = [self.priority(i, c_ucb) for i in range(len(self.slots))]
        bonus = c_ucb * math.sqrt(math.log(max(self.total(), 1.0)))
        seen = {(s["prompt"], s["tokens"]) for s in self.slots if s}
        fresh, duplicates = [], 0
        for j in range(len(length)):
            if not valid[j] or not 1 <= length[j] <= T:
                continue
            key = (int(prompt[j]), tuple(int(t) for t in tokens[j, :length[j]]))
            if key in seen:
                duplicates += 1
                continue
            seen.add(key)
            fresh.append((self.score(float(prior[j]), 0.0, 0.0) + bonus, j, key))
        inserted = evicted = 0
        for p, j, (pid, toks) in sorted(fresh, key=lambda x: (-x[0], x[1])):
            low = min(range(len(self.slots)), key=lambda i: (current[i], i))
            if p > current[low]:
                evicted += self.slots[low] is not None
                inserted += 1
                self.slots[low] = dict(prompt=pid, tokens=toks, prior=float(prior[j]), value_sum=0.0, visits=0.0,
                                       inserted_at=step, version=version, demoted=False)
                current[low] = p
        self.inserts += inserted
        self.evictions += evicted
        return {"inserted": inserted, "evicted": evicted, "duplicates": duplicates}

    def update(self, idx, reward_sum, count, valid):
        for i, r, n, v in zip(idx, reward_sum, count, valid):
            if v and self.slots[i]:
                self.slots[i]["value_sum"] += float(r)
                self.slots[i]["visits"] += float(n)

    def backtrack(self, idx, valid, min_visits, margin):
        touched = {int(i) for i, v in zip(idx, valid) if v}

        def seen(s):
            return s is not None and s["visits"] >= max(min_visits, 1.0)

        def mean(s):  # float32 like the array, so that equal-in-reals comparisons round alike
            return np.float32(s["value_sum"]) / np.float32(s["visits"])

        demote = set()
        for a, b in itertools.permutations(range(len(self.slots)), 2):
            short, long = self.slots[a], self.slots[b]
            if not (seen(short) and seen(long)) or (a not in touched and b not in touched):
                continue
            n = len(short["tokens"])
            if short["prompt"] == long["prompt"] and n < len(long["tokens"]) and long["tokens"][:n] == short["tokens"]:
                if mean(short) > mean(long) + np.float32(margin):
                    demote.add(b)
        newly = sum(not self.slots[b]["demoted"] for b in demote)
        for b in demote:
            self.slots[b]["demoted"] = True
        return {"demoted": newly}

    def drop(self, solved):
        for i, s in enumerate(self.slots):
            if s and solved[s["prompt"]]:
                self.slots[i] = None
                self.drops += 1

    def greedy(self, k, c_ucb):
        occupied = [i for i, s in enumerate(self.slots) if s]
        return sorted(occupied, key=lambda i: (-self.priority(i, c_ucb), i))[:k]

    def check(self, snap):
        for i, s in enumerate(self.slots):
            if s is None:  # empty slots hold zeros only
                assert not any(snap[f][i].any() for f in FIELDS[:10]), i
                continue
            n = len(s["tokens"])
            assert snap["length"][i] == n and snap["prompt"][i] == s["prompt"], i
            assert tuple(snap["tokens"][i, :n]) == s["tokens"] and not snap["tokens"][i, n:].any(), i
            got = (snap["prior"][i], snap["value_sum"][i], snap["visits"][i], snap["inserted_at"][i],
                   snap["version"][i], snap["demoted"][i])
            assert got == (s["prior"], s["value_sum"], s["visits"], s["inserted_at"], s["version"], s["demoted"]), i
        assert (snap["inserts"], snap["evictions"], snap["drops"]) == (self.inserts, self.evictions, self.drops)


def random_candidates(rng, snap):
    """K candidates: copies of stored states and of earlier candidates (garbage past the length differs),
    prefixes and extensions of stored states, fresh states, a few invalid ones."""
    occupied = np.flatnonzero(snap["length"] > 0)
    tokens = np.zeros((K, T), np.int32)
    length = np.zeros(K, np.int32)
    prompt = np.zeros(K, np.int32)
    for j in range(K):
        r = rng.rand()
        if r < 0.25 and len(occupied):
            i = rng.choice(occupied)
            tokens[j], length[j], prompt[j] = snap["tokens"][i], snap["length"][i], snap["prompt"][i]
        elif r < 0.4 and j:
            i = rng.randint(j)
            tokens[j], length[j], prompt[j] = tokens[i], length[i], prompt[i]
        elif r < 0.7 and len(occupied):
            i = rng.choice(occupied)
            tokens[j], prompt[j] = snap["tokens"][i], snap["prompt"][i]
            length[j] = rng.randint(1, T + 1)
            tokens[j, snap["length"][i]:] = rng.randint(1, 4, T - snap["length"][i])
        else:
            tokens[j], length[j], prompt[j] = rng.randint(1, 4, T), rng.randint(1, T + 1), rng.randint(P)
        if rng.rand() < 0.05:
            length[j] = rng.choice([0, T + 1])
        n = min(max(length[j], 0), T)
        tokens[j, n:] = rng.randint(0, 9, T - n)
    prior = (rng.randint(9, size=K) / 8).astype(np.float32)
    return tokens, length, prompt, prior, rng.rand(K) < 0.85


def some_slots(rng, snap):
    occupied = np.flatnonzero(snap["length"] > 0)
    pool = occupied if len(occupied) and rng.rand() < 0.9 else np.arange(C)
    return rng.choice(pool, KS).astype(np.int32)


def random_op(rng, snap, step):
    """(name, args) of one operation; scalars as Python numbers of fixed type so nothing recompiles."""
    c_ucb = float(rng.choice([0.0, 0.5, 1.0]))
    kind = rng.choice(["insert"] * 3 + ["update"] * 4 + ["backtrack"] * 3 + ["drop", "sample"])
    if kind == "insert":
        return kind, random_candidates(rng, snap) + (step, step // 3, c_ucb)
    if kind == "update":
        count = rng.randint(0, 4, KS).astype(np.float32)
        reward = (np.array([rng.randint(4 * n + 1) for n in count]) / 4).astype(np.float32)
        return kind, (some_slots(rng, snap), reward, count, rng.rand(KS) < 0.8)
    if kind == "backtrack":
        return kind, (some_slots(rng, snap), rng.rand(KS) < 0.9, float(rng.choice([1.0, 2.0])),
                      float(rng.choice([0.0, 0.25])))
    if kind == "drop":
        return kind, (rng.rand(P) < 0.25,)
    return kind, (jax.random.key(step), KS, c_ucb, float(rng.choice([0.0, 0.0, 0.7])))


def apply(ops, state, kind, args, rule="value"):
    """(state, outputs as numpy) after one operation."""
    if kind == "insert":
        state, out = ops.insert(state, *args, rule=rule)
    elif kind == "update":
        state, out = ops.update_values(state, *args), {}
    elif kind == "backtrack":
        state, out = ops.backtrack(state, *args)
    elif kind == "drop":
        state, out = ops.drop_prompts(state, *args), {}
    else:
        idx, valid = ops.sample(state, *args, rule=rule)
        out = {"idx": idx, "valid": valid}
    return state, jax.tree.map(np.asarray, out)


@pytest.mark.parametrize("seed,rule", [(0, "value"), (1, "value"), (2, "value"), (0, "uncertainty"),
                                       (1, "uncertainty")])
def test_operations_match_reference(seed, rule):
    rng = np.random.RandomState(seed)
    state, ref = replay.empty(C, T), Reference(C, rule)
    totals = dict(evicted=0, duplicates=0, full=0, demoted=0, dropped=0)
    for step in range(80):
        snap = snapshot(state)
        kind, args = random_op(rng, snap, step)
        state, out = apply(OPS, state, kind, args, rule)
        if kind == "insert":
            assert {k: int(v) for k, v in out.items()} == ref.insert(*args)
            totals["evicted"] += out["evicted"]
            totals["duplicates"] += out["duplicates"]
        elif kind == "update":
            ref.update(*args)
        elif kind == "backtrack":
            assert int(out["demoted"]) == ref.backtrack(*args)["demoted"]
            totals["demoted"] += out["demoted"]
        elif kind == "drop":
            before = ref.drops
            ref.drop(*args)
            totals["dropped"] += ref.drops - before
        else:
            _, k, c_ucb, temperature = args
            occupied = [i for i, s in enumerate(ref.slots) if s]
            n = min(k, len(occupied))
            assert out["valid"].tolist() == [True] * n + [False] * (k - n)
            assert len(set(out["idx"].tolist())) == k
            if temperature == 0:
                assert out["idx"][:n].tolist() == ref.greedy(k, c_ucb)
            else:
                assert set(out["idx"][:n].tolist()) <= set(occupied)
        ref.check(snapshot(state))
        totals["full"] += all(ref.slots)
    # the sequence exercised what it is meant to
    assert all(totals[k] > 0 for k in totals), totals


def test_insert_more_candidates_than_capacity():
    state, ref = replay.empty(4, T), Reference(4)
    rng = np.random.RandomState(5)
    for step in range(6):
        args = random_candidates(rng, snapshot(state)) + (step, 0, 0.5)
        state, out = OPS.insert(state, *args)
        assert {k: int(v) for k, v in out.items()} == ref.insert(*args)
        ref.check(snapshot(state))


def test_priority_after_updates_equals_formula():
    state = replay.empty(C, T)
    tokens = np.tile(np.arange(1, T + 1, dtype=np.int32), (K, 1))
    prior = np.array([1.0, 0.75, 0.5, 0.25, 0.125, 0.0], np.float32)  # decreasing: candidate j -> slot j
    state, _ = OPS.insert(state, tokens, np.arange(1, K + 1), np.zeros(K, np.int32), prior, np.ones(K, bool),
                             0, 0, 0.0)
    idx = np.array([0, 1, 1, 3, 7, 2], np.int32)  # slot 1 twice, slot 7 empty
    reward = np.array([1.0, 0.5, 1.5, 0.0, 1.0, 2.0], np.float32)
    count = np.array([2.0, 1.0, 3.0, 4.0, 1.0, 2.0], np.float32)
    valid = np.array([1, 1, 1, 1, 1, 0], bool)
    state = OPS.update_values(state, idx, reward, count, valid)
    value_sum = np.array([1.0, 2.0, 0.0, 0.0, 0.0, 0.0])
    visits = np.array([2.0, 4.0, 0.0, 4.0, 0.0, 0.0])
    np.testing.assert_array_equal(np.asarray(state.value_sum)[:K], value_sum)
    np.testing.assert_array_equal(np.asarray(state.visits)[:K], visits)
    state = state.replace(demoted=state.demoted.at[4].set(True))
    for c_ucb in (0.0, 0.7):
        n = visits.sum()
        want = (prior + value_sum) / (1 + visits) + c_ucb * np.sqrt(np.log(n) / (1 + visits)) - np.eye(K)[4]
        got = np.asarray(PRIORITY(state, c_ucb))
        np.testing.assert_allclose(got[:K], want, rtol=1e-6, atol=1e-7)
        assert np.all(got[K:] == -np.inf)
    assert np.asarray(PRIORITY(replay.empty(4, T), 1.0)).tolist() == [-np.inf] * 4


def built(states):
    """A buffer holding `states` [(prompt, tokens, value_sum, visits)] in slots 0, 1, ... in order."""
    n = len(states)
    tokens = np.zeros((n, T), np.int32)
    for j, (_, toks, _, _) in enumerate(states):
        tokens[j, :len(toks)] = toks
    state, out = OPS.insert(replay.empty(C, T), tokens, np.array([len(s[1]) for s in states]),
                               np.array([s[0] for s in states]), np.zeros(n, np.float32), np.ones(n, bool), 0, 0, 0.0)
    assert int(out["inserted"]) == n
    return OPS.update_values(state, np.arange(n), np.array([s[2] for s in states], np.float32),
                                np.array([s[3] for s in states], np.float32), np.ones(n, bool))


BACKTRACK_CASE = [  # (prompt, tokens, value_sum, visits): means .75, .25, 1, 0, 0, -, .5, .5
    (0, [1, 2], 3.0, 4.0),
    (0, [1, 2, 3, 4], 1.0, 4.0),  # beaten by its prefixes [1, 2] and [1]
    (0, [1, 2, 5], 2.0, 2.0),  # better than its prefixes
    (1, [1, 2, 3, 4], 0.0, 2.0),  # same tokens as slot 1, other prompt: no prefix of it is stored
    (0, [1, 3, 3], 0.0, 2.0),  # beaten by [1] only; [1, 2] is no prefix of it
    (0, [1, 2, 3], 0.0, 0.0),  # never continued: neither demoted nor demoting
    (0, [1], 1.0, 2.0),
    (0, [1, 2, 3, 4, 5], 1.0, 2.0),  # beaten by [1, 2]; ties [1] (strict >); beats [1, 2, 3, 4]
]


@pytest.mark.parametrize("idx, valid, min_visits, margin, want", [
    (range(8), [1] * 8, 1.0, 0.0, {1, 4, 7}),
    ([0], [1], 1.0, 0.0, {1, 7}),  # pairs with slot 0 as the shorter or the longer one
    ([4], [1], 1.0, 0.0, {4}),
    ([1], [1], 1.0, 0.0, {1}),  # as the longer one: [1, 2] and [1] beat it
    ([7], [1], 1.0, 0.0, {7}),
    ([3, 5], [1, 1], 1.0, 0.0, set()),
    ([0], [0], 1.0, 0.0, set()),  # invalid rows touch nothing
    (range(8), [1] * 8, 1.0, 0.25, {1, 4}),  # .75 > .25 + .25 and .5 > 0 + .25; .75 > .5 + .25 fails
    (range(8), [1] * 8, 3.0, 0.0, {1}),  # only slots 0 and 1 have 3 visits
])
def test_backtrack_hand_built(idx, valid, min_visits, margin, want):
    state = built(BACKTRACK_CASE)
    state, out = OPS.backtrack(state, np.array(list(idx), np.int32), np.array(valid, bool), min_visits, margin)
    assert set(np.flatnonzero(np.asarray(state.demoted)).tolist()) == want
    assert int(out["demoted"]) == len(want)


def test_backtrack_is_sticky_and_penalised():
    state = built(BACKTRACK_CASE)
    before = np.asarray(PRIORITY(state, 0.5))
    state, _ = OPS.backtrack(state, np.arange(8, dtype=np.int32), np.ones(8, bool), 1.0, 0.0)
    after = np.asarray(PRIORITY(state, 0.5))
    np.testing.assert_allclose(before[:8] - after[:8], [0, 1, 0, 0, 1, 0, 0, 1], atol=1e-6)
    state = OPS.update_values(state, np.array([1], np.int32), np.array([40.0], np.float32),
                                 np.array([40.0], np.float32), np.ones(1, bool))  # slot 1 now beats [1, 2]
    state, out = OPS.backtrack(state, np.arange(8, dtype=np.int32), np.ones(8, bool), 1.0, 0.0)
    assert np.flatnonzero(np.asarray(state.demoted)).tolist() == [1, 4, 7] and int(out["demoted"]) == 0


def test_drop_prompts_empties_exactly_those_slots():
    rng = np.random.RandomState(3)
    state = replay.empty(C, T)
    for step in range(4):
        state, _ = OPS.insert(state, *random_candidates(rng, snapshot(state)), step, 1, 0.5)
    state = OPS.update_values(state, np.arange(C, dtype=np.int32), np.ones(C, np.float32),
                                 np.full(C, 2.0, np.float32), np.ones(C, bool))
    before = snapshot(state)
    solved = np.array([False, True, False, True, False])
    after = snapshot(OPS.drop_prompts(state, solved))
    gone = (before["length"] > 0) & solved[before["prompt"]]
    assert gone.any() and ((before["length"] > 0) & ~gone).any()
    for f in FIELDS[:10]:
        np.testing.assert_array_equal(after[f][~gone], before[f][~gone], err_msg=f)
        assert not after[f][gone].any(), f
    assert after["drops"] == gone.sum() and after["inserts"] == before["inserts"]


def sampling_state():
    """Slots 0, 1, 3, 5, 6 of eight occupied, priors .9 .7 .5 .3 .2 (candidates fill empty slots in
    decreasing prior; then three prompts are solved)."""
    prior = np.array([0.1, 0.9, 0.5, 0.3, 0.7, 0.2, 0.4, 0.6], np.float32)
    state, _ = OPS.insert(replay.empty(8, T), np.ones((8, T), np.int32), np.full(8, 2), np.arange(8), prior,
                             np.ones(8, bool), 0, 0, 0.0)
    return OPS.drop_prompts(state, np.isin(np.arange(8), [0, 6, 7]))


def test_gumbel_sampling_is_plackett_luce():
    state = sampling_state()
    c_ucb, tau, draws = 0.0, 0.25, 40000
    p = np.asarray(PRIORITY(state, c_ucb)).astype(np.float64)
    occupied = np.flatnonzero(np.isfinite(p))
    w = np.exp(p[occupied] / tau)
    w /= w.sum()
    keys = jax.random.split(jax.random.key(11), draws)
    idx, valid = jax.jit(jax.vmap(lambda key: replay.sample(state, key, 2, c_ucb, tau)))(keys)
    idx, valid = np.asarray(idx), np.asarray(valid)
    assert valid.all() and (idx[:, 0] != idx[:, 1]).all()
    for (a, i), (b, j) in itertools.permutations(list(enumerate(occupied)), 2):
        want = w[a] * w[b] / (1 - w[a])
        got = np.mean((idx[:, 0] == i) & (idx[:, 1] == j))
        assert abs(got - want) <= 5 * math.sqrt(want * (1 - want) / draws) + 1e-4, (i, j, got, want)


def test_sample_fewer_occupied_than_k():
    state = sampling_state()
    greedy = jax.jit(replay.sample, static_argnames="k")
    idx, valid = greedy(state, jax.random.key(0), 8, 0.0, 0.0)
    assert np.asarray(valid).tolist() == [True] * 5 + [False] * 3
    assert np.asarray(idx)[:5].tolist() == [0, 1, 3, 5, 6]
    idx, valid = greedy(state, jax.random.key(1), 8, 0.0, 1.0)
    assert sorted(np.asarray(idx)[:5].tolist()) == [0, 1, 3, 5, 6] and np.asarray(valid).sum() == 5


def test_each_function_compiles_once_and_donates():
    ops = replay.jitted()
    rng = np.random.RandomState(7)
    state = replay.empty(C, T)
    compiled = None
    for step in range(4):
        old = state
        state, _ = ops.insert(state, *random_candidates(rng, snapshot(state)), step, step, 0.5 * step)
        assert old.tokens.is_deleted() and old.demoted.is_deleted()
        state = ops.update_values(state, some_slots(rng, snapshot(state)), np.ones(KS, np.float32),
                                  np.full(KS, step + 1.0, np.float32), np.ones(KS, bool))
        state, _ = ops.backtrack(state, some_slots(rng, snapshot(state)), np.ones(KS, bool), 1.0 + step, 0.1 * step)
        ops.sample(state, jax.random.key(step), KS, 0.3 * step, 0.5 * step)
        state = ops.drop_prompts(state, rng.rand(P) < 0.2)
        # jit caches are shared by every jit of the same function: count what the later calls add
        sizes = [f._cache_size() for f in ops]
        compiled = compiled or sizes
        assert sizes == compiled, step


@pytest.mark.slow
def test_sharded_equals_single_device():
    mesh = make_mesh({"data": 8})
    shardings = replay.state_shardings(mesh, C)
    assert shardings.tokens.spec[0] == "data" and shardings.inserts.spec == PartitionSpec()
    sharded_ops = replay.jitted(shardings)
    single, sharded = replay.empty(C, T), jax.device_put(replay.empty(C, T), shardings)
    rng = np.random.RandomState(4)
    for step in range(40):
        kind, args = random_op(rng, snapshot(single), step)
        single, out = apply(OPS, single, kind, args)
        sharded, out_sharded = apply(sharded_ops, sharded, kind, args)
        jax.tree.map(np.testing.assert_array_equal, out_sharded, out)
        a, b = snapshot(single), snapshot(sharded)
        for f in FIELDS:
            np.testing.assert_array_equal(b[f], a[f], err_msg=f"{kind} {f}")
    for f in FIELDS:
        got, want = getattr(sharded, f).sharding, getattr(shardings, f)
        assert got.is_equivalent_to(want, getattr(sharded, f).ndim), f
    assert snapshot(sharded)["inserts"] > C  # the array filled up and evicted


def test_drop_older_and_age_penalty():
    """Stale states: drop_older empties exactly the slots from policy versions below the bound; the
    age penalty lowers a state's draw score by age_penalty per step of age (greedy draws reorder)."""
    prior = np.array([0.9, 0.8, 0.7, 0.6], np.float32)
    state = replay.empty(8, T)
    for version, rows in ((1, [0, 1]), (5, [2, 3])):  # states 0, 1 from version 1; 2, 3 from version 5
        state, _ = OPS.insert(state, np.full((2, T), 1 + version, np.int32), np.array([1, 2]), np.array(rows),
                                 prior[rows], np.ones(2, bool), version, version, 0.0)
    before = snapshot(state)
    greedy = lambda s, **kw: np.asarray(OPS.sample(s, jax.random.key(0), 4, 0.0, 0.0, **kw)[0])  # noqa: E731
    order = lambda idx: before["prompt"][idx].tolist()  # noqa: E731
    assert order(greedy(state)) == [0, 1, 2, 3]  # by prior
    # at version 5, states of version 1 are 4 steps old: 0.9 - 0.06 x 4 = 0.66, 0.8 -> 0.56; 0.7 and 0.6 stay
    assert order(greedy(state, now=5, age_penalty=0.06)) == [2, 0, 3, 1]
    after = snapshot(OPS.drop_older(state, 5))
    gone = (before["length"] > 0) & (before["version"] < 5)
    assert gone.sum() == 2 and after["drops"] == 2
    for f in FIELDS[:10]:
        np.testing.assert_array_equal(after[f][~gone], before[f][~gone], err_msg=f)
        assert not after[f][gone].any(), f


def test_replay_bench_measures_every_operation():
    from jaxrl_llm.bench.replay_bench import OPS as BENCH_OPS, full_state, measure

    # this file's shapes: the bench's jits of the replay functions share the programs compiled above
    s = full_state(C, T, P)
    assert (np.asarray(s.length) > 0).all()
    np.testing.assert_array_equal(np.asarray(s.fingerprint), np.asarray(
        jax.jit(replay.fingerprint)(s.tokens, s.length, s.prompt)))
    row = measure(C, T, K, KS, P, repeats=1)
    assert all(row[op] > 0 for op in BENCH_OPS)


def test_uncertainty_rule_prefers_states_whose_continuations_differ():
    """Three states after 8 continuations each: all succeed, half succeed, all fail. A group-relative
    estimator learns only from the middle one (the others' groups have zero reward variance): "uncertainty"
    draws it first, while "value" draws the all-succeeding one first. A fresh state from a failed response
    (prior 0) and one from a right response (prior 1) score alike under "uncertainty" (neither is certain
    from one observation); a partial-credit prior of 1/2 scores highest."""
    state = replay.empty(4, T)
    tokens = np.tile(np.arange(1, T + 1, dtype=np.int32), (3, 1))
    state, _ = OPS.insert(state, tokens, np.array([1, 2, 3]), np.zeros(3, np.int32), np.ones(3, np.float32),
                             np.ones(3, bool), 0, 0, 0.0)
    state = OPS.update_values(state, np.array([0, 1, 2], np.int32), np.array([8.0, 4.0, 0.0], np.float32),
                                 np.full(3, 8.0, np.float32), np.ones(3, bool))
    greedy = {rule: np.asarray(OPS.sample(state, jax.random.key(0), 3, 0.0, 0.0, rule=rule)[0]).tolist()
              for rule in replay.RULES}
    assert greedy["uncertainty"][0] == 1 and greedy["value"][0] == 0
    fresh = np.asarray(SCORE(np.array([0.0, 1.0, 0.5]), 0.0, 0.0, "uncertainty"))
    np.testing.assert_allclose(fresh, [0.75, 0.75, 1.0], rtol=0, atol=1e-7)
