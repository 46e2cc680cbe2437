"""RRL's pieces without a model: freeing slots, cutting responses into prefix states, the replay
plan (which states, which slots, which prefixes, keys and temperatures) and what a step's scored
rollouts do to the array (values, drops, inserts, first-solved attribution), each against a brute
force or a hand-built case."""

import dataclasses

import jax
import numpy as np
import pytest

from jaxrl_llm.config import E3Section, RRLSection
from jaxrl_llm.data.worked import first_error, parse_terms, step_profile, steps, worked_solution
from jaxrl_llm.explore.base import Setup, StepInfo
from jaxrl_llm.explore.cuts import OPENS_SPACE, SENTENCE, STEP_END, boundary_table, cut_lengths, keep_best, spread
from jaxrl_llm.explore.e3 import E3
from jaxrl_llm.explore.rows import RowPlan, Rollouts
from jaxrl_llm.explore.rrl import BY_FRESH, BY_REPLAY, NEVER, RRL, free_slots
from jaxrl_llm.sampling.sampler import FINISH_LENGTH, FINISH_STOP, SampleOutput


@pytest.mark.parametrize("seed", range(6))
def test_free_slots_levels_the_largest_groups(seed):
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 12, size=rng.integers(2, 9))
    group = np.repeat(np.arange(len(sizes)), sizes)
    count = int(rng.integers(0, sizes.sum()))
    freed = free_slots(group, count)
    left = sizes - np.bincount(group[freed], minlength=len(sizes))
    room = int(np.maximum(sizes - 2, 0).sum())
    assert len(freed) == min(count, room) and len(set(freed.tolist())) == len(freed)
    assert (left >= np.minimum(sizes, 2)).all()
    # the largest remaining group is as small as freeing that many rows can make it (brute force)
    best = min(level for level in range(1, sizes.max() + 1) if np.maximum(sizes - level, 0).sum() <= len(freed))
    assert left.max() == max(best, min(sizes.max(), 2))
    for g in range(len(sizes)):  # a group gives its last rows
        rows = np.flatnonzero(group == g)
        assert set(freed) & set(rows) == set(rows[left[g]:])


class _CharTok:
    def decode(self, ids):
        if ids[0] >= 9:
            raise IndexError(ids)
        return ["a", "b\n", ".", "c", " ", "?", "x.", "\n\n", ". "][ids[0]]


class _PieceTok:
    """Decodes a lone token without its leading space, as SentencePiece tokenizers do; the token strings keep it."""
    PIECES = ["\u2581Hi", ".", "\u2581The", "5", "<0x0A>"]

    def decode(self, ids):
        return self.PIECES[ids[0]].lstrip("\u2581").replace("<0x0A>", "\n")

    def convert_ids_to_tokens(self, i):
        return self.PIECES[i]


def test_boundary_table_and_cuts():
    lines = boundary_table(_CharTok(), 10, "line")
    sentences = boundary_table(_CharTok(), 10, "sentence")
    assert ((lines & STEP_END) > 0).tolist() == [False, True, False, False, False, False, False, True, False, False]
    assert (lines & ~STEP_END == 0).all()
    assert ((sentences & STEP_END) > 0).tolist() == [False, True] + [False] * 5 + [True, True, False]  # ". " too
    assert ((sentences & SENTENCE) > 0).tolist() == [False, False, True, False, False, True, True, False, False, False]
    assert ((sentences & OPENS_SPACE) > 0).tolist() == [False] * 4 + [True, False, False, True, False, False]
    resp = np.array([0, 1, 3, 2, 0, 7, 3, 1])  # a b\n c . a \n\n c b\n
    assert cut_lengths(resp, lines, "line", 0, 100).tolist() == [2, 6]  # not the full response (8)
    assert cut_lengths(resp, sentences, "sentence", 0, 100).tolist() == [2, 6]  # "." then "a": not a sentence end
    # a . _ a . c x. b\n ? \n\n c: a mark ends a sentence only before whitespace (a space or a newline)
    resp = np.array([0, 2, 4, 0, 2, 3, 6, 1, 5, 7, 3])
    assert cut_lengths(resp, sentences, "sentence", 0, 100).tolist() == [2, 8, 9, 10]
    assert cut_lengths(resp, sentences, "sentence", 0, 8).tolist() == [2, 8]
    assert cut_lengths(np.array([0, 8, 0, 3]), sentences, "sentence", 0, 100).tolist() == [2]  # "a. ac": the mark's own space
    # SentencePiece: the space that opens "The" is only in its token string; "5" after "." is a decimal
    pieces = boundary_table(_PieceTok(), 5, "sentence")
    assert cut_lengths(np.array([0, 1, 2, 1, 3, 1, 2]), pieces, "sentence", 0, 100).tolist() == [2, 6]
    assert cut_lengths(resp, lines, "tokens", 3, 100).tolist() == [3, 6, 9]
    for c in range(0, 9):
        lengths = np.arange(1, c + 1) * 3
        for k in (1, 2, 3):
            got = spread(lengths, k)
            assert len(got) == min(c, k) and set(got) <= set(lengths) and (np.diff(got) > 0).all()
            if c > k >= 2:
                assert got[0] == lengths[0] and got[-1] == lengths[-1]


