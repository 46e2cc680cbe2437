"""HeRL's hindsight step (ALGORITHMS.md §2) without a model: failed groups, candidate selection, the
revision choice against brute force, and `revise` with a stub sampler and scorer: revise prompts name
the met and unmet items and carry the draft, candidates get the bonus, chosen revisions replace random
members of their group flagged hindsight, under the original prompt with teacher-forced log-probs or
under the revise prompt with the sampler's."""

import dataclasses
import itertools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm.config import HeRLSection
from jaxrl_llm.data.types import TaskItem
from jaxrl_llm.explore.base import Setup, StepInfo
from jaxrl_llm.explore.herl import HeRL, candidates, choose_revisions, failed_groups
from jaxrl_llm.explore.rows import RowPlan, Rollouts
from jaxrl_llm.sampling.sampler import FINISH_STOP, SampleOutput


@pytest.mark.parametrize("seed", range(5))
def test_selection_matches_brute_force(seed):
    rng = np.random.default_rng(seed)
    n, g = 24, 4
    group = np.repeat(np.arange(g), n // g)
    scored = rng.choice([0.0, 0.25, 0.5, 1.0], size=n)
    met = rng.integers(0, 4, size=n)
    eligible = rng.random(n) < 0.9
    failed = failed_groups(group, scored, eligible, 1.0)
    want = [(k, np.flatnonzero((group == k) & eligible)) for k in range(g) if eligible[group == k].any()]
    want = [(k, rows, scored[rows].max()) for k, rows in want if scored[rows].max() < 1.0]
    assert [(a, b.tolist(), c) for a, b, c in failed] == [(a, b.tolist(), c) for a, b, c in want]
    for limit in (1, 3, 100):
        got = candidates(failed, scored, met, limit)
        ranked = [sorted([r for r in rows if abs(scored[r] - best) < 1e-6], key=lambda r: (-met[r], r))
                  for _, rows, best in failed]
        brute = [(f, r[k]) for k in range(n) for f, r in enumerate(ranked) if k < len(r)][:limit]
        assert got == brute
    for scores in itertools.product([0.0, 0.5, 1.0], repeat=3):
        scores = np.array(scores)
        for best, top in ((0.5, 1), (0.5, 2), (1.0, 1)):
            above = sorted([i for i in range(3) if scores[i] > best], key=lambda i: (-scores[i], i))
            at_least = sorted([i for i in range(3) if scores[i] >= best], key=lambda i: (-scores[i], i))
            assert choose_revisions(scores, best, top).tolist() == above[:top]
            assert choose_revisions(scores, best, top, at_least=True).tolist() == (above or at_least)[:top]


RUBRIC = [{"description": "Say A.", "weight": 1, "check": "py:contains_all", "args": {"keywords": ["A"]}},
          {"description": "Say B.", "weight": 1, "check": "py:contains_all", "args": {"keywords": ["B"]}}]


def _encode(text):
    return [ord(ch) % 97 + 3 for ch in text]


def _setup():
    items = [TaskItem(uid=str(i), question=f"Question {i}", answer="", scorer="rubric", rubric=json.dumps(RUBRIC))
             for i in range(3)]
    prompts = [[10 + i, 20, 30] for i in range(3)]
    return Setup(num_items=3, prompts_per_step=3, group_size=4, rows=12, total_steps=5, steps_per_epoch=1,
                 vocab_size=100, temperature=1.0, items=items, prompts=prompts, max_new_tokens=4, encode=_encode)


def _out(prompts, responses, temperature):
    n = len(prompts)
    width = max(32, max(len(p) + len(r) for p, r in zip(prompts, responses)))
    tokens = np.zeros((n, width), np.int32)
    for i, (p, r) in enumerate(zip(prompts, responses)):
        tokens[i, :len(p) + len(r)] = list(p) + list(r)
    logp = np.zeros((n, width), np.float32)
    for i, (p, r) in enumerate(zip(prompts, responses)):
        logp[i, len(p):len(p) + len(r)] = -0.5
    return SampleOutput(tokens=tokens, prompt_len=np.array([len(p) for p in prompts], np.int32),
                        prefix_len=np.zeros(n, np.int32), num_generated=np.array([len(r) for r in responses], np.int32),
                        logprobs=logp, entropy=np.zeros((n, width), np.float32),
                        finish_reason=np.full(n, FINISH_STOP), temperature=np.asarray(temperature, np.float32))


def _rollouts(setup):
    plan = RowPlan.groups([4, 4, 4], 1.0, jax.random.key(0), prompt_ids=[0, 1, 2])
    # group 0 fails (best 0.5, rows 1 and 2 tied, row 2 meets more... both meet one item); group 1 solved;
    # group 2 fails with best 0.0
    scored = np.array([0.0, 0.5, 0.5, 0.0, 1.0, 1.0, 0.5, 0.0, 0.0, 0.0, 0.0, 0.0], np.float32)
    met = np.zeros((12, 2), bool)
    met[1, 0] = met[2, 1] = True
    met[4] = met[5] = True
    met[6, 0] = True
    texts = tuple(f"draft {i}" for i in range(12))
    out = _out([setup.prompts[p] for p in plan.prompt], [[5, 6]] * 12, plan.temperature)
    return Rollouts(plan, out, scored.copy(), texts, met)


class _Stub:
    """sample: remembers the contexts; revision i gets score scores[i]; logprobs: -2 everywhere."""

    def __init__(self, scores):
        self.scores = np.asarray(scores, np.float32)
        self.calls = []

    def sample(self, plan, contexts=None, **shape):
        self.calls.append((plan, contexts, shape))
        return _out(contexts, [[7, 8, 9]] * plan.rows, plan.temperature)

    def score(self, plan, out):
        met = np.stack([self.scores >= 0.5, self.scores >= 1.0], axis=1)
        return Rollouts(plan, out, self.scores.copy(), tuple(f"rev {i}" for i in range(plan.rows)), met)

    def logprobs(self, out, *, min_rows=0):
        self.min_rows, self.teacher_out = min_rows, out
        return np.full(out.tokens.shape, -2.0, np.float32)


@pytest.mark.parametrize("train_on", ["original", "revise_prompt"])
def test_revise_replaces_with_revisions_and_gives_the_bonus(train_on):
    setup = _setup()
    """The specification's rules (keep=at_least, train_temperature=guided)."""
    herl = HeRL(HeRLSection(enabled=True, alpha=0.1, train_on=train_on, candidate_limit=8, keep="at_least",
                            train_temperature="guided"), instruction="Be brief.")
    state, footprint = herl.init(setup)
    r = _rollouts(setup)
    # candidates: group 0 rows 1, 2 (tied at 0.5); group 2 rows 8..11 (tied at 0.0): round-robin 1, 8, 2, 9, 10, 11
    stub = _Stub([1.0, 0.0, 0.5, 0.0, 0.0, 0.0])
    info = StepInfo(step=1, prompt_ids=np.arange(3), key=jax.random.key(5))
    new, m = herl.revise(state, r, info, stub.sample, stub.score, stub.logprobs)
    plan, contexts, shape = stub.calls[0]
    assert plan.prompt.tolist() == [0, 2, 0, 2, 2, 2] and plan.hindsight.all()
    assert np.allclose(plan.temperature, 0.3) and shape == {"min_rows": 8, "min_context": state.run.guided_context}
    # what the memory plan sizes the KV cache for
    assert footprint.sampling_calls == ((8, state.run.guided_context),)
    want = state.run.revise_prompt(0, np.array([True, False]), "draft 1")
    assert contexts[0] == _encode(want) and "Question 0\nBe brief." in want and "draft 1" in want
    assert "- Say A." in want.split("It does not")[0] and "- Say B." in want.split("It does not")[1]
    # bonus: candidate rows r <- r + 0.1 (best revision of the candidate - r)
    bonus = {1: 0.1 * (1.0 - 0.5), 8: 0.0, 2: 0.1 * (0.5 - 0.5), 9: 0.0, 10: 0.0, 11: 0.0}
    # group 0 takes revision 0 (1.0 > 0.5); group 2 takes the best at least 0.0: revision 1 (lowest index)
    assert m["herl_failed_groups"] == 2 and m["herl_candidates"] == 6 and m["herl_kept"] == 2
    assert m["herl_revision_success"] == pytest.approx(1 / 6)  # only revision 0 (1.0 > 0.5) beats its best
    assert m["herl_sampled_tokens"] == 18
    hind = np.flatnonzero(new.plan.hindsight)
    assert len(hind) == 2 and set(new.plan.group[hind]) == {0, 2}
    g0 = hind[new.plan.group[hind] == 0][0]
    assert g0 in range(0, 4) and new.rewards[g0] == 1.0 and new.scored[g0] == 1.0
    for row, b in bonus.items():
        if row not in hind:
            assert new.rewards[row] == pytest.approx(r.scored[row] + b)
            assert new.scored[row] == r.scored[row]
    untouched = [i for i in range(12) if i not in hind and i not in bonus]
    np.testing.assert_array_equal(new.rewards[untouched], r.rewards[untouched])
    o = new.out
    resp = slice(int(o.context_len[g0]), int(o.context_len[g0] + o.num_generated[g0]))
    assert o.tokens[g0, resp].tolist() == [7, 8, 9]
    if train_on == "original":
        assert o.tokens[g0, :o.prompt_len[g0]].tolist() == setup.prompts[0]
        assert (o.logprobs[g0, resp] == -2.0).all()  # teacher-forced under the original prompt
        assert stub.min_rows == 4  # the pass is padded to the most rows a step moves (3 prompts x 1), bucketed
    else:
        assert o.tokens[g0, :o.prompt_len[g0]].tolist() == contexts[0]
        assert (o.logprobs[g0, resp] == -0.5).all()  # the sampler's
    assert new.advantages is None


@pytest.mark.parametrize("train_on", ["original", "revise_prompt"])
def test_default_keeps_only_better_revisions_trained_at_the_rollout_temperature(train_on):
    """Defaults: keep=better (a tie at the group's best, or anything in an all-zero group, is no longer
    kept) and train_temperature=rollout (the kept revision takes the sampling temperature of the member
    it replaces, and its old log-probs come from a teacher-forced pass at that temperature, under the
    revise prompt too)."""
    setup = _setup()
    herl = HeRL(HeRLSection(enabled=True, train_on=train_on, candidate_limit=8), instruction="")
    state, _ = herl.init(setup)
    r = _rollouts(setup)
    temps = (0.5 + 0.01 * np.arange(12)).astype(np.float32)  # a distinct sampling temperature per row
    r = dataclasses.replace(r, plan=dataclasses.replace(r.plan, temperature=temps),
                            out=dataclasses.replace(r.out, temperature=temps))
    stub = _Stub([1.0, 0.0, 0.5, 0.0, 0.0, 0.0])  # only revision 0 (group 0: 1.0 > 0.5) beats its group's best
    new, m = herl.revise(state, r, StepInfo(1, np.arange(3), jax.random.key(5)), stub.sample, stub.score, stub.logprobs)
    assert np.allclose(stub.calls[0][0].temperature, 0.3)  # sampled at the guided temperature
    hind = np.flatnonzero(new.plan.hindsight)
    assert m["herl_kept"] == 1 and m["herl_kept_above_best"] == 1 and len(hind) == 1
    g0 = int(hind[0])
    assert g0 in range(4) and new.scored[g0] == 1.0
    assert new.plan.temperature[g0] == temps[g0] and new.out.temperature[g0] == temps[g0]
    others = np.setdiff1d(np.arange(12), hind)
    np.testing.assert_array_equal(new.plan.temperature[others], temps[others])
    teacher = stub.teacher_out
    assert teacher.temperature.tolist() == [temps[g0]]  # the pass ran at the row's training temperature
    want_context = setup.prompts[0] if train_on == "original" else stub.calls[0][1][0]
    assert teacher.tokens[0, :teacher.prompt_len[0]].tolist() == want_context
    o = new.out
    resp = slice(int(o.context_len[g0]), int(o.context_len[g0] + o.num_generated[g0]))
    assert (o.logprobs[g0, resp] == -2.0).all()  # teacher-forced, not the sampler's -0.5 taken at T=0.3


def test_nothing_failed_or_nothing_qualifies():
    setup = _setup()
    herl = HeRL(HeRLSection(enabled=True, keep_best_original=True), "")
    state, _ = herl.init(setup)
    r = _rollouts(setup)
    solved = dataclasses.replace(r, rewards=np.ones(12, np.float32), scored=np.ones(12, np.float32))
    stub = _Stub([])
    same, m = herl.revise(state, solved, StepInfo(1, np.arange(3), jax.random.key(0)), stub.sample, stub.score)
    assert same is solved and m["herl_failed_groups"] == 0 and not stub.calls
    # revisions all below their group's best: no revision kept; keep_best_original copies the best response
    stub = _Stub([0.0] * 6)
    r2 = dataclasses.replace(r, scored=np.where(np.arange(12) >= 8, 0.25, r.scored).astype(np.float32))
    new, m = herl.revise(state, r2, StepInfo(1, np.arange(3), jax.random.key(0)), stub.sample, stub.score,
                         stub.logprobs)
    assert m["herl_kept"] == 2 and not new.plan.hindsight.any()
    assert sorted(new.texts).count("draft 1") == 2  # group 0's best (row 1, first of the tied) copied once
    # the copies are marked: E3's and RRL's trackers and the step figures count each sample once and no copy
    # (before, a copy counted as a fresh sample: the best response twice, the overwritten one not at all)
    copied = np.flatnonzero(new.plan.copied)
    assert len(copied) == 2 and all(new.texts[i] != r2.texts[i] for i in copied)
    assert not (new.plan.fresh & new.plan.copied).any() and new.plan.fresh.sum() == 12 - 2
    assert sorted(t for t, f in zip(new.texts, new.plan.fresh) if f) == \
        sorted(t for i, t in enumerate(r2.texts) if i not in set(copied))


def test_small_groups_keep_a_sampled_row_and_copies_never_land_on_the_best(seed=0):
    """E3 / RRL make groups smaller than replace_top_n: at most size - 1 revisions go in (none in a
    group of one). keep_best_original: the best row is copied over ANOTHER member, in every failed group
    with no qualifying revision, including groups past the candidate limit."""
    setup = _setup()
    # groups of 2, 1 and 4 rows; all fail; group 0's rows tied at 0 (row 1 meets more items)
    plan = RowPlan(prompt=np.array([0, 0, 1, 2, 2, 2, 2]), group=np.array([0, 0, 1, 2, 2, 2, 2]),
                   temperature=np.ones(7, np.float32), prefix=((),) * 7, replayed=np.zeros(7, bool),
                   hindsight=np.zeros(7, bool), row_keys=np.zeros((7, 2), np.uint32))
    met = np.zeros((7, 2), bool)
    met[1, 0] = met[5, 0] = True
    scored = np.array([0.0, 0.0, 0.0, 0.0, 0.0, 0.5, 0.0], np.float32)
    out = _out([setup.prompts[p] for p in plan.prompt], [[5, 6]] * 7, plan.temperature)
    r = Rollouts(plan, out, scored.copy(), tuple(f"draft {i}" for i in range(7)), met)
    herl = HeRL(HeRLSection(enabled=True, num_guided=3, replace_top_n=3, candidate_limit=16), "")
    state, _ = herl.init(setup)
    stub = _Stub([1.0] * 12)  # candidates rows 1, 2, 5, then 0 (round-robin): 3 revisions each, all solve
    new, m = herl.revise(state, r, StepInfo(1, np.arange(3), jax.random.key(seed)), stub.sample, stub.score,
                         stub.logprobs)
    hind = new.plan.hindsight
    assert hind[:2].sum() == 1 and not hind[2] and hind[3:].sum() == 3, hind
    assert m["herl_kept"] == 4 and m["herl_trained_reward_mean"] == pytest.approx(new.rewards.mean())
    # keep_best_original, nothing qualifies, candidate limit 1: only group 0 (round-robin first) gets revisions
    for key in range(8):
        herl = HeRL(HeRLSection(enabled=True, keep_best_original=True, candidate_limit=1), "")
        state, _ = herl.init(setup)
        new, m = herl.revise(state, r, StepInfo(1, np.arange(3), jax.random.key(key)), _Stub([-1.0]).sample,
                             _Stub([-1.0]).score, None)
        assert new.texts.count("draft 1") == 2 and new.texts.count("draft 0") == 0  # row 1 (more met) over row 0
        # past the candidate limit too; a group of one is kept as it is
        assert new.texts.count("draft 5") == 2 and new.texts.count("draft 2") == 1
        assert m["herl_kept"] == 2 and not new.plan.hindsight.any()


def test_revisions_of_any_count_compile_nothing_new():
    """The number of revisions changes every step; their sampler keys keep one shape (guided rows), so
    after the first hindsight step nothing compiles (this once compiled a key program for every count)."""
    from jaxrl_llm.utils import compile_counter

    setup = _setup()
    herl = HeRL(HeRLSection(enabled=True, candidate_limit=8), "")
    state, _ = herl.init(setup)
    r = _rollouts(setup)
    info = StepInfo(1, np.arange(3), jax.random.key(0))
    herl.revise(state, r, info, _Stub([0.0] * 6).sample, _Stub([0.0] * 6).score, _Stub([]).logprobs)  # 6 revisions
    before = compile_counter.compilations()
    for n, scored in ((4, np.where(np.arange(12) < 8, 1.0, r.scored)),
                      (3, np.where(np.arange(12) == 9, 0.5, r.scored))):
        one = dataclasses.replace(r, scored=scored.astype(np.float32), rewards=scored.astype(np.float32))
        stub = _Stub([0.0] * n)
        _, m = herl.revise(state, one, info, stub.sample, stub.score, stub.logprobs)
        assert m["herl_revisions"] == n
    assert compile_counter.compilations() == before


def test_a_rubric_wider_than_the_steps_met_array_lists_its_extra_items_as_unmet():
    """`met` is as wide as the most items a scored row reported; when every row of a longer rubric failed
    to score, the revise prompt still lists all of its items (the missing ones unmet)."""
    setup = _setup()
    herl = HeRL(HeRLSection(enabled=True, candidate_limit=2), "")
    state, _ = herl.init(setup)
    r = _rollouts(setup)
    narrow = dataclasses.replace(r, met=r.met[:, :1])  # as if no row had reported its second item
    stub = _Stub([0.0, 0.0])
    herl.revise(state, narrow, StepInfo(1, np.arange(3), jax.random.key(0)), stub.sample, stub.score, stub.logprobs)
    contexts = stub.calls[0][1]
    assert contexts[0] == _encode(state.run.revise_prompt(0, np.array([True, False]), "draft 1"))
    assert contexts[1] == _encode(state.run.revise_prompt(2, np.array([False, False]), "draft 8"))


@pytest.mark.slow
def test_teacher_logprobs_equal_a_plain_forward_of_the_moved_rows(tmp_path):
    """The trainer's teacher-forced pass (HeRL train_on=original) over a few rows, padded to the most a step
    moves (4 here, not the step's 64 rows), equals the rows forward of the same tokens and temperatures."""
    from flax import nnx

    from tests.helpers import tiny_cfg

    from jaxrl_llm.rl.forward import rows_logp
    from jaxrl_llm.train.loop import Run

    run = Run(tiny_cfg(tmp_path), log=lambda *a: None)
    assert run.rows == 64
    rng = np.random.default_rng(0)
    prompts = [rng.integers(3, 60, size=n).tolist() for n in (5, 9, 3)]
    out = _out(prompts, [rng.integers(3, 60, size=n).tolist() for n in (4, 2, 6)], [1.0, 0.7, 1.3])
    got = run.teacher_logprobs(out, min_rows=4)
    assert set(run._logprobs) == {4}  # one pass of 4 rows, not the step's 64
    graphdef = run.policy.graphdef
    # jitted: op by op, the reference forward compiled a program per operation and shape
    forward = jax.jit(lambda params, tokens, temps: rows_logp(nnx.merge(graphdef, params), tokens, temps))
    want = np.asarray(forward(run.state.params, jnp.asarray(out.tokens), jnp.asarray(out.temperature)))
    assert got.shape == out.tokens.shape and (got[:, 0] == 0).all()
    np.testing.assert_allclose(got[:, 1:], want, rtol=0, atol=2e-5)


def _herl_trainer_cfg(tmp_path, *overrides):
    """The tiny model on rubric tasks it mostly fails, HeRL on, the policy judging the 'judge' items; ties at
    the group's best are kept (keep=at_least: a random model's revisions rarely beat its group), so that
    every step moves revisions through the update, trained at the rollout temperature (the default)."""
    from tests.helpers import tiny_cfg

    rows = [{"question": f"Q{i}", "rubric": [
        {"description": "a", "weight": 1, "check": "py:contains_all", "args": {"keywords": ["a"]}},
        {"description": "short", "weight": 1, "check": "py:max_words", "args": {"n": 1}},
        {"description": "kind", "weight": 1, "check": "judge"}]} for i in range(8)]
    data = tmp_path / "rubric.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return tiny_cfg(tmp_path, f"data.path={data}", "rollout.group_size=8",
                     "rollout.max_new_tokens=4", "algo.micro_batch=32", "explore.herl.enabled=true",
                     "explore.herl.candidate_limit=4", "explore.herl.replace_top_n=2", "explore.herl.keep=at_least",
                     "explore.herl.revise_template='Q {question} D {draft} M {met} U {unmet}'",
                     "train.steps=3", "train.checkpoint_every=100", "eval.every=100",
                     # the policy judges the 'judge' item (a random model never answers in JSON: parse failures)
                     "reward.judge=policy", "reward.judge_max_new_tokens=4",
                     "model.scratch={hidden_size: 32, intermediate_size: 64, num_layers: 1, num_heads: 2, "
                     "num_kv_heads: 1, head_dim: 16, max_position_embeddings: 1024, tie_embeddings: true}", *overrides)


