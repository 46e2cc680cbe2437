"""Rubrics: weighted items a response should meet, and the grader that says which it meets.

An item is a description, a weight >= 0 and a check (HeRL, ALGORITHMS.md section 2):
- "ifeval:<instruction id>": a checker class of the `if-verifiable` package (IFEval and IFBench ids), built with
  the item's `args` as its keyword arguments and run in IFEval's strict mode;
- "py:<name>": a Python check registered with `@register_check(name)`, called as fn(response, **args) -> bool;
  a worker process knows the checks of the modules it imports (this module's are always there);
- "judge": decided by an LLM judge (rewards/judge.py); the grader takes its verdicts as given.
The reward is sum_k w_k m_k / sum_k w_k (0 when every weight is 0), returned with the met vector m so that the
unmet items are known. A checker that raises counts as unmet; an empty (whitespace-only) response meets no
programmatic item, as in IFEval's strict mode, so that silence earns nothing.

Nothing is downloaded at run time. if-verifiable splits sentences with NLTK's punkt data (IFEval's
count_sentences, and nltk.word_tokenize in both util modules), and its IFBench util module calls nltk.download
when imported. Here that import runs with nltk.download answering "not downloaded", and both util modules get
punkt's work done by nupunkt's bundled Punkt model instead: their `_get_sentence_tokenizer` and the `nltk` they
see (whose word_tokenize then splits sentences with nupunkt and words with NLTK's own Treebank tokenizer, as
nltk.word_tokenize does). Sentence counts can differ from NLTK punkt's on odd abbreviations.

Checker ids of if-verifiable 0.1.2 (write "ifeval:<id>"):
IFEval (25)
  change_case: capital_word_frequency (nupunkt), english_capital, english_lowercase
  combination: repeat_prompt, two_responses
  detectable_content: number_placeholders, postscript
  detectable_format: constrained_response, json_format, multiple_sections, number_bullet_lists,
    number_highlighted_sections, title
  keywords: existence, forbidden_words, frequency, letter_frequency
  language: response_language
  length_constraints: nth_paragraph_first_word, number_paragraphs, number_sentences (nupunkt), number_words
  punctuation: no_comma
  startend: end_checker, quotation
IFBench (58, two left out)
  count: conjunctions, keywords_multiple, numbers, person_names, pronouns, punctuation, unique_word_count,
    word_count_range, words_japanese
  custom: character_reverse, csv_city, csv_quotes, csv_special_character, date_format_list,
    european_capitals_sort, mcq_count_length, multiples, reverse_newline, sentence_alphabet, word_reverse
  format: emoji, line_indent, list, newline, no_bullets_bullets, no_whitespace, options, output_template,
    parentheses, quote_unquote, quotes, sub-bullets, thesis, title_case (nupunkt)
  ratio: overlap, sentence_balance, sentence_type, sentence_words, [stop_words: left out]
  repeat: repeat_change, repeat_simple, repeat_span
  sentence: alliteration_increment, increment, keyword
  words: alphabet, consonants, keywords_specific_position (nupunkt), last_first, no_consecutive,
    odd_even_syllables, palindrome, paragraph_last_first, prime_lengths, repeats, [start_verb: left out], vowel,
    words_position (nupunkt)
LEFT_OUT names the two that need NLTK data other than punkt, which no PyPI package provides in NLTK's format.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import inspect
import json
import random
import re
import sys
from typing import Callable, Sequence

import numpy as np

from jaxrl_llm.rewards.types import Score

IFEVAL, PY, JUDGE = "ifeval:", "py:", "judge"

LEFT_OUT = {
    "ratio:stop_words": "needs NLTK's stopwords corpus (nltk.download), which nothing here may fetch",
    "words:start_verb": "needs NLTK's averaged_perceptron_tagger_eng (nltk.download), which nothing here may fetch",
}

_ITEM_KEYS = ("description", "weight", "check", "args")
# if-verifiable args it pastes into a regular expression unescaped (keywords:existence, keywords:frequency,
# keywords:forbidden_words, detectable_content:postscript, detectable_format:multiple_sections); a quantifier,
# group, class or alternation there can backtrack for hours on one response, first in the trainer's own process
# when the rubric is checked at load, so such args are refused: write plain words
_REGEX_ARGS = frozenset({"keywords", "keyword", "forbidden_words", "postscript_marker", "section_spliter", "starter"})
_REGEX_META = frozenset("*+?{}()[]|\\")
_TRIAL = "A short trial response. It has two sentences."  # args that make a check raise on it are refused


class RubricError(ValueError):
    pass


@dataclasses.dataclass(frozen=True)
class RubricItem:
    description: str
    weight: float
    check: str  # "ifeval:<instruction id>" | "py:<name>" | "judge"
    args: dict = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"description": self.description, "weight": self.weight, "check": self.check, "args": dict(self.args)}


def dump_rubric(items: Sequence[RubricItem]) -> str:
    """A rubric as the JSON text `score_rubric` takes."""
    return json.dumps([it.to_dict() for it in items])


# ---- Python checks ------------------------------------------------------------------------------------------

_PY_CHECKS: dict[str, Callable[..., bool]] = {}


def register_check(name: str):
    """Make fn(response: str, **args) -> bool usable as check "py:<name>"."""
    def register(fn):
        if _PY_CHECKS.get(name, fn) is not fn:
            raise ValueError(f"a py check named {name!r} is already registered ({_PY_CHECKS[name].__qualname__})")
        _PY_CHECKS[name] = fn
        return fn
    return register


_WORD = re.compile(r"\w+")  # words as IFEval counts them (nltk's RegexpTokenizer(r"\w+"))


def _count(n, name: str) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"{name} must be a whole number >= 0, got {n!r}")
    return n


@register_check("max_words")
def max_words(response: str, n: int) -> bool:
    """At most n words."""
    return len(_WORD.findall(response)) <= _count(n, "n")


@register_check("min_words")
def min_words(response: str, n: int) -> bool:
    """At least n words."""
    return len(_WORD.findall(response)) >= _count(n, "n")


@register_check("contains_all")
def contains_all(response: str, keywords: list, case_sensitive: bool = False) -> bool:
    """Every keyword (a word or phrase) appears as a whole word: "cat" is not found in "concatenate"."""
    if not isinstance(keywords, list) or not keywords or not all(isinstance(k, str) and k.strip() for k in keywords):
        raise ValueError(f"keywords must be a non-empty list of non-empty strings, got {keywords!r}")
    flags = 0 if case_sensitive else re.IGNORECASE
    return all(re.search(rf"(?<!\w){re.escape(k.strip())}(?!\w)", response, flags) for k in keywords)


# ---- if-verifiable checkers, offline --------------------------------------------------------------------------

def _not_downloaded(*args, **kwargs) -> bool:
    return False


class _OfflineNltk:
    """`nltk` as if-verifiable's util modules see it: word_tokenize splits sentences with nupunkt instead of
    NLTK's punkt data, then words with NLTK's Treebank tokenizer, as nltk.word_tokenize does."""

    def __init__(self, nltk):
        self._nltk = nltk
        self._words = nltk.tokenize.NLTKWordTokenizer()

    def __getattr__(self, name):
        return getattr(self._nltk, name)

    def word_tokenize(self, text: str, language: str = "english", preserve_line: bool = False) -> list[str]:
        sentences = [text] if preserve_line else _sentence_splitter().tokenize(text)
        return [word for sentence in sentences for word in self._words.tokenize(sentence)]


def _sentence_splitter():
    import nupunkt

    return nupunkt.load("default")  # the bundled English model (cached by nupunkt)


@functools.cache
def _checker_classes() -> dict[str, type]:
    """if-verifiable's checker classes by instruction id (IFEval and IFBench), made to work offline."""
    import langdetect
    import nltk
    from if_verifiable.ifeval import instructions_util as ifeval_util
    from if_verifiable.ifeval.instructions_registry import INSTRUCTION_DICT as ifeval_ids

    download, nltk.download = nltk.download, _not_downloaded
    try:  # its util module calls nltk.download for missing data when imported
        from if_verifiable.ifbench import instructions_util as ifbench_util
        from if_verifiable.ifbench.instructions_registry import INSTRUCTION_DICT as ifbench_ids
    finally:
        nltk.download = download
    ifeval_util._get_sentence_tokenizer = _sentence_splitter
    for util in (ifeval_util, ifbench_util):
        util.nltk = _OfflineNltk(nltk)
    langdetect.DetectorFactory.seed = 0  # language checks give the same answer every time
    return {**ifeval_ids, **ifbench_ids}