@pytest.mark.parametrize("seed", range(4))
def test_keep_best_takes_the_highest_scores_and_spreads_ties_brute_force(seed):
    rng = np.random.default_rng(seed)
    for _ in range(200):
        n, k = int(rng.integers(0, 9)), int(rng.integers(1, 4))
        lengths = np.sort(rng.choice(np.arange(1, 40), size=n, replace=False))
        scores = rng.choice([0.0, 0.25, 0.5, 1.0], size=n).astype(np.float32)
        got = keep_best(lengths, scores, k)
        assert len(got) == min(n, k) and (np.diff(got) > 0).all()
        # brute force: the kept scores are the k largest; the lowest kept tier, if cut short, is spread
        assert sorted(scores[got].tolist()) == sorted(scores.tolist())[n - len(got):]
        if n > k:
            low = scores[got].min()
            tier = np.flatnonzero(scores == low)
            taken = [i for i in got if scores[i] == low]
            assert lengths[taken].tolist() == spread(lengths[tier], len(taken)).tolist()
    same = np.arange(1, 8) * 3
    assert (same[keep_best(same, np.zeros(7), 2)] == spread(same, 2)).all()  # one score: the spread rule


def _setup(**kw):
    base = dict(num_items=6, prompts_per_step=4, group_size=8, rows=32, total_steps=10, steps_per_epoch=1,
                vocab_size=50, temperature=1.0, max_new_tokens=8)
    return Setup(**{**base, **kw})


def _rrl(**kw):
    cfg = RRLSection(**{**dict(enabled=True, boundary="tokens", every_tokens=1, replay_ratio=0.5, continuations=4,
                               warmup_steps=0, capacity=16, max_prefix_tokens=5, priority_temperature=0.0,
                               priority="value"), **kw})
    rrl = RRL(cfg)
    return rrl, rrl.init(_setup())[0]


def _insert(rrl, state, prefixes, prompts, priors, version=0):
    t = state.run.max_prefix
    tok = np.zeros((len(prefixes), t), np.int32)
    for i, p in enumerate(prefixes):
        tok[i, :len(p)] = p
    replay, _ = state.run.ops.insert(state.replay, tok, np.array([len(p) for p in prefixes], np.int32),
                                     np.array(prompts, np.int32), np.array(priors, np.float32),
                                     np.ones(len(prefixes), bool), version + 1, version, rrl.cfg.c_ucb,
                                     rule=rrl.cfg.priority)
    return state.replace(replay=replay)


def test_plan_replaces_fresh_slots_with_continuations():
    rrl, state = _rrl()
    assert state.run.k_max == 4 and state.run.max_prefix == 5
    state = _insert(rrl, state, [(7, 8), (9,), (3, 4, 5)], [0, 5, 1], [0.9, 0.5, 0.1])
    key = jax.random.key(0)
    base = RowPlan.groups([8] * 4, 1.0, key, prompt_ids=[0, 1, 2, 3])
    base = dataclasses.replace(base, temperature=np.arange(32, dtype=np.float32))
    info = StepInfo(step=2, prompt_ids=np.array([0, 1, 2, 3]), key=jax.random.key(1))
    plan = rrl.plan(state, base, info)
    rep = plan.replayed
    assert plan.rows == 32 and rep.sum() == 12  # 3 occupied states x 4 (k_max = 4 asked)
    fresh_sizes = np.bincount(plan.group[~rep])
    assert fresh_sizes.tolist() == [5, 5, 5, 5]
    # states by priority (top-k: prior + the same bonus): prompts 0, 5, 1 with their prefixes
    got = [(int(plan.prompt[i]), plan.prefix[i], int(plan.group[i])) for i in np.flatnonzero(rep)]
    assert got == [(0, (7, 8), 4)] * 4 + [(5, (9,), 5)] * 4 + [(1, (3, 4, 5), 6)] * 4
    assert all(p == () for p, r in zip(plan.prefix, rep) if not r)
    # replay rows take the freed slots' temperatures; kept fresh rows keep their keys and temperatures
    kept = [i for g in range(4) for i in range(8 * g, 8 * g + 5)]
    np.testing.assert_array_equal(plan.temperature[~rep], kept)
    assert sorted(plan.temperature[rep].tolist()) == sorted(set(range(32)) - set(kept))
    np.testing.assert_array_equal(plan.row_keys[~rep], base.row_keys[kept])
    # half the batch solved: half the replay; during warm-up none
    solved = state.replace(last_success=state.last_success.at[np.array([0, 1])].set(1.0))
    assert rrl.plan(solved, base, info).replayed.sum() == 8
    rrl_w, _ = _rrl(warmup_steps=2)
    assert rrl_w.plan(state, base, info) is base


