"""Where responses are cut into RRL prefix states (ALGORITHMS.md §3): after a token that ends a step.

`boundary_table` marks, once per tokenizer, what each vocabulary entry says about step ends: its text
holds a newline ('line'), or, for 'sentence', also ends in '.', '!' or '?' and starts with
whitespace; a step ends after a newline, or after a sentence mark when the next token starts with
whitespace (so "3.5" and "e.g.x" are not cut). With 'tokens' every `every` tokens is a boundary
instead. `cut_lengths` lists the prefix lengths a response offers (a cut right after a boundary,
shorter than the response and at most `max_len`); `keep_best` keeps `k` of them by their score (the states' priors, ALGORITHMS.md §3),
and among cuts of equal score `spread` keeps them spread over the response, the shortest and the
longest first, so a state and a longer state of the same response can be compared (backtracking).
"""

from __future__ import annotations

import numpy as np

SENTENCE_ENDS = (".", "!", "?")
LINE, SENTENCE, OPENS_SPACE = 1, 2, 4  # boundary_table's flags


def boundary_table(tokenizer, vocab_size: int, mode: str) -> np.ndarray:
    """[vocab_size] int8 flags: LINE (the text holds a newline), and with mode 'sentence' SENTENCE (it
    ends in a sentence mark, trailing spaces aside) and OPENS_SPACE (it starts with whitespace). Ids
    the tokenizer cannot decode get no flag."""
    table = np.zeros(vocab_size, np.int8)
    if mode == "tokens":
        return table
    for i in range(vocab_size):
        try:
            text = tokenizer.decode([i])
        except Exception:  # ids past the tokenizer's vocabulary (padded embedding rows)
            continue
        table[i] = LINE * ("\n" in text)
        if mode == "sentence":
            table[i] |= SENTENCE * text.rstrip(" ").endswith(SENTENCE_ENDS) + OPENS_SPACE * text[:1].isspace()
    return table


def cut_lengths(response: np.ndarray, table: np.ndarray, mode: str, every: int, max_len: int) -> np.ndarray:
    """Prefix lengths L (1 <= L < len(response), L <= max_len) that end right after a boundary: a
    newline, or ('sentence') a sentence mark followed by a token that starts with whitespace."""
    n = len(response)
    if mode == "tokens":
        lengths = np.arange(every, n, every)
    else:
        flags = table[response]
        ends = (flags & LINE) > 0
        if mode == "sentence":
            ends |= ((flags & SENTENCE) > 0) & ((np.append(flags[1:], OPENS_SPACE) & OPENS_SPACE) > 0)
        lengths = np.flatnonzero(ends) + 1
    return lengths[(lengths < n) & (lengths <= max_len)]


def keep_best(lengths: np.ndarray, scores: np.ndarray, k: int) -> np.ndarray:
    """Indices into the sorted `lengths` of at most k cuts: the highest `scores` first, each tier of equal
    score `spread` over its own lengths; in length order. One score for all (prior: response) is `spread`."""
    if len(lengths) <= k:
        return np.arange(len(lengths))
    keep: list[int] = []
    for s in np.unique(scores)[::-1]:
        tier = np.flatnonzero(scores == s)
        keep += tier[np.searchsorted(lengths[tier], spread(lengths[tier], k - len(keep)))].tolist()
        if len(keep) == k:
            break
    return np.sort(np.asarray(keep, np.int64))


def spread(lengths: np.ndarray, k: int) -> np.ndarray:
    """At most k of the sorted `lengths`, evenly spread: k >= 2 keeps the shortest and the longest."""
    c = len(lengths)
    if c <= k:
        return lengths
    if k == 1:
        return lengths[[c // 2]]
    return lengths[np.round(np.arange(k) * (c - 1) / (k - 1)).astype(int)]