@pytest.mark.slow
def test_herl_in_the_trainer_keeps_revisions_and_compiles_nothing_after_warmup(tmp_path):
    """Every step revises the failed groups' best responses through the real sampler (under a short
    template), scores them against the original rubrics, keeps some, recomputes their log-probs under the
    original prompt, and trains them with the hindsight loss; the step's programs are all compiled by
    step 2 (the judge's greedy calls included)."""
    from jaxrl_llm.train.loop import Run
    from tests.helpers import compilations, train_rows

    cfg = _herl_trainer_cfg(tmp_path)
    # an empty held-out set (every eval question also a training one) summarises without failing (and
    # compiles no evaluation programs: the held-out evaluation is tests/test_trainer.py's)
    cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, eval_path=cfg.data.path))
    logs = []
    Run(cfg, log=logs.append).train()
    assert any("no held-out problems were evaluated" in ln for ln in logs), logs
    got = train_rows(cfg.train.out_dir)
    assert all(got[s]["herl_failed_groups"] >= 1 and got[s]["herl_revisions"] == got[s]["herl_candidates"]
               for s in got)
    assert sum(got[s]["herl_kept"] for s in got) >= 1, got
    assert all(got[s]["sampled_tokens"] > got[s]["herl_sampled_tokens"] > 0 for s in got)
    # the step's metrics are the sampled rows' own: revisions (T = 0.3) in the trained batch do not move them
    assert all(got[s]["temperature"] == pytest.approx(cfg.rollout.temperature, abs=1e-6) for s in got), got
    assert all("herl_trained_reward_mean" in got[s] for s in got if got[s]["herl_kept"])
    # every scored row (the step's 32 and the revisions) asked the judge twice without a parsable verdict
    fails = [got[s]["judge_parse_failures"] for s in sorted(got)]
    assert fails[0] >= 32 and all(b - a >= 32 for a, b in zip(fails, fails[1:])), fails
    counts = compilations(cfg.train.out_dir)
    assert counts[1:] == [counts[1]] * (len(counts) - 1), counts
    # a resumed HeRL-only run (its explorer state has no arrays, so none is saved) carries on revising
    logs = []
    Run(dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, steps=4)), log=logs.append).train()
    assert any(ln.startswith("resumed from") for ln in logs), logs
    got = train_rows(cfg.train.out_dir)
    assert sorted(got) == [1, 2, 3, 4] and got[4]["herl_revisions"] == got[4]["herl_candidates"] >= 1


