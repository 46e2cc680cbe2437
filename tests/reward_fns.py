"""Reward functions for tests/test_reward_functions.py, named there by file path ("<this file>:<function>") as a
user's reward.functions entries are: well-behaved ones, broken ones, and ones the start-up checks refuse."""

import time


def has_answer(prompt, completion, item):
    """1 when the gold answer appears in the response."""
    return float(item["answer"] in completion)


def parts(prompt, completion, item):
    """Two components whose values follow from the texts: the response's length, and whether the row's `target`
    column (TaskItem.extra) appears in it."""
    return {"chars": len(completion), "hit": float(item.get("target", "\0") in completion)}


def prompt_echo(prompt, completion, item):
    """1 when the prompt handed over is the question with the run's instruction."""
    return float(prompt == item["question"] + "\nSay it.")


def raises(prompt, completion, item):
    raise RuntimeError("broken reward")


def raises_in_training(prompt, completion, item):
    """Fails on tests/helpers.py tiny_cfg's training questions ("Question i"), never on its held-out ones."""
    if item["question"].startswith("Question"):
        raise RuntimeError("a training row")
    return 0.0


def not_finite(prompt, completion, item):
    return float("nan")


def too_big(prompt, completion, item):
    """Finite as a Python float, inf as float32 (the update's dtype)."""
    return 1e39


def not_a_number(prompt, completion, item):
    return "1.0"


def endless(prompt, completion, item):
    while True:
        time.sleep(0.01)


def two_args(prompt, completion):
    return 1.0


def trl_style(completions, **kwargs):
    return [0.0 for _ in completions]


NOT_CALLABLE = 3.0


def misses_answer(prompt, completion, item):
    """1 when the gold answer does not appear in the response (has_answer's complement)."""
    return float(item["answer"] not in completion)
