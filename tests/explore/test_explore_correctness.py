"""The explorers read the run's "solved" (Rollouts.correct, from the Scores), not full marks of the total reward.

A reward function whose total is >= 1 on some wrong rows (a format bonus) and < 1 on some right ones (a length
penalty), with reward.builtin=false and reward.correctness=correct: rows scored by the real `score` (reward
pool and all), then E3's difficulty ranks and RRL's per-prompt trackers, solved / unsolved prompts and stored
states are checked against a brute-force recomputation from the texts, and against what the total would have
given (so each check can fail). Without reward functions the rows carry exactly what the explorers read
before (the reward as scored), and evaluation's revise rounds send back what `correct` calls unsolved.
"""

import json

import jax
import numpy as np
import pytest

from jaxrl_llm.config import E3Section, RRLSection, load_config
from jaxrl_llm.data.types import TaskItem
from jaxrl_llm.explore.base import Setup, StepInfo
from jaxrl_llm.explore.e3 import E3
from jaxrl_llm.explore.rows import RowPlan, Rollouts
from jaxrl_llm.explore.rrl import BY_FRESH, NEVER, RRL
from jaxrl_llm.model.char_tokenizer import char_tokenizer
from jaxrl_llm.parallel.hosts import to_host
from jaxrl_llm.rewards.pool import RewardPool
from jaxrl_llm.sampling.sampler import FINISH_STOP, SampleOutput
from jaxrl_llm.train.revise_eval import Answers, run_rounds
from jaxrl_llm.train.rollout import score

P, B, N_PER = 8, 6, 4  # training items, prompts this step (items 6 and 7 unseen), rows per prompt
FN = '''
def graded(prompt, completion, item):
    bonus = 1.0 if "**" in completion else 0.0  # a format bonus a wrong answer can earn
    penalty = 0.6 if len(completion) > 12 else 0.0  # a length penalty a right answer can pay
    return {"correct": float("Z" + item["answer"] in completion), "bonus": bonus - penalty}
'''
# per prompt, its 4 rows as (right, bold, long): totals 1.4 (right, bold, long), 0.4 (right, long), 1.0 (wrong, bold)
DESIGN = [[(1, 0, 1)] * 4,  # all right, every total 0.4: solved, though no total reaches 1
          [(0, 1, 0)] * 4,  # all wrong, every total 1.0: unsolved, though every total is full marks
          [(1, 0, 0)] * 2 + [(0, 0, 0)] * 2,
          [(1, 1, 1)] + [(0, 0, 1)] * 3,
          [(1, 0, 1)] * 3 + [(0, 1, 0)],
          [(0, 0, 0)] * 4]


def _text(row: int, prompt: int, right: int, bold: int, long: int) -> str:
    # the first two characters name the row, so a stored prefix says which response it was cut from
    return f"{row:02d}" + (f"Z{prompt}" if right else "no") + ("**" if bold else "") + ("." * 10 if long else "")


@pytest.fixture(scope="module")
def step(tmp_path_factory):
    """The step's plan, items, texts and the rows `score` made of them, with reward functions and without."""
    folder = tmp_path_factory.mktemp("fns")
    (folder / "fns.py").write_text(FN)
    tok = char_tokenizer()
    items = [TaskItem(f"u{j}", f"Q{j}", str(j), "exact") for j in range(P)]  # read as the text's last number
    plan = RowPlan.groups([N_PER] * B, 1.0, jax.random.key(0), prompt_ids=np.arange(B))
    texts = [_text(i, int(plan.prompt[i]), *DESIGN[plan.prompt[i]][i % N_PER]) for i in range(plan.rows)]
    ids = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    width = 2 + max(map(len, ids)) + 1
    tokens = np.zeros((plan.rows, width), np.int32)
    for i, row in enumerate(ids):
        tokens[i, :2 + len(row)] = [1, 1] + row
    n = plan.rows
    out = SampleOutput(tokens=tokens, prompt_len=np.full(n, 2, np.int32), prefix_len=np.zeros(n, np.int32),
                       num_generated=np.array([len(r) for r in ids], np.int32),
                       logprobs=np.zeros(tokens.shape, np.float32), entropy=np.ones(tokens.shape, np.float32),
                       finish_reason=np.full(n, FINISH_STOP), temperature=plan.temperature)
    with_fns = load_config(None, [f"reward.functions={json.dumps([str(folder / 'fns.py') + ':graded'])}",
                                  "reward.builtin=false", "reward.correctness=correct"])
    plain = load_config(None, ["data.answer_format=last_number"])
    scored = {}
    for name, cfg in (("fns", with_fns), ("plain", plain)):
        with RewardPool(1, 5.0, scorers=["exact"], functions=cfg.reward.functions) as pool:
            scored[name] = score(pool, tok, cfg, items, plan, out)
    right = np.array([f"Z{plan.prompt[i]}" in t for i, t in enumerate(texts)])  # brute force: the answer is there
    return {"plan": plan, "texts": texts, "tok": tok, "right": right, **scored}


