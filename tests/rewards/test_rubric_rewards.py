"""Rubric tasks in the trainer's reward step: rows with a `rubric` load as rubric tasks,
`data.source: rubric` generates them, and the reward pool grades them in its worker processes: reward
sum w m / sum w (never thresholded), the items met per row, answer tasks unchanged beside them, a
failed job scoring 0 with nothing met; 'judge' items are decided by the judge (a stub generator here,
the policy through the sampler in a run with reward.judge=policy) and refused without one."""

import dataclasses
import json

import numpy as np
import pytest

from jaxrl_llm.config import load_config
from jaxrl_llm.data.tasks import load_items, load_splits
from jaxrl_llm.data.types import DataError, TaskItem
from jaxrl_llm.rewards.pool import RewardPool
from jaxrl_llm.rewards.scoring import score_rows, score_texts

RUBRIC = [{"description": "No commas.", "weight": 1, "check": "ifeval:punctuation:no_comma"},
          {"description": "At most 5 words.", "weight": 3, "check": "py:max_words", "args": {"n": 5}},
          {"description": "Mention a cat.", "weight": 0, "check": "py:contains_all", "args": {"keywords": ["cat"]}}]


def _cfg(tmp_path, rows, *extra):
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return load_config(None, ["data.source=jsonl", f"data.path={path}", "data.answer_format=last_number",
                              "reward.partial_credit=false", *extra]), path


def test_rubric_rows_load_and_bad_items_name_the_row(tmp_path):
    cfg, path = _cfg(tmp_path, [{"question": "Say hi.", "rubric": RUBRIC},
                                {"question": "1+1?", "answer": "2", "scorer": "exact"}])
    rub, plain = load_items(cfg.data, "train")
    assert rub.scorer == "rubric" and json.loads(rub.rubric) == json.loads(rub.entry_json)
    assert [it["check"] for it in json.loads(rub.rubric)] == [r["check"] for r in RUBRIC] and rub.answer == ""
    assert plain.scorer == "exact" and plain.rubric == ""
    cfg, path = _cfg(tmp_path, [{"question": "Q", "rubric": [{"description": "d", "weight": 1, "check": "py:nope"}]}])
    with pytest.raises(DataError, match=r"row 0 item 0"):
        load_items(cfg.data, "train")


def test_generated_rubric_tasks_split_by_combination():
    cfg = load_config(None, ["data.source=rubric", "data.train_size=40", "data.eval_size=20"])
    train, held = load_splits(cfg.data)
    assert len(train) == 40 and held and all(it.scorer == "rubric" for it in train + held)
    combos = lambda items: {tuple(sorted(i["check"] for i in json.loads(it.rubric))) for it in items}  # noqa: E731
    assert not (combos(train) & {c for c in combos(held) if len(c) > 1})


@pytest.mark.slow
def test_pool_grades_rubrics_beside_answer_tasks(tmp_path):
    cfg, _ = _cfg(tmp_path, [{"question": "Say hi.", "rubric": RUBRIC}])
    rub = load_items(cfg.data, "train")[0]
    plain = TaskItem(uid="p", question="1+1?", answer="2", scorer="exact")
    items = [rub, plain]
    texts = ["a cat sat", "one, two, three, four, five, six", "", "the answer is 2", "3"]
    row_item = np.array([0, 0, 0, 1, 1])
    with RewardPool(1, 10.0, scorers=[it.scorer for it in items]) as pool:  # if-verifiable loaded before timing
        rewards, met = score_rows(pool, cfg, items, texts, row_item)
        assert pool.stats.errors == 0
        np.testing.assert_allclose(rewards, [1.0, 0.0, 0.0, 1.0, 0.0])  # weights 1, 3, 0: (1 + 3) / 4, then 0
        np.testing.assert_array_equal(met, [[1, 1, 1], [0, 0, 0], [0, 0, 0], [0, 0, 0], [0, 0, 0]])
        rewards, _ = score_rows(pool, cfg, items, ["a, cat"], np.array([0]))
        assert rewards[0] == pytest.approx(3 / 4)  # a fraction even with partial_credit off
        assert score_texts(pool, cfg, items, ["a, cat"], np.array([0]))[0] == pytest.approx(0.75)
        # answer tasks alone: no items-met matrix
        assert score_rows(pool, cfg, items, ["2"], np.array([1]))[1] is None
    broken = dataclasses.replace(rub, entry_json="not json")
    with RewardPool(1, 10.0, scorers=["rubric", "exact"]) as pool:
        rewards, met = score_rows(pool, cfg, [broken, plain], ["x", "2"], np.array([0, 1]))
        assert pool.stats.errors == 1 and rewards.tolist() == [0.0, 1.0] and not met.any()


@pytest.mark.slow
def test_judge_items_are_decided_by_the_judge_and_refused_without_one(tmp_path):
    from jaxrl_llm.rewards.judge import Judge

    judged = RUBRIC + [{"description": "Kind.", "weight": 4, "check": "judge"},
                       {"description": "Calm.", "weight": 2, "check": "judge"}]
    cfg, path = _cfg(tmp_path, [{"question": "Say hi.", "rubric": judged}])
    items = load_items(cfg.data, "train")
    asked = []

    def generate(prompts, temperature=0.0, seed=0):
        asked.extend(prompts)
        return ["Verdict: [1, 0]" if "a cat" in p else "no idea" for p in prompts]

    judge = Judge(generate)
    with RewardPool(1, 10.0, scorers=["rubric"]) as pool:
        rewards, met = score_rows(pool, cfg, items, ["a cat sat", "one, two"], np.array([0, 0]), judge)
        # row 0: no comma, 3 words, cat, judged kind yes / calm no: (1 + 3 + 0 + 4) / 10; row 1: a comma, 2 words,
        # and the judge answers nothing usable twice: its items score 0 and count as a parse failure: 3 / 10
        np.testing.assert_allclose(rewards, [0.8, 0.3], rtol=1e-6)
        np.testing.assert_array_equal(met, [[1, 1, 1, 1, 0], [0, 1, 0, 0, 0]])
        assert judge.parse_failures == 1 and len(asked) == 3 and "Kind." in asked[0] and "No commas." not in asked[0]
        no_judge, _ = score_rows(pool, cfg, items, ["a cat sat"], np.array([0]))
        assert no_judge[0] == pytest.approx(0.4)  # judge items unmet without a judge

    from tests.helpers import tiny_cfg

    from jaxrl_llm.train.loop import Run

    cfg, path = _cfg(tmp_path, [{"question": f"Say hi {i}.", "rubric": judged} for i in range(8)])
    run_cfg = tiny_cfg(tmp_path / "run", f"data.path={path}")
    with pytest.raises(ValueError, match="rubric items checked by 'judge'.*reward.judge=policy"):
        Run(run_cfg, log=lambda *a: None)