def _rollouts(plan, responses, rewards, stop):
    """Rollouts of `plan` whose row i generated responses[i] after a 2-token prompt and its prefix."""
    n, width = plan.rows, 32
    tokens = np.zeros((n, width), np.int32)
    prefix_len = np.array([len(p) for p in plan.prefix], np.int32)
    for i in range(n):
        row = [1, 2] + list(plan.prefix[i]) + list(responses[i])
        tokens[i, :len(row)] = row
    out = SampleOutput(tokens=tokens, prompt_len=np.full(n, 2, np.int32), prefix_len=prefix_len,
                       num_generated=np.array([len(r) for r in responses], np.int32),
                       logprobs=np.zeros((n, width), np.float32), entropy=np.zeros((n, width), np.float32),
                       finish_reason=np.where(stop, FINISH_STOP, FINISH_LENGTH), temperature=plan.temperature)
    r = np.asarray(rewards, np.float32)
    return Rollouts(plan, out, r, ("",) * n)


def test_plans_drawing_any_number_of_states_compile_nothing_new():
    """k (the states a step draws) changes with the unsolved share and the array's fill; the draw's gathers
    and keys keep one shape (k_max), so after the first replay nothing compiles (this once compiled a
    gather and a key program for every new k, mid-run)."""
    from jaxrl_llm.utils import compile_counter

    rrl, _ = _rrl()
    stored = (([(7, 8), (9,), (3, 4, 5)], [0, 5, 1], [0.9, 0.5, 0.1]), ([(9,)], [5], [0.5]),
              ([(9,), (3,)], [5, 1], [0.5, 0.2]))
    states = [_insert(rrl, rrl.init(_setup())[0], p, q, v) for p, q, v in stored]
    base = RowPlan.groups([8] * 4, 1.0, jax.random.key(0), prompt_ids=[0, 1, 2, 3])
    info = StepInfo(step=2, prompt_ids=np.array([0, 1, 2, 3]), key=jax.random.key(1))
    assert rrl.plan(states[0], base, info).replayed.sum() == 12  # warm-up: the first replay compiles
    before = compile_counter.compilations()
    assert [rrl.plan(s, base, info).replayed.sum() for s in states[1:]] == [4, 8]
    assert compile_counter.compilations() == before


