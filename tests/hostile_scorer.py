"""Scorers that stand for a hostile or broken one in the reward pool's sandbox tests (tests/test_reward_sandbox.py):
`run` executes its "answer" as Python, as reasoning-gym's eval-based scorers once did with a model's answer."""

import os


def run(code: str) -> float:
    exec(code, {})
    return 1.0


def environment(names: list) -> float:
    """1.0 when none of `names` is in the worker's environment."""
    return float(not any(n in os.environ for n in names))


if os.environ.get("JAXRL_TEST_DIE_ON_START"):  # the first starts of a worker die while importing this module
    counter = os.environ["JAXRL_TEST_DIE_ON_START"]
    with open(counter, "a+") as f:
        f.seek(0)
        starts = len(f.read())
        f.write("x")
    if starts < int(os.environ["JAXRL_TEST_DEATHS"]):
        os._exit(3)
