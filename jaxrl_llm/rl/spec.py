"""The update as a run's config defines it: its static spec, its loss coefficients, its optimizers and how a
minibatch of rows is laid out and cut into micro-batches. The trainer, the memory plan, the benchmarks and the
device check all take these from here, so they build the very program the trainer runs."""

from __future__ import annotations

import numpy as np

from jaxrl_llm.config import Config
from jaxrl_llm.rl.batch import RowBatch
from jaxrl_llm.rl.layout import contexts_bound, rows_layout, shared_layout
from jaxrl_llm.rl.update import UpdateSpec, make_optimizer


def rows_per_step(cfg: Config) -> int:
    """N: the rows a plain step samples (rollout.prompts_per_step prompts, rollout.group_size rows each)."""
    return cfg.rollout.prompts_per_step * cfg.rollout.group_size


def rows_per_update(cfg: Config) -> int:
    """The rows of one update call: a minibatch of the step's N rows."""
    return rows_per_step(cfg) // cfg.algo.minibatches


def update_spec(cfg: Config, shared: bool | None = None) -> UpdateSpec:
    """The RL update's static spec for `cfg` (layout from rollout.shared_prefix unless `shared` says)."""
    a = cfg.algo
    shared = cfg.rollout.shared_prefix if shared is None else shared
    return UpdateSpec(mode="rl", loss_agg=a.loss_agg, kl_estimator=a.kl_estimator, use_kl=a.kl_coef > 0,
                      micro_batches=max(1, rows_per_update(cfg) // a.micro_batch),
                      compute_dtype=cfg.model.compute_dtype, layout="shared" if shared else "rows")


def sft_spec(cfg: Config) -> UpdateSpec:
    """SFT's update: the negative log-likelihood of sft.batch_size rows in micro-batches of algo.micro_batch."""
    return UpdateSpec(mode="sft", micro_batches=max(1, cfg.sft.batch_size // cfg.algo.micro_batch),
                      compute_dtype=cfg.model.compute_dtype)


def loss_coefs(cfg: Config) -> dict:
    """The update's traced coefficients (changing one compiles nothing). `dropout_key`: LoRA dropout's key (raw
    uint32 key data), which the trainer sets for each update call; unused without dropout."""
    a = cfg.algo
    return {"eps_low": a.eps_low, "eps_high": a.eps_high, "dual_clip": a.dual_clip, "kl_coef": a.kl_coef,
            "hindsight_gamma": a.hindsight_gamma, "norm_len": float(cfg.rollout.max_new_tokens),
            "dropout_key": np.zeros(2, np.uint32)}


def rl_optimizer(cfg: Config):
    """RL's optimizer: one schedule step per update call (train.steps x ppo_epochs x minibatches in all)."""
    o = cfg.optim
    return make_optimizer(o.lr, warmup_steps=o.warmup_steps, schedule=o.schedule,
                          total_steps=cfg.train.steps * cfg.algo.ppo_epochs * cfg.algo.minibatches,
                          weight_decay=o.weight_decay, b1=o.b1, b2=o.b2, max_grad_norm=o.max_grad_norm)


def sft_optimizer(cfg: Config):
    return make_optimizer(cfg.sft.lr, max_grad_norm=cfg.optim.max_grad_norm)


def minibatch(cfg: Config, rows: RowBatch, idx: np.ndarray, shared: bool | None = None,
              min_group: int | None = None, extra_contexts: int = 0, min_context: int = 16):
    """Rows `idx` in the layout the update takes (rl/layout.py), cut into micro-batches of
    algo.micro_batch rows with one context shape for the whole run. `min_group`: the smallest group
    the run's explorers can make (None: every group has rollout.group_size rows); `extra_contexts`:
    the most contexts they add beyond the step's prompts; `min_context`: the context length bucket."""
    shared = cfg.rollout.shared_prefix if shared is None else shared
    if not shared:
        return rows_layout(rows, idx)
    micro_rows = min(cfg.algo.micro_batch, len(idx))
    if cfg.algo.minibatches > 1:  # rows drawn at random into minibatches: any mix of contexts
        min_group = 1
    bound = contexts_bound(micro_rows, cfg.rollout.group_size if min_group is None else min_group,
                           exact=min_group is None, cap=cfg.rollout.prompts_per_step + extra_contexts)
    return shared_layout(rows, idx, micro_rows, min_contexts=bound, min_context=min_context)


def micro_shape(cfg: Config, batch, shared: bool | None = None) -> tuple[int, int]:
    """(micro-batches, rows per micro-batch) of an update batch as `minibatch` laid it out."""
    shared = cfg.rollout.shared_prefix if shared is None else shared
    if shared:  # [micro-batches, rows, own tokens]
        return tuple(int(x) for x in batch.tokens.shape[:2])
    m = update_spec(cfg, shared).micro_batches
    return m, int(batch.tokens.shape[0]) // m
