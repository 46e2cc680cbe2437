"""One RL step, phase by phase, each a function from values to values:

    prompts -> plan (explorers) -> sample -> score -> revise (explorers) -> advantages
            -> update(s): old log-probs, ppo_epochs x minibatches of the jitted update -> observe (explorers)

`rl_step` sequences them on a train/loop.py Run and folds what each phase reports into the step's
metrics row. Nothing but metrics travels in the metrics dict: an explorer's per-step values (StepInfo)
and the tokens its own sampler calls drew are typed values."""

from __future__ import annotations

import dataclasses
import time

import jax
import numpy as np

from jaxrl_llm.config import Config
from jaxrl_llm.explore.base import KEY_PHASE, Explorers, StepInfo
from jaxrl_llm.explore.rows import RowPlan, Rollouts
from jaxrl_llm.parallel import hosts
from jaxrl_llm.plan.shapes import RunShapes
from jaxrl_llm.rl.batch import RowBatch
from jaxrl_llm.rl.batch import positions as batch_positions
from jaxrl_llm.rl.spec import loss_coefs
from jaxrl_llm.rl.update import make_logprobs
from jaxrl_llm.train.build import everywhere
from jaxrl_llm.train.rollout import plan_rows, rollout_metrics, sample_plan, score, update_rows, with_advantages
from jaxrl_llm.train.state import PHASE_MINIBATCH, PHASE_ROLLOUT
from jaxrl_llm.utils import compile_counter


class PolicyLogprobs:
    """The current policy's tempered log-probs of given tokens (rows layout, the update's dtype): one jitted
    program per row count, the buffer padded to one width so a pass compiles once."""

    def __init__(self, graphdef, compute_dtype: str, mesh, width: int):
        self.graphdef, self.compute_dtype, self.mesh, self.width = graphdef, compute_dtype, mesh, width
        self.programs: dict = {}  # row count -> jitted log-probs

    def program(self, params, rows: int):
        if rows not in self.programs:
            self.programs[rows] = make_logprobs(self.graphdef, self.compute_dtype, params, self.mesh, rows)
        return self.programs[rows]

    def of_output(self, params, out, *, min_rows: int = 0) -> np.ndarray:
        """[n, L] log-probs of a SampleOutput's tokens (rows padded to `min_rows`, as the sampler's)."""
        n, width = out.rows, out.tokens.shape[1]
        rows, w = max(min_rows, n), max(self.width, width)
        tokens = np.full((rows, w), out.pad_id, np.int32)
        tokens[:n, :width] = out.tokens
        temps = np.ones(rows, np.float32)
        temps[:n] = out.temperature
        return hosts.to_host(self.program(params, rows)(params, tokens, temps))[:n, :width]


def step_info(explorers: Explorers, step: int, prompt_ids: np.ndarray, key) -> dict[str, StepInfo]:
    """Each explorer's view of the step, with its own key phase."""
    return {name: StepInfo(step, prompt_ids, key(KEY_PHASE[name], step)) for name in explorers.names}


def plan_step(cfg: Config, explorers: Explorers, states: dict, prompt_ids: np.ndarray,
              info: dict[str, StepInfo], key: jax.Array, step: int) -> RowPlan:
    plan = explorers.plan(states, plan_rows(cfg, prompt_ids, key), info)
    if hosts.count() > 1:  # explorer state is the same on every host by construction; this checks it each step
        hosts.check_same(hosts.digest(plan.prompt, plan.group, plan.temperature, plan.row_keys,
                                      [len(x) for x in plan.prefix], np.concatenate([(), *plan.prefix])),
                         f"the row plan of step {step}")
    return plan


@dataclasses.dataclass(frozen=True)
class Revised:
    rollouts: Rollouts
    metrics: dict  # the explorers' own
    sampled_tokens: int  # tokens the explorers' own sampler calls drew (HeRL's revisions)


def revise(explorers: Explorers, states: dict, rollouts: Rollouts, info: dict[str, StepInfo], sample, score_fn,
           logprobs) -> Revised:
    drawn = []

    def counted(plan, contexts=None, **shape):
        out = sample(plan, contexts, **shape)
        drawn.append(int(out.num_generated.sum()))
        return out

    rollouts, metrics = explorers.revise(states, rollouts, info, counted, score_fn, logprobs)
    return Revised(rollouts, metrics, sum(drawn))


def trainer_old_logp(cfg: Config, rows: RowBatch, params, logprobs: PolicyLogprobs) -> tuple[RowBatch, dict]:
    """With algo.recompute_old_logp the rows' old log-probs are the trainer's forward's (and the gap to the
    sampler's a metric); else the sampler's, as they are."""
    if not cfg.algo.recompute_old_logp:
        return rows, {}
    mask = rows.loss_mask
    trainer = hosts.to_host(logprobs.program(params, rows.rows)(params, rows.tokens, rows.temperature)) * mask
    gap = float(np.abs(trainer - rows.old_logp)[mask].mean()) if mask.any() else 0.0
    return rows.replace(old_logp=trainer.astype(np.float32)), {"logp_gap_sampler_recomputed": gap}


@dataclasses.dataclass(frozen=True)
class Updated:
    params: object
    opt_state: object
    calls: list  # each update call's metrics, on the host
    positions: int  # positions through forward and backward (contexts once each in the shared layout)


_DROPOUT_STREAM = 1 << 20  # folded into the step's minibatch key (whose epochs use 0, 1, ...) for LoRA dropout


