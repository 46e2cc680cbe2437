"""Worked reward functions for reward.functions, importable as "jaxrl_llm.rewards.examples:<name>".

Each is f(prompt, completion, item) -> float | dict[str, float] (rewards/functions.py says how they are called and
combined); configs/byot_functions.yaml trains with the first two. Copy one into a file of your own and name it as
"path/to/file.py:function".

    numeric_answer   GSM8K-style: the stated number against the gold one ("correct"), and whether it was
                     stated in the expected form ("format")
    length_penalty   DAPO-style soft overlong penalty: 0 up to a budget, falling linearly to -1 at its end
    rubric           a rubric written as a function: the weighted share of programmatic checks a response meets
"""

from __future__ import annotations

import re
from fractions import Fraction

_NUMBER = r"-?\d[\d,]*(?:\.\d+)?"
# "#### 42" (GSM8K's own), <answer>42</answer>, or a response that is nothing but the number
_STATED = [re.compile(rf"####\s*({_NUMBER})\s*$"), re.compile(rf"<answer>\s*({_NUMBER})\s*</answer>"),
           re.compile(rf"^\s*({_NUMBER})\s*$")]
_ANY = re.compile(_NUMBER)


def _value(text: str) -> Fraction | None:
    try:
        return Fraction(text.replace(",", ""))
    except (ValueError, ZeroDivisionError):
        return None


def numeric_answer(prompt: str, completion: str, item: dict) -> dict[str, float]:
    """{"correct": 1 when the response's answer equals the gold number (item["answer"], or the number after its
    last "####"), exactly as fractions; "format": 1 when that answer was stated as "#### n", <answer>n</answer>
    or alone}. Without a stated answer the last number in the response is read (format 0)."""
    gold_text = str(item["answer"]).rsplit("####", 1)[-1]
    found = _ANY.findall(gold_text)
    gold = _value(found[-1]) if found else None
    stated = next((m.group(1) for p in _STATED for m in [p.search(completion)] if m), None)
    loose = _ANY.findall(completion)
    answer = stated if stated is not None else (loose[-1] if loose else None)
    correct = gold is not None and answer is not None and _value(answer) == gold
    return {"correct": float(correct), "format": float(stated is not None)}


def length_penalty(prompt: str, completion: str, item: dict) -> float:
    """0 for a response of up to item["max_chars"] - item["cache_chars"] characters (defaults 400 and 100), then
    linearly down to -1 at max_chars and beyond: long answers cost, truncation is not the only signal."""
    limit, cache = float(item.get("max_chars", 400)), float(item.get("cache_chars", 100))
    over = len(completion) - (limit - cache)
    return -min(1.0, max(0.0, over / cache))


_HEDGES = re.compile(r"\b(maybe|perhaps|i think|not sure|probably)\b", re.IGNORECASE)


def rubric(prompt: str, completion: str, item: dict) -> float:
    """The weighted share of checks met: the response states a number (weight 2), uses at most
    item["max_words"] words (default 50; weight 1), does not hedge (weight 1), and contains every word of
    item["must_include"] (a list, or a comma-separated text; none by default; weight 2)."""
    words = completion.split()
    required = item.get("must_include", [])
    if isinstance(required, str):
        required = [w.strip() for w in required.split(",") if w.strip()]
    lowered = completion.lower()
    checks = [(2.0, bool(_ANY.search(completion))), (1.0, len(words) <= int(item.get("max_words", 50))),
              (1.0, not _HEDGES.search(completion)), (2.0, all(w.lower() in lowered for w in required))]
    return sum(w for w, met in checks if met) / sum(w for w, _ in checks)
