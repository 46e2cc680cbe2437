"""Where responses are cut into RRL prefix states (ALGORITHMS.md §3): after a token that ends a step.

`boundary_table` marks, once per tokenizer, the vocabulary entries that end a step: any token whose
text holds a newline ('line'), or a newline or a sentence end ('sentence': text ending in '.', '!'
or '?'). With 'tokens' every `every` tokens is a boundary instead. `cut_lengths` lists the prefix
lengths a response offers (a cut right after a boundary token, shorter than the response and at
most `max_len`); `keep_best` keeps `k` of them by their score (the states' priors, ALGORITHMS.md §3),
and among cuts of equal score `spread` keeps them spread over the response, the shortest and the
longest first, so a state and a longer state of the same response can be compared (backtracking).
"""

from __future__ import annotations

import numpy as np

SENTENCE_ENDS = (".", "!", "?")


def boundary_table(tokenizer, vocab_size: int, mode: str) -> np.ndarray:
    """[vocab_size] bool: the token ends a step. Ids the tokenizer cannot decode are not boundaries."""
    table = np.zeros(vocab_size, bool)
    if mode == "tokens":
        return table
    for i in range(vocab_size):
        try:
            text = tokenizer.decode([i])
        except Exception:  # ids past the tokenizer's vocabulary (padded embedding rows)
            continue
        table[i] = "\n" in text or (mode == "sentence" and text.rstrip(" ").endswith(SENTENCE_ENDS))
    return table


def cut_lengths(response: np.ndarray, table: np.ndarray, mode: str, every: int, max_len: int) -> np.ndarray:
    """Prefix lengths L (1 <= L < len(response), L <= max_len) that end right after a boundary."""
    n = len(response)
    if mode == "tokens":
        lengths = np.arange(every, n, every)
    else:
        lengths = np.flatnonzero(table[response]) + 1
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