def test_one_explorer_object_steps_two_runs_as_two_objects_do():
    """Nothing per-run lives on an explorer object: two runs' states stepped through one E3 and one RRL,
    interleaved (both inits, both plans, then both observes), give the plans, states and metrics that one
    object per run gives. E3's runs differ only in the data set's difficulty ranks (read inside its jitted
    observe from the state's static field, which compares equal, they would be baked into the one program the
    runs share); RRL's in their sizes (training items)."""
    rrl_cfg = RRLSection(enabled=True, boundary="tokens", every_tokens=1, replay_ratio=0.5, continuations=4,
                         warmup_steps=0, capacity=64, max_prefix_tokens=5, priority_temperature=0.5)
    diff = np.linspace(0.0, 1.0, 6, dtype=np.float32)
    def stored(state):
        return _insert(RRL(rrl_cfg), state, [(7, 8), (9,), (3, 4, 5)], [0, 5, 1], [0.9, 0.5, 0.1])

    cases = [(lambda: E3(E3Section(enabled=True, rank_every=1)), lambda state: state,
              [_setup(item_difficulty=diff), _setup(item_difficulty=diff[::-1].copy())]),
             (lambda: RRL(rrl_cfg), stored, [_setup(), _setup(num_items=7)])]
    base = RowPlan.groups([8] * 4, 1.0, jax.random.key(0), prompt_ids=[0, 1, 2, 3])

    def two_runs(explorers, setups, prepare):
        states = [prepare(e.init(s)[0]) for e, s in zip(explorers, setups)]
        infos = [StepInfo(step=2, prompt_ids=np.arange(4), key=jax.random.key(7 + i)) for i in range(2)]
        plans = [e.plan(st, base, info) for e, st, info in zip(explorers, states, infos)]
        steps = []
        for e, st, plan, info in zip(explorers, states, plans, infos):
            rows = np.arange(plan.rows)
            responses = [(20 + i % 5, 30, 40)[:1 + i % 3] for i in rows]
            rewards = ((plan.prompt + rows) % 3 == 0).astype(np.float32)
            steps.append(e.observe(st, _rollouts(plan, responses, rewards, rows % 2 == 0), info))
        return plans, [jax.device_get(new) for new, _ in steps], [m for _, m in steps]

    for make, prepare, setups in cases:
        one = make()
        shared, apart = two_runs([one, one], setups, prepare), two_runs([make(), make()], setups, prepare)
        for a, b in zip(shared[0], apart[0]):
            assert a.prefix == b.prefix
            for f in dataclasses.fields(RowPlan):
                if f.name != "prefix":
                    np.testing.assert_array_equal(getattr(a, f.name), getattr(b, f.name))
        jax.tree.map(np.testing.assert_array_equal, shared[1], apart[1])
        np.testing.assert_equal(shared[2], apart[2])
        first, second = (jax.tree.leaves(state) for state in shared[1])
        assert not all(np.array_equal(x, y) for x, y in zip(first, second))  # the runs differ: a mix-up would show


@pytest.mark.slow
def test_observe_updates_values_drops_solved_and_inserts_cuts():
    rrl, state = _rrl(capacity=64)  # room for every cut: nothing evicted
    state = _insert(rrl, state, [(7, 8), (9,), (3, 4, 5)], [0, 5, 1], [0.9, 0.5, 0.1])
    info = StepInfo(step=2, prompt_ids=np.array([0, 1, 2, 3]), key=jax.random.key(1))
    plan = rrl.plan(state, RowPlan.groups([8] * 4, 1.0, jax.random.key(0), prompt_ids=[0, 1, 2, 3]), info)
    rep = plan.replayed
    rewards = np.zeros(32, np.float32)
    rewards[(plan.prompt == 0) & ~rep] = 1.0  # prompt 0 solved by its fresh rows: its states go
    rewards[np.flatnonzero((plan.prompt == 5) & rep)[:3]] = 1.0  # prompt 5 first solved by replay
    rewards[np.flatnonzero((plan.prompt == 1) & rep)[:1]] = 0.25  # partial credit on a continuation
    responses = [(20 + i % 5, 30, 40, 41, 42, 43)[: 2 + i % 4] for i in range(32)]
    stop = np.arange(32) % 2 == 0
    new, m = rrl.observe(state, _rollouts(plan, responses, rewards, stop), info)
    r = jax.device_get(new.replay)
    live = r.length > 0
    # values of the replayed states (prompt 0's state is gone with its solved prompt)
    by_prefix = {(int(r.prompt[i]), tuple(r.tokens[i, :r.length[i]].tolist())): i for i in np.flatnonzero(live)}
    s5, s1 = by_prefix[(5, (9,))], by_prefix[(1, (3, 4, 5))]
    assert (r.visits[s5], r.value_sum[s5]) == (4.0, 3.0) and (r.visits[s1], r.value_sum[s1]) == (4.0, 0.25)
    assert not any(p == 0 for p, _ in by_prefix) and m["rrl_dropped"] == 1
    # inserted: cuts of the responses of unsolved prompts (1, 2, 3 fresh; 1 and 5 continued), brute force
    want = set()
    for i in range(32):
        if plan.prompt[i] == 0:
            continue
        resp = list(plan.prefix[i]) + list(responses[i])
        resp = resp[:-1] if stop[i] and responses[i] else resp
        lengths = [n for n in range(1, len(resp)) if n <= 5]
        for n in spread(np.array(lengths, int), 2):
            want.add((int(plan.prompt[i]), tuple(resp[:n])))
    assert set(by_prefix) == want | {(5, (9,)), (1, (3, 4, 5))}
    assert m["rrl_inserted"] == len(want - {(5, (9,)), (1, (3, 4, 5))})
    first = np.asarray(new.first_solved)
    assert first[0] == BY_FRESH and first[5] == BY_REPLAY and first[1] == NEVER
    assert m["rrl_solved_first_via_replay"] == 1 and m["rrl_replay_rows"] == 12 and m["rrl_replayed_states"] == 3
    assert m["rrl_continuation_success"] == pytest.approx(3 / 12)
    # of the replay groups, only prompt 1's is on a prompt whose latest fresh group was all wrong (prompt 0's
    # was solved, prompt 5 was never sampled fresh); one of its continuations got partial credit: mixed
    assert m["rrl_replay_groups_all_wrong_prompts"] == 1 and m["rrl_replay_mixed_all_wrong_prompts"] == 1
    np.testing.assert_allclose(np.asarray(new.last_success)[:4], [1, 0, 0, 0])
    assert np.asarray(new.last_success)[5] == -1  # continuations do not count as the prompt's fresh success


