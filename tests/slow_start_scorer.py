"""A scorer whose module takes 2 s to import: a reward worker that unpickles it starts slowly, as one
importing if-verifiable, math-verify or reasoning-gym does on a busy machine (tests/test_rewards.py)."""

import time

time.sleep(2.0)


def quick(x: int) -> float:
    return float(x)