def prepare_checks() -> None:
    """Load if-verifiable's checkers, the sentence splitter's model and langdetect's language profiles
    (what the first check of a fresh worker would otherwise load inside its time limit)."""
    from langdetect.detector_factory import init_factory

    _checker_classes()
    _sentence_splitter()
    init_factory()


def ifeval_ids() -> tuple[str, ...]:
    """Instruction ids usable as "ifeval:<id>" (every if-verifiable id except LEFT_OUT)."""
    return tuple(sorted(k for k in _checker_classes() if k not in LEFT_OUT))


def _arg_names(cls) -> list[str]:
    params = inspect.signature(cls.build_description).parameters.values()
    return [p.name for p in params if p.name != "self" and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)]


def _build(instruction_id: str, args: dict):
    checker = _checker_classes()[instruction_id](instruction_id)
    checker.build_description(**args)
    return checker


@functools.lru_cache(maxsize=4096)
def _check_fn(check: str, args_json: str) -> Callable[[str], bool]:
    args = json.loads(args_json)
    if check.startswith(IFEVAL):
        return _build(check[len(IFEVAL):], args).check_following
    fn = _PY_CHECKS[check[len(PY):]]
    return lambda response: fn(response, **args)


# ---- parsing --------------------------------------------------------------------------------------------------

