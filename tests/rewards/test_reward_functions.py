"""reward.functions: entries refused at config load and at start-up, failing calls scored 0 and counted, components
summed with their weights and logged, and a tiny run through the real trainer whose logged rewards follow from
the built-in scorer's."""

import json
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm.config import ConfigError, load_config
from jaxrl_llm.data.types import TaskItem
from jaxrl_llm.rewards import examples
from jaxrl_llm.rewards.functions import components, parse
from jaxrl_llm.rewards.pool import RewardPool
from jaxrl_llm.rewards.scoring import score_parts
from jaxrl_llm.rewards.types import Score
from jaxrl_llm.rl.advantages import group_advantages

FNS = str(Path(__file__).resolve().parents[1] / "reward_fns.py")


def _cfg(functions, *extra):
    return load_config(None, [f"reward.functions={json.dumps(functions)}", "data.answer_format=raw", *extra])


@pytest.mark.parametrize("functions,extra,message", [
    (["nocolon"], [], "reward.functions[0] ('nocolon') must be 'module:function'"),
    ([{"name": "a:f", "wieght": 2}], [], "unknown: ['wieght']"),
    ([{"name": "a:f", "weight": "heavy"}], [], "reward.functions[0] ('a:f'): weight must be a number in"),
    ([{"name": "a:f", "weight": 2e6}], [], "reward.functions[0] ('a:f'): weight must be a number in [-1e+06, 1e+06]"),
    ([{"name": "a:f", "weight": 10**400}], [], "weight must be a number in [-1e+06, 1e+06], got 1000"),
    (["a:f", "b.py:f"], [], "reward.functions[1] ('b.py:f'): a second function named 'f'"),
    (["a:f(x)"], [], "'f(x)' is not a function name"),
    ([], ["reward.builtin=false"], "reward.builtin=false needs reward.functions"),
    (["a:f"], ["reward.builtin=false"], "set reward.correctness"),
])
def test_entries_refused_at_config_load(functions, extra, message):
    with pytest.raises(ConfigError) as e:
        _cfg(functions, *extra)
    assert message in str(e.value), str(e.value)


def test_functions_refused_at_start_up_naming_the_entry(tmp_path):
    broken = tmp_path / "broken.py"
    broken.write_text("import no_such_module_anywhere\n")
    cases = {f"{FNS}:nope": "has no attribute 'nope'", f"{FNS}:two_args": "cannot be called as f(prompt, completion",
             f"{FNS}:trl_style": "cannot be called as f(prompt, completion", f"{FNS}:NOT_CALLABLE": "not a function",
             "no_such_module_anywhere:f": "cannot import 'no_such_module_anywhere': ModuleNotFoundError",
             f"{broken}:f": "ModuleNotFoundError: No module named 'no_such_module_anywhere'",
             f"{tmp_path}/missing.py:f": "FileNotFoundError"}
    for spec, why in cases.items():
        with pytest.raises(ValueError) as e:  # in the trainer's process, before any worker starts
            RewardPool(1, 1.0, functions=[f"{FNS}:has_answer", spec])
        assert str(e.value).startswith(f"reward.functions[1] ({spec!r}): ") and why in str(e.value), str(e.value)
        assert "\n" not in str(e.value)
    # importable in the trainer, not in a worker (its private folder): the worker's start-up says so
    picky = tmp_path / "picky.py"
    picky.write_text("import os\nif 'jaxrl-reward-' in os.getcwd():\n    raise ImportError('not here')\n"
                     "def f(prompt, completion, item):\n    return 1.0\n")
    with RewardPool(1, 1.0, functions=[f"{picky}:f"]) as pool:
        with pytest.raises(RuntimeError, match=r"could not prepare .*reward.functions\[0\].*ImportError: not here"):
            pool.map([("exact", "1", "", "1", "raw")])


