"""Test-time revise rounds without a model: the round bookkeeping (who is sent back, improved / worse shares,
best so far, tokens) against a brute-force replay of every answer on its own; the revise prompts are
HeRL's; the context floor and the config refuse what cannot run. A real model's rounds:
tests/test_evaluate.py."""

import json

import numpy as np
import pytest

from jaxrl_llm.config import ConfigError, HeRLSection, load_config
from jaxrl_llm.data.types import TaskItem
from jaxrl_llm.explore.base import Setup
from jaxrl_llm.explore.herl import HeRL
from jaxrl_llm.train.revise_eval import Answers, RevisePrompts, call_shape, eval_prompts, run_rounds

LEVELS = np.array([0.0, 0.25, 0.5, 1.0])


def _brute(first, graded, table, lengths, rounds):
    """Each answer replayed on its own: sent back while graded and under 1; the figures by counting."""
    m = len(first)
    history = [[float(x)] for x in first]
    sent = {r: [] for r in range(1, rounds + 1)}
    figures = {}
    for r in range(1, rounds + 1):
        improved = worse = tokens = 0
        for i in range(m):
            now = history[i][-1]
            if graded[i] and now < 1.0:
                sent[r].append(i)
                new = float(table[r - 1, i])
                improved += new > now
                worse += new < now
                tokens += int(lengths[r - 1, i])
                history[i].append(new)
        last = [h[-1] for h in history]
        figures.update({f"r{r}_accuracy": sum(x == 1.0 for x in last) / m, f"r{r}_reward_mean": sum(last) / m,
                        f"r{r}_sent": len(sent[r]) / m, f"r{r}_improved": improved / m, f"r{r}_worse": worse / m,
                        f"r{r}_tokens": tokens})
    figures["best_accuracy"] = sum(max(h) == 1.0 for h in history) / m
    figures["best_reward_mean"] = sum(max(h) for h in history) / m
    return figures, sent


@pytest.mark.parametrize("seed", range(6))
def test_round_bookkeeping_matches_brute_force(seed):
    rng = np.random.default_rng(seed)
    m, rounds = 20, 3
    first = rng.choice(LEVELS, size=m).astype(np.float32)
    graded = rng.random(m) < 0.8  # the rest are answer tasks: never sent back, whatever their reward
    table = rng.choice(LEVELS, size=(rounds, m)).astype(np.float32)  # the reward answer i gets in round r
    lengths = rng.integers(1, 9, size=(rounds, m))
    calls = []

    def revise(r, rows, drafts):
        # the drafts are the answers as they stand: the first, or the one the row got in its last round
        for j, i in enumerate(rows):
            last = [q for q, c in calls if i in c[0]]
            assert drafts.texts[j] == (f"{i}@{last[-1]}" if last else f"{i}@0")
            assert drafts.rewards[j] == (table[last[-1] - 1, i] if last else first[i])
            assert drafts.met[j].tolist() == [drafts.rewards[j] >= 0.5, drafts.rewards[j] >= 1.0]
        calls.append((r, (rows.tolist(),)))
        new = table[r - 1, rows]
        texts = tuple(f"{i}@{r}" for i in rows)
        return Answers(new, np.stack([new >= 0.5, new >= 1.0], 1), texts), lengths[r - 1, rows]

    met = np.stack([first >= 0.5, first >= 1.0], 1)
    got = run_rounds(Answers(first, met, tuple(f"{i}@0" for i in range(m))), graded, rounds, revise)
    want, sent = _brute(first, graded, table, lengths, rounds)
    assert got.keys() == want.keys()
    for k in want:
        assert got[k] == pytest.approx(want[k], abs=1e-9), k
    # revise is called only for rounds with something to send, with exactly the graded answers under full marks
    assert [(r, c[0]) for r, c in calls] == [(r, s) for r, s in sent.items() if s]
    assert all(first[i] < 1.0 and graded[i] for i in sent[1])
    # full marks are kept once reached, so the last round's accuracy is the best-so-far accuracy
    assert got[f"r{rounds}_accuracy"] == got["best_accuracy"]


def test_nothing_to_send_samples_nothing():
    first = Answers(np.array([1.0, 0.0], np.float32), np.array([[True], [False]]), ("a", "b"))

    def revise(*_):
        raise AssertionError("no answer should be sent back")

    # answer 0 has full marks; answer 1 is an answer task (not graded)
    got = run_rounds(first, np.array([True, False]), 2, revise)
    assert got == {"r1_accuracy": 0.5, "r1_reward_mean": 0.5, "r1_sent": 0.0, "r1_improved": 0.0, "r1_worse": 0.0,
                   "r1_tokens": 0, "r2_accuracy": 0.5, "r2_reward_mean": 0.5, "r2_sent": 0.0, "r2_improved": 0.0,
                   "r2_worse": 0.0, "r2_tokens": 0, "best_accuracy": 0.5, "best_reward_mean": 0.5}