@pytest.mark.parametrize("max_age", [1, 2])
def test_max_age_keeps_exactly_the_states_the_next_draw_may_use(max_age):
    """explore.rrl.max_age: no state from a policy more than max_age steps old is drawn. The draw at step s + 1
    measures age as (s + 1) - 1 - version (plan's `now`), so observe at step s keeps version >= s - max_age; it
    kept one version more (drop below s - 1 - max_age: a state max_age + 1 steps old could be drawn)."""
    rrl, state = _rrl(capacity=64, max_age=max_age)
    s = 5
    for v in range(s):  # one state of prompt 1 per policy version 0 .. s - 1
        state = _insert(rrl, state, [(40 + v,)], [1], [0.5], version=v)
    plan = RowPlan.groups([8] * 4, 1.0, jax.random.key(0), prompt_ids=[0, 1, 2, 3])
    info = StepInfo(step=s, prompt_ids=np.array([0, 1, 2, 3]), key=jax.random.key(1))
    new, m = rrl.observe(state, _rollouts(plan, [(20, 21)] * 32, np.zeros(32), np.ones(32, bool)), info)
    r = jax.device_get(new.replay)
    kept = {int(r.tokens[i, 0]) - 40 for i in np.flatnonzero(r.length > 0) if r.tokens[i, 0] >= 40}
    now = (s + 1) - 1  # the next plan's `now`
    assert kept == {v for v in range(s) if now - v <= max_age} and len(kept) == max_age


def test_worked_steps_and_profile():
    assert parse_terms("4 - 1 - 17 + 7") == [4, -1, -17, 7]
    for bad in ("(1 + 2)", "1 * 2", "- 1 + 2", "1 +", ""):
        with pytest.raises(ValueError):
            parse_terms(bad)
    assert steps("12 + 7 - 30") == [("12+7=19", 19), ("19-30=-11", -11)]
    entry = {"metadata": {"expression": "12 + 7 - 30 + 5"}}
    assert worked_solution("basic_arithmetic", entry, "steps") == "12+7=19\n19-30=-11\n-11+5=-6"
    with pytest.raises(ValueError, match="not defined"):
        worked_solution("chain_sum", entry, "steps")
    expr = "12 + 7 - 30 + 5"
    responses = ["12+7=19\n19-30=-11\n-11+5=-6", "12+7=19\n19-30=-12\n-12+5=-7", "12+7=18", "12 + 7=19\n19-30=-11"]
    assert [first_error(r, expr) for r in responses] == [3, 1, 0, 2]
    prof = step_profile(responses, [expr] * 4, [True, False, False, False])
    assert prof["reach_1"] == 0.75 and prof["reach_2"] == 0.5 and prof["reach_3"] == 0.25
    assert prof["cond_2"] == pytest.approx(2 / 3) and prof["cond_3"] == 0.5
    assert prof["first_error_1"] == pytest.approx(1 / 3) and prof["first_error_2"] == pytest.approx(1 / 3)
    assert prof["first_error_3"] == pytest.approx(1 / 3) and prof["late_failure_share"] == pytest.approx(2 / 3)


def test_worked_references_from_reasoning_gym_end_in_the_answer():
    from jaxrl_llm.config import load_config
    from jaxrl_llm.data.tasks import load_items
    from jaxrl_llm.data.types import DataError
    from jaxrl_llm.rewards.verifiers import extract_answer

    cfg = load_config("configs/toy_steps.yaml").data
    items = load_items(dataclasses.replace(cfg, train_size=20), "train")
    for it in items:
        lines = it.reference.splitlines()
        assert 4 <= len(lines) <= 5 and extract_answer(it.reference, "last_number") == it.answer, it
    with pytest.raises(DataError, match="data.worked='steps' on reasoning-gym task 'chain_sum'"):
        load_items(dataclasses.replace(cfg, task="chain_sum", task_args={}, train_size=2), "train")


