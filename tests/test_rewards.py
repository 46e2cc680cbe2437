"""Reward checks: extraction, reasoning-gym / math-verify scorers, and a pool that survives bad checkers."""

import time

import pytest

from jaxrl_llm.rewards.pool import RewardPool
from jaxrl_llm.rewards.verifiers import extract_answer, render_answer, score


def flaky(kind: str) -> float:
    if kind == "hang":
        time.sleep(60)
    if kind == "raise":
        raise RuntimeError("broken checker")
    return 1.0


@pytest.mark.parametrize("text,fmt,want", [
    ("so <answer> 47 </answer>", "tags", "47"), ("no tags 47", "tags", None),
    ("a \\boxed{\\frac{1}{2}} b", "boxed", "\\frac{1}{2}"), ("it is 1,234 or 5.5", "last_number", "5.5"),
    ("  47\n", "raw", "47"), ("none", "last_number", None),
])
def test_extract(text, fmt, want):
    assert extract_answer(text, fmt) == want
    if want is not None and fmt in ("tags", "raw"):
        assert extract_answer(render_answer(want, fmt), fmt) == want


def test_scorers():
    import json
    import reasoning_gym
    entry = reasoning_gym.create_dataset("basic_arithmetic", size=1, seed=3)[0]
    ej = json.dumps(entry, default=str)
    assert score("reasoning_gym:basic_arithmetic", entry["answer"], ej, f"<answer>{entry['answer']}</answer>", "tags") == 1.0
    assert score("reasoning_gym:basic_arithmetic", entry["answer"], ej, "<answer>99999</answer>", "tags") == 0.0
    assert score("math", "1/2", "", "<answer>0.5</answer>", "tags") == 1.0
    assert score("math", "1/2", "", "<answer>0.6</answer>", "tags") == 0.0
    assert score("exact", "Paris", "", "paris", "raw") == 1.0


def test_pool_survives_hangs_and_errors():
    with RewardPool(workers=2, timeout_s=1.0, fn=flaky) as pool:
        t0 = time.monotonic()
        out = pool.map([("ok",), ("hang",), ("raise",), ("ok",), ("hang",), ("ok",)])
        elapsed = time.monotonic() - t0
        assert out == [1.0, 0.0, 0.0, 1.0, 0.0, 1.0]
        assert pool.stats.timeouts == 2 and pool.stats.errors == 1 and "broken checker" in pool.stats.last_error
        assert elapsed < 10
        assert pool.map([("ok",)] * 4) == [1.0] * 4  # replaced workers serve the next batch


def test_a_workers_start_is_not_timed_against_its_first_items():
    """Workers take 2 s to start (their scorer's module imports slowly) and items have 0.5 s each: every item
    scores. Timing the start against the first item once made each fresh worker time out, and each replaced
    worker start over: every item scored 0."""
    import importlib

    fn = importlib.import_module("slow_start_scorer").quick
    with RewardPool(workers=2, timeout_s=0.5, fn=fn) as pool:
        assert pool.map([(i,) for i in range(6)]) == [float(i) for i in range(6)]
        assert pool.stats.timeouts == 0 and pool.stats.errors == 0


def test_a_scorer_that_cannot_be_prepared_stops_the_pool_with_its_name():
    with RewardPool(workers=1, timeout_s=5.0, scorers=["reasoning_gym:no_such_dataset"]) as pool:
        with pytest.raises(RuntimeError, match=r"reasoning_gym:no_such_dataset.*not registered"):
            pool.map([("exact", "1", "", "1", "raw")])


def test_gsm_symbolic_keeps_the_minus_sign():
    import json
    import reasoning_gym
    real = reasoning_gym.create_dataset("gsm_symbolic", size=1, seed=0)[0]
    neg, pos = dict(real, answer="-5"), dict(real, answer="5")

    def ours(entry, text):
        return score("reasoning_gym:gsm_symbolic", entry["answer"], json.dumps(entry, default=str),
                     f"<answer>{text}</answer>", "tags")

    assert ours(neg, "-5") == 1.0 and ours(neg, "5") == 0.0
    assert ours(pos, "5") == 1.0 and ours(pos, "-5") == 0.0
    assert ours(real, real["answer"]) == 1.0 and ours(real, f"-{real['answer']}") == 0.0
    # the reason for the replacement: upstream's regex r"\b-?\d+" finds no word boundary before a leading "-"
    # and reads "-5" as 5
    upstream = reasoning_gym.get_score_answer_fn("gsm_symbolic")
    wrong = {"-5 vs -5": upstream("-5", neg), "-5 vs 5": upstream("-5", pos)}
    assert wrong["-5 vs -5"] < 1.0 or wrong["-5 vs 5"] == 1.0, \
        f"reasoning-gym's gsm_symbolic scorer now reads negative answers ({wrong}): remove it from " \
        "verifiers._MATH_VERIFY_INSTEAD"