def _setup(**kw) -> Setup:
    return Setup(**{**dict(num_items=P, prompts_per_step=B, group_size=N_PER, rows=B * N_PER, total_steps=10,
                           steps_per_epoch=10, vocab_size=128, temperature=1.0, max_new_tokens=32), **kw})


def _rate(plan: RowPlan, x: np.ndarray) -> np.ndarray:
    """[P] each prompt's mean of x over its rows (NaN unseen)."""
    return np.array([x[plan.prompt == p].mean() if (plan.prompt == p).any() else np.nan for p in range(P)])


def _ranks(mean: np.ndarray) -> np.ndarray:
    """Difficulty ranks by brute force: hardest 1, unseen (NaN) below every seen prompt, ties at their mean place."""
    key = np.where(np.isnan(mean), np.inf, -mean)
    return np.array([(np.sum(key < k) + np.sum(key <= k) - 1) / (2 * (P - 1)) for k in key])


def test_scores_disagree_with_the_total_as_designed(step):
    r = step["fns"]
    np.testing.assert_array_equal(r.correct, step["right"])
    np.testing.assert_array_equal(r.success, step["right"].astype(np.float32))  # the 0/1 component, clipped
    full = r.rewards >= 1.0 - 1e-6
    assert (full & ~r.correct).sum() == 5 and (~full & r.correct).sum() == 7  # the premise of every check below
    moved = Rollouts.concat([r.take(np.arange(12, 24)), r.take(np.arange(12))])  # carried through cuts and joins
    np.testing.assert_array_equal(moved.correct, np.roll(r.correct, 12))
    swapped = r.replace_rows([0], r.take([5]))
    assert swapped.correct[0] == r.correct[5] and swapped.success[0] == r.success[5]


def test_e3_ranks_follow_correct_not_the_total(step):
    r, plan = step["fns"], step["plan"]
    e3 = E3(E3Section(enabled=True, rank_every=1, temperature=False))
    state, _ = e3.init(_setup())
    info = StepInfo(step=1, prompt_ids=np.arange(B), key=jax.random.key(1))
    new, metrics = e3.observe(state, r, info)
    want = _ranks(_rate(plan, step["right"].astype(float)))
    np.testing.assert_allclose(to_host(new.rank), want, atol=1e-6)
    assert not np.allclose(want, _ranks(_rate(plan, np.minimum(r.rewards, 1.0))))  # the total ranks otherwise
    np.testing.assert_array_equal(to_host(new.reward_sum), np.bincount(plan.prompt, step["right"], P))
    # every prompt was unseen (rank 0.5, quintile 3): the step's accuracy there is the share right
    assert metrics["e3_accuracy_q3"] == pytest.approx(step["right"].mean())


def test_rrl_solved_prompts_and_states_follow_correct(step):
    r, plan, tok = step["fns"], step["plan"], step["tok"]
    rrl = RRL(RRLSection(enabled=True, boundary="tokens", every_tokens=2, capacity=64, warmup_steps=0))
    state, _ = rrl.init(_setup())
    new, metrics = rrl.observe(state, r, StepInfo(step=1, prompt_ids=np.arange(B), key=jax.random.key(1)))
    rate = _rate(plan, step["right"].astype(float))
    np.testing.assert_allclose(to_host(new.last_success), np.nan_to_num(rate, nan=-1.0), atol=1e-7)
    np.testing.assert_array_equal(to_host(new.fresh_solved), np.bincount(plan.prompt, step["right"], P))
    np.testing.assert_array_equal(to_host(new.first_solved), np.where(rate > 0, BY_FRESH, NEVER))
    assert metrics["rrl_prompts_solved"] == int(np.sum(rate > 0))
    unsolved = {p for p in range(B) if rate[p] < 0.5}
    assert unsolved == {1, 3, 5} and unsolved != {p for p in range(B) if _rate(plan, r.rewards >= 1 - 1e-6)[p] < 0.5}
    replay = new.replay
    held = np.flatnonzero(to_host(replay.length) > 0)
    assert len(held) and {int(p) for p in to_host(replay.prompt)[held]} == unsolved
    tokens, length, prior = to_host(replay.tokens), to_host(replay.length), to_host(replay.prior)
    for s in held:  # each state: a prefix of the named row's response, its prior that row's success (0 or 1)
        text = tok.decode(tokens[s, :length[s]].tolist())
        row = int(text[:2])
        assert step["texts"][row].startswith(text) and plan.prompt[row] == to_host(replay.prompt)[s]
        assert prior[s] == float(step["right"][row])


