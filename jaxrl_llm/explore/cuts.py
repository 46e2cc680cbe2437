"""Where responses are cut into RRL prefix states (ALGORITHMS.md §3): after a token that ends a step.

`boundary_table` marks, once per tokenizer, what each vocabulary entry says about step ends. A step
ends after a token whose text holds a newline ('line' and 'sentence'), and with 'sentence' also
after a '.', '!' or '?' followed by whitespace: inside the same token (". "), or as the next token's
first character (so "3.5" and "e.g.x" are not cut). With 'tokens' every `every` tokens is a boundary
instead. `cut_lengths` lists the prefix lengths a response offers (a cut right after a boundary,
shorter than the response and at most `max_len`); `keep_best` keeps `k` of them by their score (the
states' priors, ALGORITHMS.md §3), and among cuts of equal score `spread` keeps them spread over the
response, the shortest and the longest first, so a state and a longer state of the same response can
be compared (backtracking).
"""

from __future__ import annotations

import numpy as np

SENTENCE_ENDS = (".", "!", "?")
STEP_END, SENTENCE, OPENS_SPACE = 1, 2, 4  # boundary_table's flags
SPACE_MARKS = ("\u2581", "\u0120")  # a word-initial space in SentencePiece and byte-level BPE token strings


def _opens_with_space(tokenizer, i: int, text: str) -> bool:
    """SentencePiece tokenizers decode a lone token without its leading space ('▁The' -> 'The'): read
    the token string too where the tokenizer has one."""
    if text[:1].isspace():
        return True
    try:
        piece = tokenizer.convert_ids_to_tokens(i)
    except Exception:  # no token strings (e.g. a character tokenizer), or an id past the vocabulary
        return False
    return isinstance(piece, str) and piece.startswith(SPACE_MARKS)


def boundary_table(tokenizer, vocab_size: int, mode: str) -> np.ndarray:
    """[vocab_size] int8 flags: STEP_END (the token ends a step by itself: its text holds a newline, or
    with mode 'sentence' ends in a sentence mark and whitespace), and with mode 'sentence' SENTENCE (its
    text ends in a sentence mark) and OPENS_SPACE (it starts with whitespace). Ids the tokenizer cannot
    decode get no flag."""
    table = np.zeros(vocab_size, np.int8)
    if mode == "tokens":
        return table
    for i in range(vocab_size):
        try:
            text = tokenizer.decode([i])
        except Exception:  # ids past the tokenizer's vocabulary (padded embedding rows)
            continue
        end = "\n" in text
        if mode == "sentence":
            end |= text != text.rstrip() and text.rstrip().endswith(SENTENCE_ENDS)
            table[i] = SENTENCE * text.endswith(SENTENCE_ENDS) + OPENS_SPACE * _opens_with_space(tokenizer, i, text)
        table[i] |= STEP_END * end
    return table


def cut_lengths(response: np.ndarray, table: np.ndarray, mode: str, every: int, max_len: int) -> np.ndarray:
    """Prefix lengths L (1 <= L < len(response), L <= max_len) that end right after a boundary: a token
    that ends a step by itself, or ('sentence') a sentence mark followed by a token that starts with
    whitespace."""
    n = len(response)
    if mode == "tokens":
        lengths = np.arange(every, n, every)
    else:
        flags = table[response]
        ends = (flags & STEP_END) > 0
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
