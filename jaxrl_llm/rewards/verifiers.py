"""Answer extraction and scoring: reasoning-gym's own scorers, math-verify, exact match.

Runs inside reward worker processes; every function here is pure and picklable by name.

A model's answer is adversarial, and some reasoning-gym scorers run it as Python: spiral_matrix, binary_matrix,
string_insertion and n_queens call eval(answer); countdown, puzzle24, polynomial_multiplication,
simple_integration and intermediate_integration call sympy's parse_expr(answer), which evals too (reasoning-gym
0.1.19; grep eval( / exec( / parse_expr / sympify). countdown and puzzle24 are scored here instead (`OWN_SCORERS`:
the answer parsed with `ast`, numbers and + - * / and parentheses only, evaluated exactly with fractions); the
others are refused by name (`REFUSED`, `check_gym_tasks`) at load and in the workers. math-verify is safe: it
hands sympy's parse_expr only what its regex lets through (digits, operators and parentheses) and parses LaTeX
with its own grammar.
"""

from __future__ import annotations

import ast
import json
import operator
import re
from fractions import Fraction

from jaxrl_llm.rewards.types import Score

_TAGS = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_NUMBER = re.compile(r"-?\d+(?:,\d{3})*(?:\.\d+)?")

# reasoning-gym data sets whose own scorer gives wrong rewards, scored with math-verify against the entry's
# answer instead. gsm_symbolic: its regex r"\b-?\d+" finds no word boundary before a leading "-", so it reads
# "-5" as 5 (a right negative answer scores 0.01, "-5" scores 1 against 5); test_rewards notices a fix upstream.
_MATH_VERIFY_INSTEAD = frozenset({"gsm_symbolic"})


_EVAL, _PARSE_EXPR = "its scorer runs the answer through eval()", \
    "its scorer parses the answer with sympy's parse_expr, which runs it through eval()"
REFUSED = {"spiral_matrix": _EVAL, "binary_matrix": _EVAL, "string_insertion": _EVAL, "n_queens": _EVAL,
           "polynomial_multiplication": _PARSE_EXPR, "simple_integration": _PARSE_EXPR,
           "intermediate_integration": _PARSE_EXPR}
_INTS = re.compile(r"\b\d+\b")  # the numbers an answer uses, as reasoning-gym's countdown and puzzle24 read them
_ARITHMETIC = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def arithmetic_value(expr: str) -> Fraction:
    """The exact value of an expression of numbers, + - * / and parentheses; ValueError (or SyntaxError,
    ZeroDivisionError) for anything else, so nothing in `expr` ever runs."""
    def value(node) -> Fraction:
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return Fraction(node.value)
        if isinstance(node, ast.BinOp) and type(node.op) in _ARITHMETIC:
            return _ARITHMETIC[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
            return value(node.operand) if isinstance(node.op, ast.UAdd) else -value(node.operand)
        raise ValueError(f"{type(node).__name__} is not part of an arithmetic expression")

    return value(ast.parse(expr.strip(), mode="eval").body)


def _countdown(answer: str, entry: dict) -> float:
    """reasoning-gym's countdown scorer, its answer parsed by `arithmetic_value`: 1.0 when the answer uses exactly
    the given numbers and comes within numpy.isclose of the target, 0.05 when it is an expression that does not,
    0.01 when it is none (sympy-only syntax such as 4! or 2**3 included)."""
    try:
        value = float(arithmetic_value(answer))
    except Exception:
        return 0.01
    meta = entry["metadata"]
    if sorted(int(n) for n in _INTS.findall(answer)) != sorted(meta["numbers"]):
        return 0.05
    return 1.0 if abs(value - meta["target"]) <= 1e-6 + 1e-5 * abs(meta["target"]) else 0.05


def _puzzle24(answer: str, entry: dict) -> float:
    """1.0 when the answer uses exactly the given numbers and equals 24, else 0.01. Stricter than reasoning-gym's
    scorer, whose int(value) == 24 also accepts values in (24, 25) and which accepts any four numbers in the
    config's range, not only the given ones: both are rewards a policy finds."""
    try:
        value = arithmetic_value(answer)
    except Exception:
        return 0.01
    used = sorted(int(n) for n in _INTS.findall(answer))
    return 1.0 if value == 24 and used == sorted(entry["metadata"]["numbers"]) else 0.01


OWN_SCORERS = {"countdown": _countdown, "puzzle24": _puzzle24}


def check_gym_tasks(names) -> None:
    """ValueError naming each reasoning-gym task in `names` whose scorer would run a model's answer as code."""
    bad = sorted(set(names) & set(REFUSED))
    if bad:
        raise ValueError("; ".join(f"reasoning-gym task {n!r} is refused: {REFUSED[n]}, so a model's answer could "
                                   f"run any command as the trainer's user" for n in bad)
                         + f". Tasks that run answers as code and are scored safely here: {sorted(OWN_SCORERS)}")


def _boxed(text: str) -> str | None:
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 1, start + len("\\boxed{")
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i:j]
    return None


