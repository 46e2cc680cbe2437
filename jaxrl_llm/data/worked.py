"""Worked solutions written step by step, for tasks whose generator does not ship one.

`data.worked: steps` gives every reasoning-gym `basic_arithmetic` item (operators + and - only, no
parentheses) a reference that evaluates the expression left to right, one operation per line:

    Calculate 12 + 7 - 30.   ->   12+7=19
                                   19-30=-11

The last number is the answer (use `data.answer_format: last_number`). SFT then teaches the policy a
multi-step format whose responses can be cut at line ends: the prefix states RRL replays
(ALGORITHMS.md §3), and the per-step success that tools/step_success.py measures.
"""

from __future__ import annotations

import re

import numpy as np

_TERM = re.compile(r"\s*([+-])?\s*(\d+)\s*")
WORKED = ("", "steps")


def parse_terms(expression: str) -> list[int]:
    """Signed terms of a + / - expression of non-negative integers, e.g. '4 - 1 + 7' -> [4, -1, 7].
    Raises ValueError on anything else (parentheses, other operators, a leading sign)."""
    terms, pos = [], 0
    while pos < len(expression):
        m = _TERM.match(expression, pos)
        if m is None or m.end() == pos or (m.group(1) is None) != (not terms):
            raise ValueError(f"not a sum of non-negative integers: {expression!r}")
        terms.append(int(m.group(2)) * (-1 if m.group(1) == "-" else 1))
        pos = m.end()
    if not terms:
        raise ValueError(f"empty expression: {expression!r}")
    return terms


def steps(expression: str) -> list[tuple[str, int]]:
    """[(line, running value)] of the left-to-right evaluation, one line per operation."""
    terms = parse_terms(expression)
    value, lines = terms[0], []
    if len(terms) == 1:
        return [(f"{value}", value)]
    for t in terms[1:]:
        new = value + t
        lines.append((f"{value}{'+' if t >= 0 else '-'}{abs(t)}={new}", new))
        value = new
    return lines


def worked_solution(task: str, entry: dict, kind: str) -> str:
    """The reference solution of a reasoning-gym entry in the style `kind` ('' gives '')."""
    if not kind:
        return ""
    if kind != "steps" or task != "basic_arithmetic":
        raise ValueError(f"data.worked={kind!r} is not defined for the reasoning-gym task {task!r} "
                         f"(known: 'steps' for basic_arithmetic with + and -)")
    return "\n".join(line for line, _ in steps(entry["metadata"]["expression"]))


def first_error(response: str, expression: str) -> int:
    """Index (0-based) of the first line of `response` that is not the worked solution's line there,
    or the number of steps when every step is right. Lines are compared without spaces; a missing
    line is an error."""
    want = [line for line, _ in steps(expression)]
    got = [line.replace(" ", "") for line in response.strip().splitlines()]
    for k, line in enumerate(want):
        if k >= len(got) or got[k] != line:
            return k
    return len(want)


def step_profile(responses: list[str], expressions: list[str], correct: list[bool]) -> dict:
    """Per-step success along the responses (each answers expressions[i]; correct[i]: its reward said
    solved): reach_k = share of responses whose first k steps are all right, cond_k = share of those
    reaching step k-1 that get step k right, first_error_k = share of the FAILED responses whose first
    wrong step is k (1-based), late_failure_share = share of failed responses with at least one right
    step before the error (states RRL can replay)."""
    first = np.array([first_error(r, e) for r, e in zip(responses, expressions)])
    n_steps = np.array([len(steps(e)) for e in expressions])
    correct = np.asarray(correct, bool)
    out: dict = {"responses": len(first), "accuracy": float(correct.mean()) if len(first) else 0.0}
    for k in range(1, int(n_steps.max(initial=0)) + 1):
        has = n_steps >= k
        reach = (first >= k) & has
        prev = ((first >= k - 1) & has)
        out[f"reach_{k}"] = float(reach.sum() / max(has.sum(), 1))
        out[f"cond_{k}"] = float(reach.sum() / max(prev.sum(), 1))
    failed = ~correct
    for k in range(1, int(n_steps.max(initial=0)) + 1):
        out[f"first_error_{k}"] = float(((first == k - 1) & failed).sum() / max(failed.sum(), 1))
    out["failed_all_steps_right"] = float(((first >= n_steps) & failed).sum() / max(failed.sum(), 1))
    out["late_failure_share"] = float(((first >= 1) & failed).sum() / max(failed.sum(), 1))
    return out