def _closest(name: str, known: Sequence[str]) -> str:
    exact_tail = [k for k in known if k.split(":", 1)[-1] == name]
    near = exact_tail + [k for k in difflib.get_close_matches(name, known, n=3, cutoff=0.0) if k not in exact_tail]
    return ", ".join(repr(k) for k in near[:3]) or "none"


def _check_ifeval(instruction_id: str, args: dict, where: str) -> None:
    known = ifeval_ids()
    if instruction_id in LEFT_OUT:
        raise RubricError(f"{where}: check 'ifeval:{instruction_id}' is left out: {LEFT_OUT[instruction_id]}")
    if instruction_id not in known:
        raise RubricError(f"{where}: check 'ifeval:{instruction_id}' is no if-verifiable instruction id; closest: "
                          f"{_closest(instruction_id, known)}")
    names = _arg_names(_checker_classes()[instruction_id])
    for key in args:
        if key not in names:
            raise RubricError(f"{where}: args key {key!r} is not an argument of 'ifeval:{instruction_id}' "
                              f"(it takes {names or 'none'}); closest: {_closest(key, names)}")
    for key in _REGEX_ARGS & set(args):
        for text in args[key] if isinstance(args[key], list) else [args[key]]:
            meta = sorted(set(str(text)) & _REGEX_META)
            if meta:
                raise RubricError(f"{where}: args key {key!r} value {text!r} has {''.join(meta)}: 'ifeval:"
                                  f"{instruction_id}' uses it as a regular expression, where these can make a "
                                  f"check run for hours; write plain words")
    missing = [n for n in names if n not in args]
    if missing:  # if-verifiable would draw them at random
        raise RubricError(f"{where}: 'ifeval:{instruction_id}' needs args {missing} (it takes {names})")
    state = random.getstate()
    try:  # a value the checker does not accept (e.g. a negative count) also makes it draw at random
        random.seed(0)
        first = _build(instruction_id, args).get_instruction_args()
        random.seed(1)
        second = _build(instruction_id, args).get_instruction_args()
    except Exception as e:
        raise RubricError(f"{where}: args {args} do not build 'ifeval:{instruction_id}': {type(e).__name__}: {e}") \
            from None
    finally:
        random.setstate(state)
    if first != second:
        raise RubricError(f"{where}: args {args} leave part of 'ifeval:{instruction_id}' to chance (it draws "
                          f"{first} or {second}); give every value in the range the checker accepts")


def _check_py(name: str, args: dict, where: str) -> None:
    if name not in _PY_CHECKS:
        raise RubricError(f"{where}: check 'py:{name}' is not registered; closest: {_closest(name, list(_PY_CHECKS))}")
    params = list(inspect.signature(_PY_CHECKS[name]).parameters)[1:]
    for key in args:
        if key not in params:
            raise RubricError(f"{where}: args key {key!r} is not an argument of 'py:{name}' (it takes {params}); "
                              f"closest: {_closest(key, params)}")


def _trial(check: str, args: dict, where: str) -> None:
    try:
        _check_fn(check, json.dumps(args, sort_keys=True))(_TRIAL)
    except Exception as e:
        raise RubricError(f"{where}: args {args} do not work with {check!r}: {type(e).__name__}: {e}") from None


