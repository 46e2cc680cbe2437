"""Reward checks: extraction, reasoning-gym / math-verify scorers, and a pool that survives bad checkers."""

import re
import time

import pytest

from jaxrl_llm.rewards.pool import RewardPool
from jaxrl_llm.rewards.types import FAILED, Score
from jaxrl_llm.rewards.verifiers import OWN_SCORERS, REFUSED, extract_answer, render_answer, score


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
    assert score("reasoning_gym:basic_arithmetic", entry["answer"], ej, f"<answer>{entry['answer']}</answer>", "tags") == Score(1.0)
    assert score("reasoning_gym:basic_arithmetic", entry["answer"], ej, "<answer>99999</answer>", "tags") == Score(0.0)
    assert score("math", "1/2", "", "<answer>0.5</answer>", "tags") == Score(1.0)
    assert score("math", "1/2", "", "<answer>0.6</answer>", "tags") == Score(0.0)
    assert score("exact", "Paris", "", "paris", "raw") == Score(1.0)


def test_pool_survives_hangs_and_errors():
    with RewardPool(workers=2, timeout_s=1.0, fn=flaky) as pool:
        t0 = time.monotonic()
        out = pool.map([("ok",), ("hang",), ("raise",), ("ok",), ("hang",), ("ok",)])
        elapsed = time.monotonic() - t0
        assert out == [Score(1.0), FAILED, FAILED, Score(1.0), FAILED, Score(1.0)]  # a bare number is its reward
        assert pool.stats.timeouts == 2 and pool.stats.errors == 1
        assert elapsed < 10
        assert pool.map([("raise",)]) == [FAILED] and "broken checker" in pool.stats.last_error
        assert pool.map([("ok",)] * 4) == [Score(1.0)] * 4  # replaced workers serve the next batch


def test_a_workers_start_is_not_timed_against_its_first_items():
    """Workers take 2 s to start (their scorer's module imports slowly) and items have 0.5 s each: every item
    scores. Timing the start against the first item once made each fresh worker time out, and each replaced
    worker start over: every item scored 0."""
    import importlib

    fn = importlib.import_module("tests.slow_start_scorer").quick
    with RewardPool(workers=2, timeout_s=0.5, fn=fn) as pool:
        assert pool.map([(i,) for i in range(6)]) == [Score(float(i)) for i in range(6)]
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
                     f"<answer>{text}</answer>", "tags").reward

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


# ---- answers are adversarial: no scorer runs them as code ---------------------------------------------------------

def _pwned(path) -> str:
    return f"<answer>__import__('os').system('touch {path}')</answer>"


def _entry_json(name, seed=0):
    import json
    import reasoning_gym
    entry = reasoning_gym.create_dataset(name, size=1, seed=seed)[0]
    return entry, json.dumps(entry, default=str)


@pytest.mark.parametrize("name", sorted(OWN_SCORERS))
def test_a_pwned_answer_runs_nothing_through_the_pool(name, tmp_path):
    """reasoning-gym's own scorer of these tasks runs the answer (the first assertion shows it); ours, through the
    real pool, scores the same answer without running it."""
    import reasoning_gym
    entry, ej = _entry_json(name)
    upstream = tmp_path / "upstream"
    reasoning_gym.get_score_answer_fn(name)(_pwned(upstream)[8:-9], entry)
    assert upstream.exists()
    ours = tmp_path / "ours"
    with RewardPool(workers=1, timeout_s=10.0, scorers=[f"reasoning_gym:{name}"]) as pool:
        out = pool.map([(f"reasoning_gym:{name}", entry["answer"], ej, _pwned(ours), "tags"),
                        (f"reasoning_gym:{name}", entry["answer"], ej, f"<answer>{entry['answer']}</answer>", "tags")])
    assert out == [Score(0.01), Score(1.0)] and not ours.exists()


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_tasks_that_run_answers_are_refused_by_name(name, tmp_path):
    from jaxrl_llm.config import load_config
    from jaxrl_llm.data.tasks import load_items

    cfg = load_config(None, [f"data.task={name}", "data.train_size=2", "data.eval_size=0"])
    with pytest.raises(ValueError, match=rf"task '{name}' is refused: its scorer .*eval.*'countdown', 'puzzle24'"):
        load_items(cfg.data, "train")
    with RewardPool(workers=1, timeout_s=5.0, scorers=[f"reasoning_gym:{name}"]) as pool:
        with pytest.raises(RuntimeError, match=rf"could not prepare .*'{name}' is refused"):
            pool.map([("exact", "1", "", "1", "raw")])
    with RewardPool(workers=1, timeout_s=5.0) as pool:  # a job naming it, in a pool that did not prepare it
        assert pool.map([(f"reasoning_gym:{name}", "", "{}", _pwned(tmp_path / "p"), "tags")]) == [FAILED]
        assert pool.stats.errors == 1 and "is refused" in pool.stats.last_error
    assert not (tmp_path / "p").exists()


