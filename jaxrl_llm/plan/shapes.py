"""A run's shapes, known before anything big is built: row counts, the sampler's and the update's
buckets, and the worst-case step the memory plan sizes.

Everything here follows from the config, the model config, the longest prompt of the run's data and
the explorers' declared footprint (what rows, contexts and lengths they may add), so the memory plan
can be made, and refuse a run, before the optimizer state or a sampler cache exists. Explorers that add
contexts get one context length and count bucket for the whole run, so their rows compile nothing after
warm-up: sampling's for RRL's prompt + prefix, the update's also HeRL's revise prompts."""

from __future__ import annotations

import dataclasses

import numpy as np

from jaxrl_llm.config import Config
from jaxrl_llm.explore.base import Footprint
from jaxrl_llm.rl.batch import RowBatch
from jaxrl_llm.rl.spec import minibatch, rows_per_step, rows_per_update
from jaxrl_llm.sampling.buckets import bucket
from jaxrl_llm.sampling.sampler import Sampler


@dataclasses.dataclass(frozen=True)
class RunShapes:
    rows: int  # N: the rows a plain step samples
    rows_per_update: int  # a minibatch of them
    longest_prompt: int  # tokens of the run's longest prompt (training and held-out)
    min_group: int | None  # smallest group the explorers can make; None: every group has rollout.group_size rows
    extra_contexts: int  # most contexts the explorers add to a step beyond its prompts
    sample_context: int  # the sampler's context bucket floor (prompt + the longest given prefix)
    min_context: int  # the update's context bucket (also the explorers' own contexts)
    min_unique: int  # the sampler's floor of distinct contexts per call
    logprob_width: int  # teacher-forced log-prob passes (rows moved under another context): one width
    prefill: int  # the sampler's context bucket for the longest prompt
    row_width: int  # ... and its buffer: the longest rows the update gets
    max_new: int  # rollout.max_new_tokens as the sampler clamps it to the model's context
    sampling_calls: tuple = ()  # (rows, context length) of the explorers' own sampler calls

    @classmethod
    def of(cls, cfg: Config, model_cfg, longest: int, footprint: Footprint = Footprint()) -> "RunShapes":
        """The shapes of a run of `cfg` whose longest prompt has `longest` tokens, with explorers of `footprint`
        (explore/base.py; the default: none, plain GRPO)."""
        prefix, own, extra = footprint.prefix_tokens, footprint.context_tokens, footprint.extra_contexts
        sample_context = bucket(longest + prefix, 16) if prefix else 16
        max_new = min(cfg.rollout.max_new_tokens, model_cfg.max_position_embeddings - 1)  # the sampler's clamp
        sampler = Sampler(None, pad_id=0, max_cache_len=model_cfg.max_position_embeddings, min_context=sample_context)
        _, prefill, width = sampler.shapes(rows_per_step(cfg), longest, max_new)
        return cls(rows=rows_per_step(cfg), rows_per_update=rows_per_update(cfg), longest_prompt=longest,
                   min_group=footprint.min_group_size, extra_contexts=extra, sample_context=sample_context,
                   # explorers' contexts: one length for the run, a multiple of 16 (rl/layout.py pads to it)
                   min_context=-(-max(longest + prefix, own) // 16) * 16 if prefix or own else 16,
                   min_unique=cfg.rollout.prompts_per_step + extra if extra else 1,
                   logprob_width=bucket(longest + cfg.rollout.max_new_tokens, 16), prefill=prefill, row_width=width,
                   max_new=max_new, sampling_calls=tuple(footprint.sampling_calls))

    def minibatch(self, cfg: Config, rows: RowBatch, idx: np.ndarray):
        """Rows `idx` laid out for the update in this run's buckets (rl/spec.py minibatch)."""
        return minibatch(cfg, rows, idx, min_group=self.min_group, extra_contexts=self.extra_contexts,
                         min_context=self.min_context)

    def worst_case_minibatch(self, cfg: Config):
        """One update's batch of the likeliest largest shape: the longest prompt, every response
        rollout.max_new_tokens long, laid out as the trainer lays out its steps. With several minibatches
        the trainer draws rows at random; a stride spreads them over the groups, the most distinct contexts
        a micro-batch can get."""
        rows = worst_case_rows(cfg, self.rows, context=self.longest_prompt, width=self.row_width)
        return self.minibatch(cfg, rows, np.arange(self.rows_per_update) * cfg.algo.minibatches)


def config_shapes(cfg: Config, model_cfg) -> RunShapes:
    """A plain run's shapes for prompts up to data.max_prompt_len (benchmarks: no data, no explorers)."""
    return RunShapes.of(cfg, model_cfg, cfg.data.max_prompt_len)


def worst_case_rows(cfg: Config, n: int, *, context: int, width: int) -> RowBatch:
    """`n` update rows (train/rollout.py update_rows) at their largest: every prompt `context` tokens in rows
    of `width`, every response rollout.max_new_tokens, groups of group_size rows sharing their prompt. Only
    shapes matter; the values just make contexts distinct per group."""
    new = min(cfg.rollout.max_new_tokens, width - context)
    tokens = np.zeros((n, width), np.int32)
    tokens[:, :context] = (np.arange(n) // cfg.rollout.group_size + 1)[:, None]
    mask = np.zeros((n, width), bool)
    mask[:, context:context + new] = True
    return RowBatch.make(tokens, mask, context_len=np.full(n, context, np.int32), advantages=np.zeros(n, np.float32))