def _parse_item(raw, where: str) -> RubricItem:
    if not isinstance(raw, dict):
        raise RubricError(f"{where}: an item must be an object with keys {list(_ITEM_KEYS)}, got {type(raw).__name__}")
    for key in raw:
        if key not in _ITEM_KEYS:
            raise RubricError(f"{where}: unknown key {key!r}; closest: {_closest(str(key), _ITEM_KEYS)}")
    for key in ("description", "weight", "check"):
        if key not in raw:
            raise RubricError(f"{where}: key {key!r} is missing")
    description, weight, check, args = raw["description"], raw["weight"], raw["check"], raw.get("args", {})
    if not isinstance(description, str) or not description.strip():
        raise RubricError(f"{where}: key 'description' must be a non-empty string, got {description!r}")
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) \
            or not 0 <= weight <= sys.float_info.max:  # NaN and 10**400 too, without OverflowError
        raise RubricError(f"{where}: key 'weight' must be a finite number >= 0, got {weight!r:.80}")
    if not isinstance(args, dict) or not all(isinstance(k, str) for k in args):
        raise RubricError(f"{where}: key 'args' must be an object of keyword arguments, got {args!r}")
    try:
        json.dumps(args)
    except (TypeError, ValueError) as e:
        raise RubricError(f"{where}: key 'args' must be JSON data: {e}") from None
    if not isinstance(check, str):
        raise RubricError(f"{where}: key 'check' must be a string, got {check!r}")
    if check.startswith(IFEVAL):
        _check_ifeval(check[len(IFEVAL):], args, where)
        _trial(check, args, where)
    elif check.startswith(PY):
        _check_py(check[len(PY):], args, where)
        _trial(check, args, where)
    elif check == JUDGE:
        if args:
            raise RubricError(f"{where}: key 'args' must be empty for a 'judge' check, got {args!r}")
    else:
        raise RubricError(f"{where}: key 'check' is {check!r}; use 'ifeval:<instruction id>', 'py:<name>' or "
                          f"'judge'")
    return RubricItem(description=description, weight=float(weight), check=check, args=dict(args))


def parse_rubric(items, where: str) -> tuple[RubricItem, ...]:
    """Validated items from raw dicts; errors name `where` (e.g. "file.jsonl: row 3"), the item and the key."""
    if not isinstance(items, (list, tuple)) or not items:
        raise RubricError(f"{where}: key 'rubric' must be a non-empty list of items, got {items!r}")
    return tuple(_parse_item(raw, f"{where} item {k}") for k, raw in enumerate(items))


# ---- grading --------------------------------------------------------------------------------------------------

def _met(item: RubricItem, response: str) -> bool:
    if not response.strip():
        return False
    try:
        return bool(_check_fn(item.check, json.dumps(item.args, sort_keys=True))(response))
    except Exception:  # a broken checker must not end the run; the item is simply unmet
        return False


def grade(items: Sequence[RubricItem], response: str, judged: Sequence[int | bool | None] | None = None
          ) -> tuple[float, np.ndarray]:
    """(score, met [K] bool): programmatic items checked here, judge items read from `judged` (aligned with
    `items`, None for the others; a judge item without a verdict is unmet)."""
    if judged is not None and len(judged) != len(items):
        raise ValueError(f"{len(judged)} verdicts for {len(items)} items; give one per item (None for non-judge)")
    met = np.zeros(len(items), bool)
    for k, item in enumerate(items):
        if item.check == JUDGE:
            met[k] = judged is not None and judged[k] is not None and bool(judged[k])
        else:
            met[k] = _met(item, response)
    return weighted_score(items, met), met


def weighted_score(items: Sequence[RubricItem], met) -> float:
    """sum_k w_k m_k / sum_k w_k of the items met (0 when every weight is 0); the weights are scaled by their
    largest first, so that weights near float's range cannot sum to inf (inf / inf would be a NaN reward)."""
    weights = np.array([it.weight for it in items], np.float64)
    if weights.size and weights.max() > 0:
        weights = weights / weights.max()
    total = weights.sum()
    return float(weights @ np.asarray(met, np.float64) / total) if total > 0 else 0.0


@functools.lru_cache(maxsize=1024)
def _parsed(rubric_json: str) -> tuple[RubricItem, ...]:
    return parse_rubric(json.loads(rubric_json), "rubric")


def score_rubric(rubric_json: str, response: str) -> Score:
    """grade() for a worker process: the rubric as JSON text (`dump_rubric`); judge items count as unmet."""
    value, met = grade(_parsed(rubric_json), response)
    return Score(value, tuple(met.astype(int).tolist()))


def rubric_items(rubric_json: str) -> tuple[RubricItem, ...]:
    """The items of a rubric given as JSON text (`dump_rubric`), parsed once per distinct text."""
    return _parsed(rubric_json)