# reviewed: these score_answer methods evaluate the entry's own answer (our generated data), never the model's
_EVALS_ONLY_THE_ENTRY = {"number_sorting"}


def test_every_reasoning_gym_scorer_that_evaluates_is_listed():
    """A new reasoning-gym release whose scorer evals, execs or sympy-parses text fails here until it is refused,
    scored here, or reviewed."""
    import inspect
    import re
    from reasoning_gym.factory import DATASETS

    evaluating = {name for name, (cls, _) in DATASETS.items()
                  if re.search(r"\b(eval|exec|parse_expr|sympify)\(", inspect.getsource(cls.score_answer))}
    assert evaluating == set(REFUSED) | set(OWN_SCORERS) | _EVALS_ONLY_THE_ENTRY


def _expressions(rng, numbers, k):
    out = []
    for _ in range(k):
        nums = list(numbers)
        rng.shuffle(nums)
        if rng.random() < 0.15:
            nums = nums[:-1] if rng.random() < 0.5 else nums + [rng.randint(1, 10)]
        text = str(nums[0])
        for n in nums[1:]:
            op = rng.choice("+-*/")
            text = f"({text}) {op} {n}" if rng.random() < 0.4 else f"{text}{op}{n}"
        out.append(text)
    return out + ["", "abc", "3 +", "1/0", "2*3", "(1", "-" + str(numbers[0]), f"{numbers[0]}.5"]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["countdown", "puzzle24"])
def test_own_scorers_agree_with_reasoning_gym(name):
    """Our countdown and puzzle24 scorers against reasoning-gym's own (run here on benign answers only), right and
    wrong answers alike. puzzle24 differs where reasoning-gym's is exploitable, and only there: it reads int(value),
    so values in (24, 25) pass, and it takes any four numbers in range, not only the given ones."""
    import random
    from fractions import Fraction
    import reasoning_gym
    from jaxrl_llm.rewards.verifiers import arithmetic_value

    rng = random.Random(0)
    ds = reasoning_gym.create_dataset(name, size=25, seed=1)
    checked = differ = 0
    for entry in ds:
        answers = [entry["answer"], *_expressions(rng, entry["metadata"]["numbers"], 12)]
        if name == "puzzle24":
            answers += ["6*4*1*1", "7*7/2*1", "(8+4)*2*1"]
        for answer in answers:
            want = ds.score_answer(answer, entry) if answer else 0.01
            got = OWN_SCORERS[name](answer, entry)
            checked += 1
            if name == "puzzle24" and got != want:
                value = arithmetic_value(answer)
                used = sorted(int(n) for n in re.findall(r"\b\d+\b", answer))
                assert (want, got) == (1.0, 0.01), answer
                assert (24 < value < 25) or used != sorted(entry["metadata"]["numbers"]), answer
                differ += 1
                continue
            assert got == want, (answer, entry["metadata"])
    assert checked > 300 and (name == "countdown" or differ >= 25)
    assert OWN_SCORERS[name](entry["answer"], entry) == 1.0 and arithmetic_value("7/2-1") == Fraction(5, 2)