@pytest.mark.slow
def test_herl_trained_under_the_revise_prompt_compiles_nothing_after_warmup(tmp_path):
    """train_on=revise_prompt: kept revisions train under their revise prompts, so the update's context
    bucket holds the longest revise prompt for the whole run (one program), while the step's rows and
    held-out tasks are still sampled with their prompts' own prefill (the revise prompts go through
    HeRL's own sampler call; padding every prompt to the revise prompt's length once gave SmolLM2 runs
    a KV cache of 0.97 GiB instead of 0.37 and slower sampling and evaluation)."""
    from jaxrl_llm.sampling.buckets import bucket
    from jaxrl_llm.train.loop import Run
    from tests.helpers import compilations, train_rows

    cfg = _herl_trainer_cfg(tmp_path, "explore.herl.train_on=revise_prompt", "train.steps=3")
    run = Run(cfg, log=lambda *a: None)
    longest = max(len(ids) for _, ids in run.train_items)
    assert run.min_context == run.state.explore["herl"].run.guided_context > bucket(longest, 16)
    assert run.sampler.shapes(run.rows, longest, 4)[1] == bucket(longest, 16)
    run.train()
    got = train_rows(cfg.train.out_dir)
    assert sum(got[s]["herl_kept"] for s in got) >= 1, got
    assert all(got[s]["herl_revisions"] == got[s]["herl_candidates"] >= 1 for s in got), got
    counts = compilations(cfg.train.out_dir)
    assert counts[1:] == [counts[1]] * (len(counts) - 1), counts