def test_without_functions_the_rows_carry_the_reward_as_before(step):
    r = step["plain"]
    np.testing.assert_array_equal(r.rewards, step["right"])  # the built-in scorer: the last number is the answer
    np.testing.assert_array_equal(r.correct, r.rewards >= 1.0 - 1e-6)
    assert r.success is r.scored  # what E3 and RRL averaged before: the very array
    # rows built without Scores (graded rewards, as partial credit or a rubric gives) default the same way, and
    # E3 sums and RRL stores the rewards themselves, not their full marks
    plan = step["plan"]
    graded = (np.arange(plan.rows) % 5 / 4).astype(np.float32)  # 0, .25, .5, .75, 1: exact in float32 sums
    rows = Rollouts(plan, r.out, graded, r.texts)
    np.testing.assert_array_equal(rows.correct, graded >= 1.0 - 1e-6)
    info = StepInfo(step=1, prompt_ids=np.arange(B), key=jax.random.key(1))
    e3 = E3(E3Section(enabled=True, rank_every=1, temperature=False))
    new, _ = e3.observe(e3.init(_setup())[0], rows, info)
    np.testing.assert_array_equal(to_host(new.reward_sum), np.bincount(plan.prompt, graded, P).astype(np.float32))
    np.testing.assert_allclose(to_host(new.rank), _ranks(_rate(plan, graded)), atol=1e-6)
    rrl = RRL(RRLSection(enabled=True, boundary="tokens", every_tokens=2, capacity=64, unsolved_below=1.1))
    new, _ = rrl.observe(rrl.init(_setup())[0], rows, info)
    held = np.flatnonzero(to_host(new.replay.length) > 0)
    rows_of = [int(step["tok"].decode(to_host(new.replay.tokens)[s, :2].tolist())) for s in held]
    np.testing.assert_array_equal(to_host(new.replay.prior)[held], graded[rows_of])


def test_revise_rounds_send_back_what_correct_calls_unsolved():
    """An answer a bonus lifts to 1.2 but wrong is sent back; a right one a penalty holds at 0.4 is not."""
    rewards = np.array([1.2, 0.4, 0.0, 1.0], np.float32)
    correct = np.array([False, True, False, True])
    met = np.zeros((4, 1), bool)
    sent_log = []

    def revise(r, rows, drafts):
        sent_log.append(rows.tolist())
        n = len(rows)  # every revision right from round 2 on, scored 0.3 (a total under 1)
        return Answers(np.full(n, 0.3, np.float32), np.ones((n, 1), bool), ("x",) * n, np.full(n, r >= 2)), \
            np.ones(n, np.int64)

    got = run_rounds(Answers(rewards, met, tuple("abcd"), correct), np.ones(4, bool), 2, revise)
    assert sent_log == [[0, 2], [0, 2]]
    assert got["r1_accuracy"] == 0.5 and got["r2_accuracy"] == 1.0 and got["best_accuracy"] == 1.0
    assert got["r1_reward_mean"] == pytest.approx((0.3 + 0.4 + 0.3 + 1.0) / 4)
    assert got["best_reward_mean"] == pytest.approx((1.2 + 0.4 + 0.3 + 1.0) / 4)
    # without a `correct`, full marks of the reward decide (what the rounds did before reward functions)
    sent_log.clear()
    run_rounds(Answers(rewards, met, tuple("abcd")), np.ones(4, bool), 1, revise)
    assert sent_log == [[1, 2]]