def update_policy(cfg: Config, shapes: RunShapes, update, params, opt_state, ref_params, rows: RowBatch,
                  key: jax.Array) -> Updated:
    """ppo_epochs x minibatches calls of the jitted update; with several minibatches each epoch draws its own
    permutation of the rows (fold_in(key, epoch)). Call c's LoRA dropout key is fold_in(dropout_keys, c), where
    dropout_keys = fold_in(key, _DROPOUT_STREAM)."""
    n = rows.rows  # N, unless an explorer added rows (each row count compiles its own programs)
    if n % cfg.algo.minibatches:
        raise ValueError(f"the step ended with {n} rows, which algo.minibatches={cfg.algo.minibatches} "
                         f"does not divide")
    per = n // cfg.algo.minibatches
    calls, positions, coefs = [], 0, loss_coefs(cfg)
    dropout_keys = jax.random.fold_in(key, _DROPOUT_STREAM)
    for epoch in range(cfg.algo.ppo_epochs):
        order = np.arange(n) if cfg.algo.minibatches == 1 else np.asarray(
            jax.random.permutation(jax.random.fold_in(key, epoch), n))
        for m in range(cfg.algo.minibatches):
            batch = shapes.minibatch(cfg, rows, order[m * per:(m + 1) * per])
            positions += batch_positions(batch)
            coefs["dropout_key"] = np.asarray(jax.random.key_data(jax.random.fold_in(dropout_keys, len(calls))))
            params, opt_state, metrics = update(params, opt_state, batch, coefs, ref_params)
            calls.append(metrics)
    return Updated(params, opt_state, jax.device_get(calls), positions)


def update_metrics(u: Updated, seconds: float) -> dict:
    calls = u.calls
    mean = lambda k: float(np.mean([c[k] for c in calls]))  # noqa: E731
    return {"loss": mean("loss"), "grad_norm": mean("grad_norm"), "lr": float(calls[-1]["lr"]),
            "clip_low": mean("clip_low"), "clip_high": mean("clip_high"), "dual_clip": mean("dual_clip"),
            "kl": mean("kl"),
            # first update: the weights that produced old_logp (the sampler's, or the recomputed ones)
            "logp_gap_sampler_trainer": float(calls[0]["logp_gap"]),
            "skipped_nonfinite": int(sum(c["skipped_nonfinite"] for c in calls)),
            "update_tokens_per_s": float(sum(c["update_tokens"] for c in calls) / max(seconds, 1e-9)),
            # loss-bearing or padding
            "update_positions_per_s": float(u.positions / max(seconds, 1e-9)), "time_update_s": seconds}


def rl_step(run, pool, writer) -> dict:
    """One RL step of `run` (train/loop.py) at run.state.step; returns its metrics row."""
    cfg, st = run.cfg, run.state
    items, prompts = run.setup.items, run.setup.prompts
    t0, c0 = time.perf_counter(), time.process_time()
    prompt_ids = np.asarray(next(run.data))
    info = step_info(run.explorers, st.step, prompt_ids, run.key)
    plan = plan_step(cfg, run.explorers, st.explore, prompt_ids, info, run.key(PHASE_ROLLOUT, st.step), st.step)
    params = run.sampling_params()
    t1 = time.perf_counter()
    out = sample_plan(run.sampler, params, cfg, prompts, plan)
    t2 = time.perf_counter()
    score_fn = lambda plan, out: score(pool, run.tok, cfg, items, plan, out, run.judge)  # noqa: E731
    rollouts = score_fn(plan, out)
    sampled = rollout_metrics(rollouts)  # the step's groups as sampled, before any hindsight revision
    t3 = time.perf_counter()
    sample_fn = lambda plan, contexts=None, **shape: sample_plan(  # noqa: E731
        run.sampler, params, cfg, prompts, plan, contexts, **shape)
    revised = revise(run.explorers, st.explore, rollouts, info, sample_fn, score_fn, run.teacher_logprobs)
    rollouts = with_advantages(revised.rollouts, cfg.algo.advantage)
    t4 = time.perf_counter()
    writer.samples(st.step, rollouts, items)
    t5 = time.perf_counter()
    rows, recomputed = trainer_old_logp(cfg, update_rows(rollouts), st.params, run.logprobs)
    updated = update_policy(cfg, run.shapes, run.update, st.params, st.opt_state, st.ref_params, rows,
                            run.key(PHASE_MINIBATCH, st.step))
    st.params, st.opt_state = updated.params, updated.opt_state
    t6 = time.perf_counter()
    st.explore, explore_metrics = run.explorers.observe(st.explore, rollouts, info)
    st.explore = everywhere(run.mesh, st.explore)
    metrics = {**sampled, **revised.metrics,
               # every token sampled this step: the rows' call and any explorer's own calls (HeRL's revisions)
               "sampled_tokens": int(out.num_generated.sum()) + revised.sampled_tokens,
               "sample_tokens_per_s": float(out.num_generated.sum() / max(t2 - t1, 1e-9)),
               "time_sample_s": t2 - t1, "time_reward_s": t3 - t2, "time_revise_s": t4 - t3, **recomputed,
               **update_metrics(updated, t6 - t5), "time_step_s": time.perf_counter() - t0,
               # CPU seconds of this process (all its threads; reward workers' own processes are not in it): the
               # step's cost where other jobs share the machine and its wall time says little
               "cpu_step_s": time.process_time() - c0,
               "compilations": compile_counter.compilations(), **run.health(pool), **explore_metrics}
    metrics["time_other_s"] = metrics["time_step_s"] - metrics["time_sample_s"] - metrics["time_reward_s"] \
        - metrics["time_revise_s"] - metrics["time_update_s"]
    return metrics
