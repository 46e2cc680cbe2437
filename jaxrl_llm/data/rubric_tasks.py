"""Rubric tasks: an offline, seeded generator of instruction-following tasks and the jsonl loader.

Generated tasks are a short writing instruction followed by 1-3 verifiable constraints; each constraint is one
rubric item (weight 1) checked by an if-verifiable checker (rewards/rubrics.py) with sampled arguments, and its
plain-words description is also the sentence appended to the instruction. The held-out split tests
composition: its tasks use constraint combinations (sets of checker ids) that training never uses. Single
constraints and about 80% of the combinations of two or three (chosen by a hash of their ids, so the split is the
same for every seed and size) are for training; the other combinations are held out.

File schema (one JSON object per line): `question` (str, required), `rubric` (a list of {description, weight,
check, args?} items, required; see rewards/rubrics.py), `answer` and `reference` (str, optional).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import itertools
from pathlib import Path
from typing import Callable

import numpy as np

from jaxrl_llm.data.task_files import read_rows
from jaxrl_llm.data.types import DataError
from jaxrl_llm.rewards.rubrics import IFEVAL, RubricError, parse_rubric

BASE_INSTRUCTIONS = (
    "Describe a lighthouse at night.", "Write a short story about a lost umbrella.",
    "Explain how a bicycle works to a child.", "Write a letter to your future self.",
    "Describe the smell of rain in a city.", "Give advice to someone starting to learn the piano.",
    "Write a product description for a wooden chair.", "Describe a busy market in the morning.",
    "Explain why the sky looks blue.", "Write a thank-you note to a neighbour.",
    "Describe your ideal weekend.", "Write a short review of an imaginary restaurant.",
    "Explain how to make a cup of tea.", "Describe a winter forest.",
    "Write a short speech for a school sports day.", "Tell the story of a cat who learns to swim.",
    "Describe the view from a mountain top.", "Explain the water cycle.",
    "Write an invitation to a garden party.", "Describe an old library.",
    "Give tips for staying focused while studying.", "Write a short fable about a fox and a crow.",
    "Describe a train journey through the countryside.", "Explain how plants grow from seeds.",
    "Write a travel guide entry for a small island.", "Describe a thunderstorm over the sea.",
    "Write a diary entry of a first day at a new job.", "Explain what makes a good friend.",
    "Describe a street musician playing at dusk.", "Write a short poem about the moon.",
    "Explain how to plan a picnic.", "Describe the inside of a clockmaker's shop.",
    "Write a note asking a friend to water your plants.", "Describe a desert at sunrise.",
    "Explain why sleep is important.", "Write a short biography of an imaginary inventor.",
    "Describe a village festival.", "Give directions from a station to a museum.",
    "Write a welcome message for a hiking club.", "Describe a snowy bus stop late in the evening.",
)

_WORDS = ("silver", "window", "river", "quiet", "journey", "garden", "lantern", "morning", "harbor", "stone",
          "echo", "shadow", "bright", "warm", "distant", "gentle")
_FORBIDDEN = ("very", "really", "just", "thing", "stuff", "nice", "good", "beautiful", "amazing", "basically")
_END_PHRASES = ("Is there anything else I can help with?", "Any other questions?", "That is all for now.",
                "Thank you for reading.")
_LETTERS = "zqxjkvw"
EVAL_SHARE_PERCENT = 20
_SIZE_WEIGHTS = {1: 0.2, 2: 0.4, 3: 0.4}  # how often a task has 1, 2 or 3 constraints (eval has no single ones)


def _pick(rng: np.random.Generator, options):
    return options[int(rng.integers(len(options)))]


def _plural(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _two(rng: np.random.Generator, options) -> tuple[str, str]:
    a, b = rng.choice(len(options), size=2, replace=False)
    return options[int(a)], options[int(b)]


def _relation(rng, less: tuple[int, ...], least: tuple[int, ...]) -> tuple[int, str]:
    return (_pick(rng, less), "less than") if rng.random() < 0.5 else (_pick(rng, least), "at least")


def _number_words(rng, base):
    n, rel = _relation(rng, (60, 100, 150), (30, 50, 80))
    return {"num_words": n, "relation": rel}, f"Use {'fewer than' if rel == 'less than' else 'at least'} {n} words."


def _number_sentences(rng, base):
    n, rel = _relation(rng, (3, 4, 6), (3, 4, 5))
    return ({"num_sentences": n, "relation": rel},
            f"Write {'fewer than' if rel == 'less than' else 'at least'} {n} sentences.")


def _capital_words(rng, base):
    n, rel = _relation(rng, (2, 4), (2, 3, 4))
    return ({"capital_frequency": n, "capital_relation": rel},
            f"Write {'fewer than' if rel == 'less than' else 'at least'} {n} words entirely in capital letters.")


def _keywords(rng, base):
    a, b = _two(rng, _WORDS)
    return {"keywords": [a, b]}, f'Include the words "{a}" and "{b}".'


def _forbidden(rng, base):
    a, b = _two(rng, _FORBIDDEN)
    return {"forbidden_words": [a, b]}, f'Do not use the words "{a}" or "{b}".'


def _frequency(rng, base):
    word, n = _pick(rng, _WORDS), int(rng.integers(2, 4))
    return {"keyword": word, "frequency": n, "relation": "at least"}, f'Use the word "{word}" at least {n} times.'


def _letters(rng, base):
    letter, n = _pick(rng, _LETTERS), int(rng.integers(2, 5))
    return ({"letter": letter, "let_frequency": n, "let_relation": "at least"},
            f'Use the letter "{letter}" at least {n} times.')


def _paragraphs(rng, base):
    n = int(rng.integers(2, 5))
    return {"num_paragraphs": n}, f"Write exactly {n} paragraphs and separate them with the markdown divider ***."


def _bullets(rng, base):
    n = int(rng.integers(2, 6))
    return ({"num_bullets": n}, f'Include exactly {n} markdown bullet points, each on its own line starting with '
            f'"* ", and no other lines that start with "*" or "-".')


def _highlights(rng, base):
    n = int(rng.integers(1, 4))
    return ({"num_highlights": n},
            f"Highlight at least {_plural(n, 'part')} with markdown, for example *a highlighted part*.")


def _placeholders(rng, base):
    n = int(rng.integers(1, 3))
    return ({"num_placeholders": n},
            f"Include at least {_plural(n, 'placeholder')} in square brackets, for example [name].")


def _sections(rng, base):
    splitter, n = _pick(rng, ("Section", "Part")), int(rng.integers(2, 4))
    return ({"section_spliter": splitter, "num_sections": n},
            f'Divide the response into at least {n} sections, starting each with "{splitter} 1", "{splitter} 2" '
            f'and so on.')


def _postscript(rng, base):
    marker = _pick(rng, ("P.S.", "P.P.S"))  # the checker's two markers; "P.P.S." matches the second
    return {"postscript_marker": marker}, f'Add a postscript that starts with "{marker.rstrip(".")}.".'


def _end_phrase(rng, base):
    phrase = _pick(rng, _END_PHRASES)
    return {"end_phrase": phrase}, f'Finish the response with the exact phrase "{phrase}" and write nothing after it.'


def _repeat(rng, base):
    return {"prompt_to_repeat": base}, f'First repeat the request "{base}" word for word, then give your answer.'


def _word_range(rng, base):
    low = _pick(rng, (30, 50, 70))
    high = low + _pick(rng, (20, 30, 40))
    return {"min_words": low, "max_words": high}, f"Use between {low} and {high} words."


def _numbers(rng, base):
    n = int(rng.integers(1, 4))
    return {"N": n}, f"Include exactly {_plural(n, 'number')} written in digits."


def _sentence_keyword(rng, base):
    word, n = _pick(rng, _WORDS), int(rng.integers(1, 4))
    return {"word": word, "N": n}, f'Use the word "{word}" in sentence number {n}.'


def _fixed(text: str):
    return lambda rng, base: ({}, text)


# checker id -> draw(rng, base instruction) -> (checker args, plain-words constraint)
FAMILIES: dict[str, Callable[[np.random.Generator, str], tuple[dict, str]]] = {
    "punctuation:no_comma": _fixed("Do not use any commas."),
    "change_case:english_lowercase": _fixed("Write the entire response in English and in lowercase letters only."),
    "change_case:english_capital": _fixed("Write the entire response in English and in capital letters only."),
    "change_case:capital_word_frequency": _capital_words,
    "length_constraints:number_words": _number_words,
    "length_constraints:number_sentences": _number_sentences,
    "length_constraints:number_paragraphs": _paragraphs,
    "detectable_format:number_bullet_lists": _bullets,
    "detectable_format:number_highlighted_sections": _highlights,
    "detectable_format:multiple_sections": _sections,
    "detectable_format:title": _fixed("Include a title wrapped in double angular brackets, for example "
                                      "<<a night at sea>>."),
    "detectable_content:number_placeholders": _placeholders,
    "detectable_content:postscript": _postscript,
    "startend:end_checker": _end_phrase,
    "startend:quotation": _fixed("Wrap the entire response in double quotation marks."),
    "keywords:existence": _keywords,
    "keywords:forbidden_words": _forbidden,
    "keywords:frequency": _frequency,
    "keywords:letter_frequency": _letters,
    "combination:repeat_prompt": _repeat,
    "count:word_count_range": _word_range,
    "count:numbers": _numbers,
    "sentence:keyword": _sentence_keyword,
}

# pairs no response can (sensibly) meet together, beyond if-verifiable's own IFEval conflict table
_EXTRA_CONFLICTS = (
    ("length_constraints:number_words", "count:word_count_range"),
    ("length_constraints:number_sentences", "sentence:keyword"),  # "fewer than 3 sentences" + "in sentence 3"
    ("detectable_format:multiple_sections", "change_case:english_lowercase"),  # "Section 1" has a capital
    ("detectable_format:multiple_sections", "change_case:english_capital"),
    ("detectable_format:multiple_sections", "count:numbers"),  # section numbers are numbers
    *(("combination:repeat_prompt", f) for f in ("count:word_count_range", "count:numbers", "sentence:keyword")),
)


@dataclasses.dataclass(frozen=True)
class _Split:
    train: tuple[tuple[str, ...], ...]
    eval: tuple[tuple[str, ...], ...]


def _conflicts() -> set[frozenset[str]]:
    from jaxrl_llm.rewards.rubrics import ifeval_ids
    ifeval_ids()  # loads if-verifiable offline first
    from if_verifiable.ifeval.instructions_registry import INSTRUCTION_CONFLICTS

    pairs = {frozenset((a, b)) for a, others in INSTRUCTION_CONFLICTS.items() for b in others if a != b}
    return pairs | {frozenset(p) for p in _EXTRA_CONFLICTS}


def _held_out(combo: tuple[str, ...]) -> bool:
    digest = hashlib.sha256("|".join(combo).encode()).digest()
    return len(combo) > 1 and int.from_bytes(digest[:8], "big") % 100 < EVAL_SHARE_PERCENT


@functools.cache
def combinations() -> _Split:
    """Every allowed combination of 1-3 constraint ids (sorted tuples), split into training and held-out."""
    conflicts = _conflicts()
    combos = [c for k in (1, 2, 3) for c in itertools.combinations(sorted(FAMILIES), k)
              if not any(frozenset(p) in conflicts for p in itertools.combinations(c, 2))]
    return _Split(train=tuple(c for c in combos if not _held_out(c)), eval=tuple(c for c in combos if _held_out(c)))


def rubric_items(split: str, size: int, seed: int) -> list[dict]:
    """`size` tasks {"question", "rubric"} of split 'train' or 'eval', the same for the same seed."""
    if split not in ("train", "eval"):
        raise ValueError(f"split {split!r}: use 'train' or 'eval'")
    combos = getattr(combinations(), split)
    by_size = {k: [c for c in combos if len(c) == k] for k in (1, 2, 3)}
    sizes = [k for k in (1, 2, 3) if by_size[k]]
    weights = np.array([_SIZE_WEIGHTS[k] for k in sizes]) / sum(_SIZE_WEIGHTS[k] for k in sizes)
    rng = np.random.default_rng([seed, ("train", "eval").index(split)])
    rows = []
    for _ in range(size):
        k = sizes[int(rng.choice(len(sizes), p=weights))]
        combo = list(_pick(rng, by_size[k]))
        base = _pick(rng, BASE_INSTRUCTIONS)
        rubric = []
        for check in (combo[int(i)] for i in rng.permutation(len(combo))):
            args, text = FAMILIES[check](rng, base)
            rubric.append({"description": text, "weight": 1.0, "check": IFEVAL + check, "args": args})
        rows.append({"question": " ".join([base, *(it["description"] for it in rubric)]), "rubric": rubric})
    return rows


_ROW_KEYS = ("question", "rubric", "answer", "reference")


def load_rubric_jsonl(path: str | Path) -> list[dict]:
    """Rows {"question", "rubric", "answer"?, "reference"?} of a rubric jsonl file, every rubric validated; a row
    that is not a JSON object is named by its line, the others by their row (counted from 0, blank lines
    skipped)."""
    rows = []
    for i, row in enumerate(read_rows(path, "jsonl")):
        where = f"{path}: row {i}"
        for key in row:
            if key not in _ROW_KEYS:
                raise DataError(f"{where}: unknown key {key!r}; known: {list(_ROW_KEYS)}")
        if not isinstance(row.get("question"), str) or not row["question"].strip():
            raise DataError(f"{where}: key 'question' must be a non-empty string, got {row.get('question')!r}")
        if "rubric" not in row:
            raise DataError(f"{where}: key 'rubric' is missing")
        for key in ("answer", "reference"):
            if key in row and not isinstance(row[key], str):
                raise DataError(f"{where}: key {key!r} must be a string, got {row[key]!r}")
        try:
            rubric = parse_rubric(row["rubric"], where)
        except RubricError as e:
            raise DataError(str(e)) from None
        rows.append({**row, "rubric": [it.to_dict() for it in rubric]})
    return rows
