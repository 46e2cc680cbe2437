"""Supervised warm start on reference answers (written in the run's answer format)."""

from __future__ import annotations

import numpy as np

from jaxrl_llm.config import Config
from jaxrl_llm.rewards.verifiers import render_answer
from jaxrl_llm.rl.batch import RowBatch
from jaxrl_llm.sampling.buckets import bucket


def sft_batch(tok, cfg: Config, pairs, pad_id: int, eos_id: int) -> RowBatch:
    """Rows of prompt + reference answer + eos, right-padded to a bucket; the loss covers the answer."""
    seqs, starts = [], []
    for item, prompt_ids in pairs:
        target = item.reference or render_answer(item.answer, cfg.data.answer_format)
        answer_ids = tok(target, add_special_tokens=False)["input_ids"] + [eos_id]
        seqs.append(prompt_ids + answer_ids)
        starts.append(len(prompt_ids))
    width = bucket(max(len(s) for s in seqs), 16)
    tokens = np.full((len(seqs), width), pad_id, np.int32)
    mask = np.zeros((len(seqs), width), bool)
    for i, (s, st) in enumerate(zip(seqs, starts)):
        tokens[i, :len(s)] = s
        mask[i, st:len(s)] = True
    return RowBatch.make(tokens, mask, context_len=starts)