RUBRIC = [{"description": "Say A.", "weight": 1, "check": "py:contains_all", "args": {"keywords": ["A"]}},
          {"description": "Say B.", "weight": 2, "check": "py:contains_all", "args": {"keywords": ["B"]}}]


def _items():
    return [TaskItem(uid="r0", question="Question 0", answer="", scorer="rubric", rubric=json.dumps(RUBRIC)),
            TaskItem(uid="x1", question="1+1?", answer="2", scorer="exact"),
            TaskItem(uid="r2", question="Question two is longer", answer="", scorer="rubric",
                     rubric=json.dumps(RUBRIC[:1]))]


def _encode(text):
    return [ord(ch) % 97 + 3 for ch in text]


def test_revise_prompts_are_herls():
    items, template = _items(), HeRLSection().revise_template
    prompts = RevisePrompts(template, "Be brief.", items, _encode)
    assert prompts.graded.tolist() == [True, False, True] and prompts.width == 2
    herl = HeRL(HeRLSection(enabled=True), instruction="Be brief.")
    herl_run = herl.init(Setup(num_items=3, prompts_per_step=1, group_size=2, rows=2, total_steps=1, steps_per_epoch=1,
                               vocab_size=100, temperature=1.0, item_difficulty=np.zeros(3, np.float32), items=items,
                               prompts=[[1]] * 3, max_new_tokens=8, encode=_encode))[0].run
    for item, met in ((0, [True, False]), (0, [False, False]), (2, [False])):
        # the evaluation's met vectors are as wide as the widest rubric: columns past an item's rubric are ignored
        padded = np.array(met + [True] * (2 - len(met)))
        assert prompts.text(item, padded, "my draft") == herl_run.revise_prompt(item, np.array(met), "my draft")
    text = prompts.text(0, np.array([True, False]), "my draft")
    assert "Question 0\nBe brief." in text and "my draft" in text
    assert "- Say A." in text.split("It does not")[0] and "- Say B." in text.split("It does not")[1]
    # the floor: the longest revise prompt (item 2's longer question, or item 0's two items) with a full draft
    longest = max(len(_encode(prompts.text(i, np.zeros(2, bool), ""))) for i in (0, 2))
    assert prompts.context_floor(40, 10_000) == 1 << (longest + 40 - 1).bit_length()
    assert longest + 40 + 1 > 300
    with pytest.raises(ValueError, match=r"eval.revise_rounds: the revise prompt of item r[02] is \d+ tokens .* 300 "
                                         r"positions"):
        prompts.context_floor(40, 300)
    # a revision gets the first answers' 40 tokens or the rounds are refused (the sampler cut it short before)
    assert prompts.context_floor(40, longest + 80) == prompts.context_floor(40, 10_000)
    with pytest.raises(ValueError, match=r"leaves less than the 40 tokens of a first answer to revise"):
        prompts.context_floor(40, longest + 79)


def test_config_refuses_bad_rounds_and_templates():
    assert load_config(None, []).eval.revise_rounds == 0
    with pytest.raises(ConfigError, match=r"eval.revise_rounds=-1 must be >= 0"):
        load_config(None, ["eval.revise_rounds=-1"])
    # the template is the one training uses: checked when either needs it, before anything is built
    with pytest.raises(ConfigError, match=r"explore.herl.revise_template has no \{unmet\}"):
        load_config(None, ["eval.revise_rounds=1", "explore.herl.revise_template='{question} {draft} {met}'"])
    with pytest.raises(ConfigError, match=r"revise_template does not format .*KeyError: 'answer'"):
        load_config(None, ["eval.revise_rounds=1",
                           "explore.herl.revise_template='{question} {draft} {met} {unmet} {answer}'"])
    bad = "explore.herl.revise_template='{question} {draft} {met} {unmet} {answer}'"
    assert load_config(None, [bad]).eval.revise_rounds == 0  # unused: neither HeRL nor revise rounds read it


def test_rounds_run_only_with_rubric_tasks_and_keep_one_call_shape():
    on = ["eval.revise_rounds=2", "rollout.prompts_per_step=2", "rollout.group_size=4", "rollout.max_new_tokens=40"]
    assert eval_prompts(load_config(None, on[1:]), _items(), _encode) is None  # eval.revise_rounds=0
    assert eval_prompts(load_config(None, on), [_items()[1]], _encode) is None  # answer tasks only
    cfg = load_config(None, on)
    prompts = eval_prompts(cfg, _items(), _encode)
    assert prompts.graded.tolist() == [True, False, True]
    # the rollout batch's rows, the floor for drafts of rollout.max_new_tokens (eval.max_new_tokens when set)
    assert call_shape(cfg, prompts, 10_000) == (8, prompts.context_floor(40, 10_000))
    longer = load_config(None, on + ["eval.max_new_tokens=400"])
    shape = call_shape(longer, prompts, 10_000)
    assert shape == (8, prompts.context_floor(400, 10_000)) and shape != call_shape(cfg, prompts, 10_000)
