"""Building a run's parts, in the order that fails cheapest first: the data (a bad data file is reported
before any model is loaded), the policy, the prompts as it sees them, the explorers and their footprint,
the run's shapes, the memory plan (before the optimizer state or a sampler cache exists), then the
sampler and the judge. Each part is a value handed to the next; train/loop.py's Run holds them."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from jaxrl_llm.config import Config
from jaxrl_llm.data.tasks import load_sft_items, load_splits_counted
from jaxrl_llm.explore.base import Setup
from jaxrl_llm.model.tokenizer import pad_id, stop_ids
from jaxrl_llm.parallel import hosts
from jaxrl_llm.plan.memory import MemoryPlan, check, device_capacity, memory_plan
from jaxrl_llm.plan.program import analyse_update
from jaxrl_llm.plan.shapes import RunShapes
from jaxrl_llm.rewards.judge import Judge, judge_items, load_judge, sampler_generate
from jaxrl_llm.rewards.rubrics import rubric_items
from jaxrl_llm.rl.spec import rows_per_step
from jaxrl_llm.rl.update import abstract_optimizer_state
from jaxrl_llm.sampling.sampler import Sampler
from jaxrl_llm.train.policy import encode_items, encode_text


@dataclasses.dataclass(frozen=True)
class RawData:
    """The run's tasks as loaded, before any tokenizer: training, held-out and separate SFT items."""

    train: list
    eval: list
    sft: list
    repeated: int = 0  # held-out items left out for repeating a training question


def load_data(cfg: Config, log=print) -> RawData:
    train, held_out, repeated = load_splits_counted(cfg.data)
    if repeated and not held_out:  # said first, not only in the summary at the end (a run without held-out items
        # is allowed: its evaluation is empty)
        log(f"every one of the {repeated} held-out items repeats a training question, so the run evaluates on none "
            f"(is data.eval_path the training file, data.path?)")
    elif repeated:
        log(f"{repeated} held-out items repeat a training question: left out of the evaluation "
            f"({len(held_out)} kept)")
    return RawData(train, held_out, load_sft_items(cfg.data) if cfg.sft.steps > 0 else [], repeated)


@dataclasses.dataclass(frozen=True)
class RunData:
    """The tasks as the policy sees them: (item, prompt ids) pairs, prompts longer than data.max_prompt_len
    dropped (counted) or cut as the config says."""

    train_items: list
    eval_items: list  # the first eval.size held-out items
    sft_items: list  # SFT's own items, or the training items when the config has none
    dropped_prompts: int
    longest: int  # tokens of the longest prompt, training or held-out (all of them, not only eval.size)
    truncated_prompts: int = 0  # prompts cut to data.max_prompt_len (data.overlong=truncate)


def encode_data(tok, cfg: Config, raw: RawData) -> RunData:
    train, dropped, cut = encode_items(tok, cfg, raw.train)
    held_out, eval_dropped, eval_cut = encode_items(tok, cfg, raw.eval)
    sft, sft_dropped, sft_cut = encode_items(tok, cfg, raw.sft) if cfg.sft.steps > 0 else ([], 0, 0)
    if not train:
        raise ValueError("no training prompts left (all dropped as longer than data.max_prompt_len?)")
    judged = [it.uid for it, _ in train + held_out if it.rubric and judge_items(rubric_items(it.rubric))]
    if judged and not cfg.reward.judge:
        raise ValueError(f"{len(judged)} tasks have rubric items checked by 'judge' (first: {judged[0]}); set "
                         f"reward.judge=policy (or a local model folder) to have them judged, or remove those "
                         f"items")
    return RunData(train, held_out[:cfg.eval.size], sft or train, dropped + eval_dropped + sft_dropped,
                   max(len(ids) for _, ids in train + held_out), cut + eval_cut + sft_cut)


def explorer_setup(cfg: Config, data: RunData, tok, mesh, vocab_size: int) -> Setup:
    """What the explorers may size their state by and build rows from."""
    r = cfg.rollout
    return Setup(num_items=len(data.train_items), prompts_per_step=r.prompts_per_step, group_size=r.group_size,
                 rows=rows_per_step(cfg), total_steps=cfg.train.steps,
                 steps_per_epoch=max(1, len(data.train_items) // r.prompts_per_step), vocab_size=vocab_size,
                 temperature=r.temperature,
                 item_difficulty=np.array([it.difficulty for it, _ in data.train_items], np.float32),
                 items=[it for it, _ in data.train_items], prompts=[ids for _, ids in data.train_items],
                 tokenizer=tok, max_new_tokens=r.max_new_tokens, mesh=mesh,
                 encode=lambda text: encode_text(tok, cfg, text))


def everywhere(mesh, tree):
    """Explorer state as arrays over the whole mesh on a multi-host run (every process holds the same values,
    and orbax saves global arrays); ones already laid out over the mesh (RRL's replay array) stay as they are."""
    if hosts.count() == 1:
        return tree
    replicated = NamedSharding(mesh, PartitionSpec())
    return jax.tree.map(lambda x: x if isinstance(x, jax.Array) and not x.is_fully_addressable
                        else hosts.put(np.asarray(x), replicated), tree)


def plan_memory(cfg: Config, shapes: RunShapes, policy, mesh, params, optimizer, update, log) -> MemoryPlan:
    """The run's memory plan (plan/memory.py), its update figure from XLA's analysis of the run's OWN update
    program for its worst-case minibatch, compiled ahead through that update so a first step of that shape runs
    it; refuses (MemoryPlanError) a run that cannot fit. Only the parameters are placed so far."""
    opt_state = abstract_optimizer_state(optimizer, params, mesh)
    analysis = analyse_update(update, cfg, params, opt_state, shapes.worst_case_minibatch(cfg))
    made = memory_plan(cfg, policy.model_cfg, mesh, shapes, params, opt_state, analysis,
                       device_capacity(list(mesh.devices.flat), cfg.train.device_memory_gib))
    return check(cfg, log=log if jax.process_index() == 0 else lambda m: None, plan_made=made)


def make_sampler(cfg: Config, policy, shapes: RunShapes, mesh) -> Sampler:
    tok, model_cfg = policy.tokenizer, policy.model_cfg
    return Sampler(policy.graphdef, pad_id=pad_id(tok), stop_ids=stop_ids(tok, model_cfg.eos_token_ids),
                   max_cache_len=model_cfg.max_position_embeddings, mesh=mesh, share_prefill=cfg.rollout.shared_prefix,
                   decode_slots=cfg.rollout.decode_slots, min_context=shapes.sample_context,
                   min_unique=shapes.min_unique)


def make_judge(cfg: Config, sampler: Sampler, sampling_params, tok, mesh, rows: int) -> Judge | None:
    """The judge of 'judge' rubric items, greedy: the policy with the parameters of the moment
    (`sampling_params()` at each call), or a local model; None without reward.judge."""
    r = cfg.reward
    if not r.judge:
        return None
    if r.judge == "policy":
        generate = lambda prompts, temperature=0.0, seed=0: sampler_generate(  # noqa: E731
            sampler, sampling_params(), tok, r.judge_max_new_tokens, cfg.data.chat_template,
            min_rows=rows)(prompts, temperature, seed)
    else:
        generate = load_judge(r.judge, r.judge_max_new_tokens, mesh, rows)
    return Judge(generate, max_retries=r.judge_retries, retry_temperature=r.judge_retry_temperature)
