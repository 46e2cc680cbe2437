"""Answer extraction and scoring: reasoning-gym's own scorers, math-verify, exact match.

Runs inside reward worker processes; every function here is pure and picklable by name.
"""

from __future__ import annotations

import json
import re

_TAGS = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_NUMBER = re.compile(r"-?\d+(?:,\d{3})*(?:\.\d+)?")

# reasoning-gym data sets whose own scorer gives wrong rewards, scored with math-verify against the entry's
# answer instead. gsm_symbolic: its regex r"\b-?\d+" finds no word boundary before a leading "-", so it reads
# "-5" as 5 (a right negative answer scores 0.01, "-5" scores 1 against 5); test_rewards notices a fix upstream.
_MATH_VERIFY_INSTEAD = frozenset({"gsm_symbolic"})


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
    if "math" in scorers or gym & _MATH_VERIFY_INSTEAD:
        _math_verify("1", "1")
    if gym - _MATH_VERIFY_INSTEAD:
        import reasoning_gym

        for name in gym - _MATH_VERIFY_INSTEAD:
            reasoning_gym.get_score_answer_fn(name)


def score(scorer: str, answer: str, entry_json: str, response: str, fmt: str) -> float | tuple[float, list[int]]:
    """The reward of `response`; rubric tasks (scorer "rubric", entry_json the rubric) give (reward, items met)
    and grade the whole response (no answer extraction)."""
    if scorer == "rubric":
        from jaxrl_llm.rewards.rubrics import score_rubric

        return score_rubric(entry_json, response)
    extracted = extract_answer(response, fmt)
    if extracted is None:
        return 0.0
    if scorer.startswith("reasoning_gym:"):
        name = scorer.split(":", 1)[1]
        if name in _MATH_VERIFY_INSTEAD:
            return _math_verify(str(json.loads(entry_json)["answer"]), extracted)
        import reasoning_gym

        fn = reasoning_gym.get_score_answer_fn(name)
        return float(fn(extracted, json.loads(entry_json)))
    if scorer == "math":
        return _math_verify(answer, extracted)
    return float(extracted.strip().lower() == answer.strip().lower())