class _RefTok:
    """Just enough tokenizer for reference prefixes: characters to ids."""

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [ord(ch) % 40 + 1 for ch in text]}


def test_reference_prefixes_of_unsolved_prompts_enter_with_prior_one():
    from jaxrl_llm.data.types import TaskItem

    items = [TaskItem(uid=str(i), question="q", answer="1", scorer="exact", reference="abcdef" if i != 2 else "")
             for i in range(6)]
    cfg = RRLSection(enabled=True, boundary="tokens", every_tokens=2, replay_ratio=0.5, continuations=4,
                     warmup_steps=5, capacity=64, max_prefix_tokens=5, reference_prefixes=True)
    rrl = RRL(cfg)
    state, _ = rrl.init(_setup(items=items, tokenizer=_RefTok()))
    info = StepInfo(step=1, prompt_ids=np.array([0, 1, 2, 3]), key=jax.random.key(1))
    plan = rrl.plan(state, RowPlan.groups([8] * 4, 1.0, jax.random.key(0), prompt_ids=[0, 1, 2, 3]), info)
    assert not plan.replayed.any()  # warm-up
    rewards = np.where(plan.prompt == 1, 1.0, 0.0).astype(np.float32)  # prompt 1 solved
    new, m = rrl.observe(state, _rollouts(plan, [()] * 32, rewards, np.zeros(32, bool)), info)
    r = jax.device_get(new.replay)
    live = np.flatnonzero(r.length > 0)
    got = {(int(r.prompt[i]), tuple(r.tokens[i, :r.length[i]].tolist()), float(r.prior[i])) for i in live}
    ids = _RefTok()("abcdef")["input_ids"]
    # unsolved batch prompts with a reference (0 and 3; 2 has none, 1 is solved): cuts at 2 and 4 tokens
    # (every 2, shorter than the reference, at most 5), the shortest and the longest kept, prior 1
    assert got == {(p, tuple(ids[:n]), 1.0) for p in (0, 3) for n in (2, 4)}
    assert m["rrl_inserted"] == 4


class _StepTok:
    """Characters <-> ids for worked-solution text: '0'..'9', '+', '-', '=', '\\n', ' '; other ids decode to ''."""
    CHARS = "0123456789+-=\n "

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [self.CHARS.index(ch) + 1 for ch in text]}

    def decode(self, ids, skip_special_tokens=False):
        return "".join(self.CHARS[i - 1] if 1 <= i <= len(self.CHARS) else "" for i in ids)