def extract_answer(response: str, fmt: str) -> str | None:
    """The answer part of a response, or None when the response has none in the expected format."""
    if fmt == "tags":
        found = _TAGS.findall(response)
        return found[-1].strip() if found else None
    if fmt == "boxed":
        return _boxed(response)
    if fmt == "last_number":
        found = _NUMBER.findall(response)
        return found[-1].replace(",", "") if found else None
    return response.strip()


def render_answer(answer: str, fmt: str) -> str:
    """A reference answer written in the expected format (for SFT targets)."""
    return {"tags": f"<answer>{answer}</answer>", "boxed": f"\\boxed{{{answer}}}"}.get(fmt, answer)


def _math_verify(gold: str, extracted: str) -> float:
    from math_verify import parse, verify

    return float(bool(verify(parse(f"${gold}$"), parse(f"${extracted}$"))))


def prepare(scorers) -> None:
    """Import and load what `scorers` (TaskItem.scorer names) need, so a worker's first item costs no more
    than its others: rubric checkers (if-verifiable, nupunkt's sentence model, langdetect's profiles),
    math-verify, reasoning-gym's scorer of each data set named."""
    scorers = set(scorers)
    if "rubric" in scorers:
        from jaxrl_llm.rewards.rubrics import prepare_checks

        prepare_checks()
    gym = {s.split(":", 1)[1] for s in scorers if s.startswith("reasoning_gym:")}
    check_gym_tasks(gym)
    if "math" in scorers or gym & _MATH_VERIFY_INSTEAD:
        _math_verify("1", "1")
    if gym - _MATH_VERIFY_INSTEAD - set(OWN_SCORERS):
        import reasoning_gym

        for name in gym - _MATH_VERIFY_INSTEAD - set(OWN_SCORERS):
            reasoning_gym.get_score_answer_fn(name)


def score(scorer: str, answer: str, entry_json: str, response: str, fmt: str) -> Score:
    """The Score of `response`: its reward; rubric tasks (scorer "rubric", entry_json the rubric) also give the
    items met and grade the whole response (no answer extraction)."""
    if scorer == "rubric":
        from jaxrl_llm.rewards.rubrics import score_rubric

        return score_rubric(entry_json, response)
    return Score(_answer_reward(scorer, answer, entry_json, response, fmt))


def _answer_reward(scorer: str, answer: str, entry_json: str, response: str, fmt: str) -> float:
    extracted = extract_answer(response, fmt)
    if extracted is None:
        return 0.0
    if scorer.startswith("reasoning_gym:"):
        name = scorer.split(":", 1)[1]
        check_gym_tasks([name])
        if name in OWN_SCORERS:
            return OWN_SCORERS[name](extracted, json.loads(entry_json))
        if name in _MATH_VERIFY_INSTEAD:
            return _math_verify(str(json.loads(entry_json)["answer"]), extracted)
        import reasoning_gym

        fn = reasoning_gym.get_score_answer_fn(name)
        return float(fn(extracted, json.loads(entry_json)))
    if scorer == "math":
        return _math_verify(answer, extracted)
    return float(extracted.strip().lower() == answer.strip().lower())