def _brute(cfg_weights, builtin, texts, items, row_item, prompt_suffix=""):
    """The rows' rewards from the functions' definitions in reward_fns.py, written out here."""
    out = []
    for text, j in zip(texts, row_item):
        it = items[j]
        target = json.loads(it.extra or "{}").get("target", "\0")
        has, chars, hit = float(it.answer in text), len(text), float(target in text)
        out.append(builtin * float(text.strip().lower() == it.answer.lower()) + cfg_weights[0] * has
                   + cfg_weights[1] * (chars + hit))
    return np.array(out, np.float32)


def test_components_weighted_and_failures_scored_zero_and_counted():
    items = [TaskItem("a", "Q1", "7", "exact", extra=json.dumps({"target": "x"})), TaskItem("b", "Q2", "8", "exact")]
    texts, row_item = ["7", "x 8", " 8 "], np.array([0, 0, 1])
    good = [f"{FNS}:has_answer", {"name": f"{FNS}:parts", "weight": 0.5}, f"{FNS}:prompt_echo"]
    bad = [f"{FNS}:raises", f"{FNS}:not_finite", f"{FNS}:not_a_number", f"{FNS}:endless", f"{FNS}:too_big"]
    cfg = _cfg(good + bad, "data.instruction=Say it.")
    with RewardPool(2, 0.5, scorers=["exact"], functions=cfg.reward.functions) as pool:
        s = score_parts(pool, cfg, items, texts, row_item)
        assert s.fn_errors == 5 * 3 and pool.stats.timeouts == 3 and pool.stats.errors == 12
        np.testing.assert_allclose(s.rewards, _brute((1.0, 0.5), 1.0, texts, items, row_item) + 1.0, rtol=1e-6)
        np.testing.assert_array_equal(s.components["builtin"], [1, 0, 1])  # exact match of the stripped response
        m = s.metrics()
        assert m["reward/chars"] == pytest.approx(np.mean([1, 3, 3])) and m["reward/hit"] == pytest.approx(1 / 3)
        assert m["reward/has_answer"] == pytest.approx(2 / 3) and m["reward/prompt_echo"] == 1.0
        assert m["reward_fn_errors"] == 15 and "reward.functions[" in m["reward_fn_last_error"]
        np.testing.assert_array_equal(s.correct, [True, False, True])  # the built-in scorer's full marks
        assert pool.map([("exact", "7", "", "7", "raw")]) == [Score(1.0)]  # the pool serves on
    # the functions alone, accuracy from one of their components
    cfg = _cfg(good, "data.instruction=Say it.", "reward.builtin=false", "reward.correctness=hit")
    with RewardPool(1, 5.0, functions=cfg.reward.functions) as pool:
        s = score_parts(pool, cfg, items, texts, row_item)
    np.testing.assert_allclose(s.rewards, _brute((1.0, 0.5), 0.0, texts, items, row_item) + 1.0, rtol=1e-6)
    np.testing.assert_array_equal(s.correct, [False, True, False])
    assert s.fn_errors == 0 and "builtin" not in s.components and "reward_fn_last_error" not in s.metrics()


def _advantages(rewards):
    n = len(rewards)
    return np.asarray(group_advantages(jnp.asarray(np.array(rewards, np.float32)), jnp.zeros(n, jnp.int32),
                                       jnp.ones(n, bool), estimator="grpo", num_groups=1))


@pytest.mark.parametrize("value,accepted", [(1e6, True), (-1e6, True), (1e6 * (1 + 1e-15), False), (1e39, False),
                                            (10**400, False), (float("-inf"), False), ({"a": 1.0, "b": 3e38}, False)])
def test_values_past_the_limit_are_refused_naming_the_function(value, accepted):
    """A value finite as a Python float can be inf as float32 (1e39), or square to inf in the group statistics
    (3e38): one such row would make its group's advantages NaN and skip the whole step. Past 1e6 it is refused (the
    pool scores it 0 and counts it), naming the function; an int past float's range too, not an OverflowError."""
    fn = parse([f"{FNS}:too_big"])[0]
    if accepted:
        assert components(fn, value) == {"too_big": value}
        assert np.isfinite(_advantages([value, 0.0, value, 0.0])).all()
        return
    if isinstance(value, float) and abs(value) > 1e30:  # what the refusal prevents
        with np.errstate(over="ignore"):  # the float32 cast is the overflow shown
            assert np.isnan(_advantages([value, 0.0, value, 0.0])).all()
    with pytest.raises(ValueError, match=r"^reward.functions\[0\] .* not a finite number in \[-1e\+06, 1e\+06\]"):
        components(fn, value)