@pytest.mark.slow
def test_step_prior_scores_each_prefix_by_the_reference_lines_it_has_right():
    from jaxrl_llm.data.types import TaskItem

    tok = _StepTok()
    ref = "1+2=3\n3+4=7\n7-1=6"
    items = [TaskItem(uid=str(i), question="q", answer="6", scorer="exact", reference=ref) for i in range(6)]
    cfg = RRLSection(enabled=True, boundary="line", replay_ratio=0.5, continuations=4, warmup_steps=5, capacity=256,
                     max_prefix_tokens=18, prefixes_per_response=3, prior="steps", priority="value")
    rrl = RRL(cfg)
    state, _ = rrl.init(_setup(items=items, tokenizer=tok, max_new_tokens=20))
    info = StepInfo(step=1, prompt_ids=np.array([0, 1, 2, 3]), key=jax.random.key(1))
    plan = rrl.plan(state, RowPlan.groups([8] * 4, 1.0, jax.random.key(0), prompt_ids=[0, 1, 2, 3]), info)
    texts = ["1+2=3\n3+4=7\n7-1=5", "1 + 2 = 3\n3+4=8\n8-1=7", "1+2=4\n4+4=8\n8-1=7", "1+2=3\n\n3+4=7\n7-1=9"]
    responses = [tuple(tok(texts[i % 4])["input_ids"]) for i in range(32)]
    new, m = rrl.observe(state, _rollouts(plan, responses, np.zeros(32, np.float32), np.zeros(32, bool)), info)
    r = jax.device_get(new.replay)
    got = {tok.decode(r.tokens[i, :r.length[i]].tolist()): float(r.prior[i]) for i in np.flatnonzero(r.length > 0)}
    # brute force: every line cut (after each newline, shorter than the response, at most 18 tokens), its prior
    # the share of the 3 reference lines right so far, 0 after a wrong line; spaces and blank lines ignored
    want = {"1+2=3\n": 1 / 3, "1+2=3\n3+4=7\n": 2 / 3, "1 + 2 = 3\n": 1 / 3, "1 + 2 = 3\n3+4=8\n": 0.0,
            "1+2=4\n": 0.0, "1+2=4\n4+4=8\n": 0.0, "1+2=3\n\n": 1 / 3, "1+2=3\n\n3+4=7\n": 2 / 3}
    assert got == pytest.approx(want, abs=1e-6)
    # priority=uncertainty keeps only the right-so-far prefixes (a wrong line: its continuations all fail)
    rrl_u = RRL(dataclasses.replace(cfg, priority="uncertainty"))
    state_u, _ = rrl_u.init(_setup(items=items, tokenizer=tok, max_new_tokens=20))
    plan_u = rrl_u.plan(state_u, RowPlan.groups([8] * 4, 1.0, jax.random.key(0), prompt_ids=[0, 1, 2, 3]), info)
    new_u, _ = rrl_u.observe(state_u, _rollouts(plan_u, responses, np.zeros(32, np.float32), np.zeros(32, bool)), info)
    r = jax.device_get(new_u.replay)
    got = {tok.decode(r.tokens[i, :r.length[i]].tolist()): float(r.prior[i]) for i in np.flatnonzero(r.length > 0)}
    assert got == pytest.approx({k: v for k, v in want.items() if v > 0}, abs=1e-6)
    assert state.run.step_prior(0, tok(ref + "\n")["input_ids"]) == 1.0  # every line right: the whole solution
    # a partial line is not judged
    assert state.run.step_prior(0, tok("1+2=3\n3+")["input_ids"]) == pytest.approx(1 / 3)

    # a response right for 3 lines and wrong at the 4th: kept by prior, its two longest right-so-far cuts
    # (the spread rule would keep the first line and the wrong 4th)
    items4 = [dataclasses.replace(it, reference=ref + "\n6+1=7") for it in items]
    rrl = RRL(dataclasses.replace(cfg, prefixes_per_response=2, max_prefix_tokens=30))
    state, _ = rrl.init(_setup(items=items4, tokenizer=tok, max_new_tokens=30))
    plan = rrl.plan(state, RowPlan.groups([8] * 4, 1.0, jax.random.key(0), prompt_ids=[0, 1, 2, 3]), info)
    one = tuple(tok("1+2=3\n3+4=7\n7-1=6\n6+1=8\n8")["input_ids"])
    new, _ = rrl.observe(state, _rollouts(plan, [one] * 32, np.zeros(32, np.float32), np.zeros(32, bool)), info)
    r = jax.device_get(new.replay)
    got = {tok.decode(r.tokens[i, :r.length[i]].tolist()): float(r.prior[i]) for i in np.flatnonzero(r.length > 0)}
    assert got == pytest.approx({"1+2=3\n3+4=7\n": 0.5, "1+2=3\n3+4=7\n7-1=6\n": 0.75}, abs=1e-6)

    no_ref = [dataclasses.replace(it, reference="") if i == 4 else it for i, it in enumerate(items)]
    with pytest.raises(ValueError, match=r"prior=steps needs a reference solution .* item 4 \(uid 4\)"):
        RRL(cfg).init(_setup(items=no_ref, tokenizer=tok, max_new_tokens=20))