def test_worked_examples():
    gold = {"answer": "Natalia sold 48 + 24 = 72 clips.\n#### 1,072"}
    assert examples.numeric_answer("", "so 1072 in all\n#### 1072", gold) == {"correct": 1.0, "format": 1.0}
    assert examples.numeric_answer("", "she sold 1,072 clips.", gold) == {"correct": 1.0, "format": 0.0}
    assert examples.numeric_answer("", "<answer>1071</answer>", gold) == {"correct": 0.0, "format": 1.0}
    assert examples.numeric_answer("", "no idea", {"answer": "0.5"}) == {"correct": 0.0, "format": 0.0}
    assert examples.numeric_answer("", "1/2 = 0.50", {"answer": "0.5"})["correct"] == 1.0
    item = {"max_chars": 10, "cache_chars": 4}
    assert [examples.length_penalty("", "x" * n, item) for n in (6, 7, 8, 10, 30)] == [0.0, -0.25, -0.5, -1.0, -1.0]
    assert examples.length_penalty("", "x" * 300, {}) == 0.0 and examples.length_penalty("", "x" * 350, {}) == -0.5
    need = {"must_include": "cat, dog", "max_words": 5}
    assert examples.rubric("", "cat and dog: 2", need) == 1.0
    assert examples.rubric("", "maybe a cat and a dog, 2 of them", need) == pytest.approx(4 / 6)  # long, hedges
    assert examples.rubric("", "a dog", need) == pytest.approx(2 / 6)  # no number, no cat


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    from tests.helpers import tiny_cfg

    from jaxrl_llm.train.loop import Run

    functions = [{"name": f"{FNS}:has_answer", "weight": 0.5}, {"name": f"{FNS}:misses_answer", "weight": 0.25},
                 f"{FNS}:raises"]
    cfg = tiny_cfg(tmp_path_factory.mktemp("fn_run"), "train.steps=2", f"reward.functions={json.dumps(functions)}")
    Run(cfg, log=lambda *a: None).train()
    return [json.loads(ln) for ln in (Path(cfg.train.out_dir) / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_a_run_logs_rewards_that_follow_from_the_built_in_scorer(tiny_run):
    """The task's answer is "7" and responses are one character, so has_answer is the exact scorer's verdict and
    misses_answer its complement: every logged figure follows from the built-in accuracy. `raises` fails on every
    row, is counted, and the run goes on."""
    train = [r for r in tiny_run if r["kind"] == "train"]
    assert [r["step"] for r in train] == [1, 2]
    for r in train:
        acc = r["accuracy"]
        assert r["reward/builtin"] == pytest.approx(acc, abs=1e-6) and r["reward/has_answer"] == pytest.approx(acc)
        assert r["reward/misses_answer"] == pytest.approx(1 - acc, abs=1e-6) and 0 < 1 - acc
        assert r["reward_mean"] == pytest.approx(1.5 * acc + 0.25 * (1 - acc), abs=1e-5)
        assert r["reward_fn_errors"] == 64 and "raised RuntimeError: broken reward" in r["reward_fn_last_error"]
    evals = [r for r in tiny_run if r["kind"] == "eval"]
    assert len(evals) == 2
    for r in evals:
        for p in ("greedy", "sampled"):
            acc = r[f"{p}_accuracy"]
            assert r[f"{p}_reward/has_answer"] == pytest.approx(acc, abs=1e-6)
            assert r[f"{p}_reward_mean"] == pytest.approx(1.5 * acc + 0.25 * (1 - acc), abs=1e-5)
            assert r[f"{p}_reward_fn_errors"] == 8 * (1 if p == "greedy" else 2)