def test_min_group_size_bounds_every_group_replay_can_cut_brute_force():
    """The bound the update's shared layout is sized by: no group freeing cuts (any starting sizes, as E3's
    budgets make, any number of rows up to k_max x continuations) ends below it, nor does a continuation
    group; and it is tighter than the old bound of 2 where replay frees few rows."""
    rng = np.random.default_rng(0)
    seen_tighter = 0
    for _ in range(300):
        b, n, c = int(rng.integers(2, 9)), int(rng.integers(2, 13)), int(rng.integers(1, 7))
        cfg = RRLSection(enabled=True, boundary="tokens", every_tokens=1, continuations=c,
                         replay_ratio=float(rng.uniform(0.05, 0.9)), capacity=16, max_prefix_tokens=4)
        setup = _setup(prompts_per_step=b, group_size=n, rows=b * n)
        if int(cfg.replay_ratio * b * n) // c == 0:  # no state could ever be replayed: refused, not a silent no-op
            with pytest.raises(ValueError, match=r"explore.rrl: replay_ratio x rows per step .* below continuations"):
                RRL(cfg).init(setup)
            bound, k_max = n, 0
        else:
            state, footprint = RRL(cfg).init(setup)
            bound, k_max = footprint.min_group_size, state.run.k_max
            seen_tighter += bound > min(2, c)
            assert k_max > 0 and c >= bound
        for _ in range(5):
            cuts = np.sort(rng.choice(np.arange(1, b * n), size=b - 1, replace=False))  # b sizes >= 1 summing to N
            sizes = np.diff(np.concatenate([[0], cuts, [b * n]]))
            group = np.repeat(np.arange(b), sizes)
            freed = free_slots(group, int(rng.integers(0, k_max * c + 1)))
            left = sizes - np.bincount(group[freed], minlength=b)
            assert k_max == 0 or (left[left < sizes] >= bound).all(), (b, n, c, k_max, sizes, left, bound)
    assert seen_tighter > 60  # 80 of these 300 draws (of the draws that can replay)


def test_step_figures_are_of_fresh_rows_and_replay_groups_are_reported_apart():
    """The step's accuracy, reward and pass@k measure the policy on the step's prompts (fresh rows); the
    continuations of replayed states go to replay_* figures, with the share of their groups that carry no
    GRPO signal (all rewards equal). Brute force over a hand-built batch."""
    from jaxrl_llm.train.metrics import pass_at_k
    from jaxrl_llm.train.rollout import rollout_metrics

    rrl, state = _rrl()
    state = _insert(rrl, state, [(7, 8), (9,), (3, 4, 5)], [0, 5, 1], [0.9, 0.5, 0.1])
    info = StepInfo(step=2, prompt_ids=np.array([0, 1, 2, 3]), key=jax.random.key(1))
    plan = rrl.plan(state, RowPlan.groups([8] * 4, 1.0, jax.random.key(0), prompt_ids=[0, 1, 2, 3]), info)
    rep = plan.replayed
    rng = np.random.default_rng(0)
    rewards = (rng.random(32) < 0.4).astype(np.float32)
    rep_groups = np.unique(plan.group[rep])
    rewards[plan.group == rep_groups[0]] = 1.0  # one replay group all right: zero variance
    m = rollout_metrics(_rollouts(plan, [(5,)] * 32, rewards, np.ones(32, bool)))
    fresh = ~rep
    assert m["accuracy"] == pytest.approx(rewards[fresh].mean()) and m["reward_mean"] == pytest.approx(rewards[fresh].mean())
    groups = [rewards[fresh & (plan.group == g)] for g in np.unique(plan.group[fresh])]
    assert m["pass@4"] == pytest.approx(np.mean([pass_at_k(len(g), int(g.sum()), 4) for g in groups]))
    assert m["groups_all_wrong"] == pytest.approx(np.mean([not g.any() for g in groups]))
    assert m["rows_in_mixed_groups"] == pytest.approx(sum(len(g) for g in groups if 0 < g.sum() < len(g)) / fresh.sum())
    assert m["replay_accuracy"] == pytest.approx(rewards[rep].mean())
    zero = [np.all(rewards[plan.group == g] == rewards[plan.group == g][0]) for g in rep_groups]
    assert m["replay_groups_zero_variance"] == pytest.approx(np.mean(zero)) and np.mean(zero) >= 1 / 3
    assert m["sampled_tokens"] == 32  # cost still counts every row


def test_rubric_item_rates_are_of_fresh_rows():
    """rubric_item_met: the share of fresh rows meeting each rubric item by position (what HeRL's hidden-item
    control reads); a replayed row's items do not count."""
    from jaxrl_llm.train.rollout import rollout_metrics

    plan = RowPlan.groups([4, 4], 1.0, jax.random.key(0), prompt_ids=[0, 1])
    plan = dataclasses.replace(plan, replayed=np.arange(8) >= 6)
    met = np.zeros((8, 2), bool)
    met[:, 0] = True
    met[[1, 6, 7], 1] = True  # one fresh row meets item 1, and both replayed rows
    r = _rollouts(plan, [(5,)] * 8, met.mean(axis=1), np.ones(8, bool))
    m = rollout_metrics(dataclasses.replace(r, met=met))
    assert m["rubric_item_met"] == pytest.approx([1.0, 1 / 6], abs=1e-6)
