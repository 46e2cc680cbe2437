"""The training run: the only place that knows the order of a step's phases.

    prompts -> plan (explorers) -> sample -> rewards (process pool) -> revise (explorers)
            -> advantages -> update(s) -> observe (explorers) -> metrics
    every eval.every steps: held-out evaluation; every train.checkpoint_every: checkpoint

Random keys derive from fold_in(root, phase, step), the data iterator's state is checkpointed, so
a resumed run draws the same prompts and samples as an uninterrupted one.
"""

from __future__ import annotations

import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec
from tqdm import tqdm

from jaxrl_llm.config import Config
from jaxrl_llm.data.pipeline import prompt_batches
from jaxrl_llm.data.tasks import load_sft_items, load_splits
from jaxrl_llm.model.tokenizer import pad_id, stop_ids
from jaxrl_llm.parallel import hosts
from jaxrl_llm.parallel.memory_plan import check_run as check_run_memory
from jaxrl_llm.parallel.mesh import make_mesh
from jaxrl_llm.rewards.judge import Judge, judge_items, load_judge, sampler_generate
from jaxrl_llm.rewards.pool import RewardPool
from jaxrl_llm.rewards.rubrics import rubric_items
from jaxrl_llm.rl.forward import cast_floats
from jaxrl_llm.explore.base import KEY_PHASE, Explorers, Setup, StepInfo
from jaxrl_llm.explore.registry import build_explorers
from jaxrl_llm.explore.rows import Rollouts
from jaxrl_llm.rl.batch import RowBatch
from jaxrl_llm.rl.batch import positions as batch_positions
from jaxrl_llm.rl.layout import contexts_bound, rows_layout, shared_layout
from jaxrl_llm.rl.update import (UpdateSpec, abstract_optimizer_state, init_optimizer, make_logprobs, make_optimizer,
                                 make_update)
from jaxrl_llm.sampling.buckets import bucket
from jaxrl_llm.sampling.sampler import Sampler
from jaxrl_llm.train.checkpoint import Checkpointer
from jaxrl_llm.train.evaluate import evaluate
from jaxrl_llm.train.export import export_policy
from jaxrl_llm.train.policy import build_policy, encode_items, encode_text
from jaxrl_llm.train.run_dir import RunFolder, holding_folder
from jaxrl_llm.train.rollout import plan_rows, rollout_metrics, sample_plan, score, update_rows, with_advantages
from jaxrl_llm.train.sft import sft_batch
from jaxrl_llm.train.state import TrainState
from jaxrl_llm.train.stop import RESUME_EXIT_CODE, StopFlag, maintenance_url
from jaxrl_llm.train.tracking import Tracker, summary
from jaxrl_llm.utils import compile_counter

PHASE_ROLLOUT, PHASE_EVAL, PHASE_SFT, PHASE_MINIBATCH = 1, 2, 3, 4
def rl_update_spec(cfg: Config, shared: bool | None = None) -> UpdateSpec:
    """The RL update's static spec for `cfg` (layout from rollout.shared_prefix unless `shared` says)."""
    a = cfg.algo
    mb_rows = cfg.rollout.prompts_per_step * cfg.rollout.group_size // a.minibatches
    shared = cfg.rollout.shared_prefix if shared is None else shared
    return UpdateSpec(mode="rl", loss_agg=a.loss_agg, kl_estimator=a.kl_estimator, use_kl=a.kl_coef > 0,
                      micro_batches=max(1, mb_rows // a.micro_batch), compute_dtype=cfg.model.compute_dtype,
                      layout="shared" if shared else "rows")


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


def _coefs(cfg: Config) -> dict:
    a = cfg.algo
    return {"eps_low": a.eps_low, "eps_high": a.eps_high, "dual_clip": a.dual_clip, "kl_coef": a.kl_coef,
            "hindsight_gamma": a.hindsight_gamma,
            "norm_len": float(cfg.rollout.max_new_tokens)}


class Run:
    """A run: what stays fixed (policy graph, data, sampler, compiled updates, explorers) and its
    train state (train/state.py), the only thing that changes. `train()` drives it.

    A run goes through stages, and a checkpoint marks how far it got, so a resumed run redoes
    nothing it finished: evaluation before SFT, SFT steps (checkpoints in `sft_checkpoints/`), the
    step-0 evaluation, RL steps (checkpoints in `checkpoints/`). A checkpoint is the train state.
    The folder is locked while the run builds, resumes, trains (train/run_dir.py); `read_only` (eval): never.
    """

    def __init__(self, cfg: Config, log=tqdm.write, *, read_only: bool = False):
        self.cfg, self.log = cfg, log
        self.folder = RunFolder(cfg, log, read_only=read_only)
        with self.folder.held():  # a second writer is refused before anything is built or written
            self.folder.prepare()
            self._build(cfg)

    def _build(self, cfg: Config) -> None:
        self.stopped = False  # train() was stopped by a signal or a maintenance event (it saved first)
        self.out_dir = Path(cfg.train.out_dir)
        self.mesh = make_mesh({"data": cfg.mesh.data, "fsdp": cfg.mesh.fsdp, "tensor": cfg.mesh.tensor})
        self.policy, params = build_policy(cfg, self.mesh, self.folder.policy_dir())
        tok = self.tok = self.policy.tokenizer
        train_items, eval_items = load_splits(cfg.data)
        self.train_items, dropped = encode_items(tok, cfg, train_items)
        eval_items, eval_dropped = encode_items(tok, cfg, eval_items)
        self.eval_items = eval_items[:cfg.eval.size]
        sft_items, sft_dropped = encode_items(tok, cfg, load_sft_items(cfg.data)) if cfg.sft.steps > 0 else ([], 0)
        self.sft_items = sft_items or self.train_items  # SFT on separate items when the config has them
        self.dropped_prompts = dropped + eval_dropped + sft_dropped
        if not self.train_items:
            raise ValueError("no training prompts left (all dropped as longer than data.max_prompt_len?)")
        model_cfg = self.policy.model_cfg
        self.rows = cfg.rollout.prompts_per_step * cfg.rollout.group_size
        o = cfg.optim
        self.optimizer = make_optimizer(o.lr, warmup_steps=o.warmup_steps, schedule=o.schedule,
                                        total_steps=cfg.train.steps * cfg.algo.ppo_epochs * cfg.algo.minibatches,
                                        weight_decay=o.weight_decay, b1=o.b1, b2=o.b2, max_grad_norm=o.max_grad_norm)
        self.sft_opt = make_optimizer(cfg.sft.lr, max_grad_norm=o.max_grad_norm)
        self.update = make_update(self.policy.graphdef, rl_update_spec(cfg), self.optimizer, params,
                                  abstract_optimizer_state(self.optimizer, params, self.mesh), self.mesh)
        self.sft_update = None  # built when SFT runs
        self._logprobs = {}  # row count -> jitted log-probs (algo.recompute_old_logp)
        self.sample_dtype = jnp.dtype(cfg.model.compute_dtype)
        self._cast_for_sampling = jax.jit(lambda p: cast_floats(p, self.sample_dtype))
        self.data = prompt_batches(len(self.train_items), cfg.rollout.prompts_per_step, cfg.data.seed)
        self.explorers = Explorers(build_explorers(cfg))
        self.setup = Setup(num_items=len(self.train_items), prompts_per_step=cfg.rollout.prompts_per_step,
                           group_size=cfg.rollout.group_size, rows=self.rows, total_steps=cfg.train.steps,
                           steps_per_epoch=max(1, len(self.train_items) // cfg.rollout.prompts_per_step),
                           vocab_size=model_cfg.vocab_size, temperature=cfg.rollout.temperature,
                           item_difficulty=np.array([it.difficulty for it, _ in self.train_items], np.float32),
                           items=[it for it, _ in self.train_items], prompts=[ids for _, ids in self.train_items],
                           tokenizer=tok, max_new_tokens=cfg.rollout.max_new_tokens, mesh=self.mesh,
                           encode=lambda text: encode_text(tok, cfg, text))
        explore_state = self._global(self.explorers.init(self.setup))
        self.min_group = self.explorers.min_group_size(cfg.rollout.group_size)  # after init: sized by the run
        # explorers that add contexts get one context length and count bucket for the whole run, so their rows
        # compile nothing after warm-up: sampling's for RRL's prompt + prefix, the update's also HeRL's revise prompts
        self.extra_contexts = self.explorers.extra_contexts()
        longest = max(len(ids) for _, ids in self.train_items + eval_items)
        prefix, own = self.explorers.prefix_tokens(), self.explorers.context_tokens()
        self.sample_context = bucket(longest + prefix, 16) if prefix else 16
        self.min_context = bucket(max(longest + prefix, own), 16) if prefix or own else 16
        # teacher-forced log-probs of rows moved under another context (HeRL train_on=original): one width
        self.logprob_width = bucket(longest + cfg.rollout.max_new_tokens, 16)
        judged = [it.uid for it, _ in self.train_items + eval_items
                  if it.rubric and judge_items(rubric_items(it.rubric))]
        if judged and not cfg.reward.judge:
            raise ValueError(f"{len(judged)} tasks have rubric items checked by 'judge' (first: {judged[0]}); set "
                             f"reward.judge=policy (or a local model folder) to have them judged, or remove those "
                             f"items")
        # the judge of 'judge' rubric items, greedy: the policy with the parameters of the moment, or a local model
        self.judge = None
        if cfg.reward.judge == "policy":
            self.judge = Judge(lambda prompts, temperature=0.0, seed=0: sampler_generate(
                self.sampler, self.sampling_params(), tok, cfg.reward.judge_max_new_tokens, cfg.data.chat_template,
                min_rows=self.rows)(prompts, temperature, seed), max_retries=cfg.reward.judge_retries,
                retry_temperature=cfg.reward.judge_retry_temperature)
        elif cfg.reward.judge:
            self.judge = Judge(load_judge(cfg.reward.judge, cfg.reward.judge_max_new_tokens, self.mesh, self.rows),
                               max_retries=cfg.reward.judge_retries,
                               retry_temperature=cfg.reward.judge_retry_temperature)
        self.sampler = Sampler(self.policy.graphdef, pad_id=pad_id(tok), stop_ids=stop_ids(tok, model_cfg.eos_token_ids),
                               max_cache_len=model_cfg.max_position_embeddings, mesh=self.mesh,
                               share_prefill=cfg.rollout.shared_prefix, min_context=self.sample_context,
                               min_unique=cfg.rollout.prompts_per_step + self.extra_contexts
                               if self.extra_contexts else 1)
        # before the optimizer state, the sampler's cache or any step takes memory: refuse what cannot fit
        self.memory_plan = check_run_memory(self, params, longest) if cfg.train.memory_check else None
        first_opt = self.sft_opt if cfg.sft.steps > 0 else self.optimizer
        self.state = TrainState(params=params, opt_state=init_optimizer(first_opt, params, self.mesh),
                                explore=explore_state, seed=cfg.train.seed)
        self.root = self.state.root()
        self.ckpt, self.sft_ckpt = (Checkpointer(self.out_dir / name, keep=cfg.train.keep_checkpoints, log=self.log,
                                                 async_save=cfg.train.async_checkpoint, read_only=self.folder.read_only)
                                    for name in ("checkpoints", "sft_checkpoints"))

    def reward_pool(self) -> RewardPool:  # its workers load this run's tasks' scorers before the first item is timed
        scorers = {it.scorer for it, _ in self.train_items + self.eval_items}
        r = self.cfg.reward
        return RewardPool(r.workers, r.timeout_s, scorers=scorers, memory_mb=r.memory_mb, file_mb=r.file_mb,
                          start_retries=r.start_retries, functions=r.functions)

    def _maintenance_url(self) -> str:
        return maintenance_url(self.cfg.train.maintenance_url, self.mesh.devices.flat[0].platform)

    def _global(self, tree):
        """Explorer state as arrays over the whole mesh on a multi-host run (every process holds the same values,
        and orbax saves global arrays); ones already laid out over the mesh (RRL's replay array) stay as they are."""
        if hosts.count() == 1:
            return tree
        everywhere = NamedSharding(self.mesh, PartitionSpec())
        return jax.tree.map(lambda x: x if isinstance(x, jax.Array) and not x.is_fully_addressable
                            else hosts.put(np.asarray(x), everywhere), tree)

    # -- the train state in checkpoints -----------------------------------------------------------
    def _arrays_like(self, registry: dict) -> dict:
        """The array fields a checkpoint of `registry`'s stage holds for this run (structure and layout)."""
        st = self.state
        like = {"params": st.params, "opt_state": st.opt_state}  # SFT's and RL's optimizers share a structure
        if registry.get("stage") == "rl" and self.cfg.algo.kl_coef > 0:
            like["ref_params"] = st.params
        if jax.tree.leaves(st.explore):
            like["explore"] = st.explore
        return like

    def save(self, wait: bool = False) -> str:
        """Checkpoint the train state; returns what was saved, in words."""
        st = self.state
        st.data = self.data.get_state()
        arrays, registry = st.split()
        registry["model_signature"], registry["config"] = self.policy.signature(), self.folder.record
        ckpt, step = (self.ckpt, st.step) if st.stage == "rl" else (self.sft_ckpt, st.sft_step)
        what = f"RL step {st.step}" if st.stage == "rl" else \
            f"SFT step {st.sft_step}/{self.cfg.sft.steps} (policy and SFT optimizer state)"
        if not ckpt.save(step, arrays, registry, wait=wait):  # the checkpoint this state was resumed from
            return f"{what}: already in {ckpt.directory}/{step}, kept as it was"
        return f"{what} to {ckpt.directory}/{step}"

    @holding_folder  # a damaged checkpoint may be moved aside: only by the folder's one writer
    def try_resume(self) -> bool:
        if not self.cfg.train.resume:
            return False
        sig, check = self.policy.signature(), self.folder.check
        found = self.ckpt.restore_latest(self._arrays_like, sig, log=self.log, check=check)
        if found is None:
            found = self.sft_ckpt.restore_latest(self._arrays_like, sig, log=self.log, check=check)
            if found is None:
                return False
        where, arrays, reg = found
        self.state = st = self.state.joined(arrays, reg)
        self.data.set_state(st.data)
        if st.seed != self.cfg.train.seed:  # the key root must stay that of the checkpointed run
            self.log(f"train.seed={self.cfg.train.seed} ignored: resuming the run seeded {st.seed}")
        self.root = st.root()
        path = f"{(self.ckpt if st.stage == 'rl' else self.sft_ckpt).directory}/{where}"
        self.log(f"resumed from {path} ("
                 + (f"RL step {st.step}" if st.stage == "rl" else f"SFT step {st.sft_step}/{self.cfg.sft.steps}") + ")")
        self.folder.resumed(reg, path, st.step)
        return True

    def key(self, phase: int, step: int) -> jax.Array:
        return jax.random.fold_in(jax.random.fold_in(self.root, phase), step)

    # -- phases -----------------------------------------------------------------------------------
    def _build_sft(self) -> None:
        if self.sft_update is not None:
            return
        cfg, params = self.cfg, self.state.params
        spec = UpdateSpec(mode="sft", micro_batches=max(1, cfg.sft.batch_size // cfg.algo.micro_batch),
                          compute_dtype=cfg.model.compute_dtype)
        self.sft_update = make_update(self.policy.graphdef, spec, self.sft_opt, params,
                                      abstract_optimizer_state(self.sft_opt, params, self.mesh), self.mesh)

    def run_sft(self, writer: Tracker, stop: StopFlag) -> None:
        """SFT steps from the current one on; returns early (the caller checkpoints) when a stop is asked."""
        cfg, st = self.cfg, self.state
        self._build_sft()
        rows, eos = cfg.sft.batch_size, self.tok.eos_token_id
        bar = tqdm(total=cfg.sft.steps, initial=st.sft_step, desc="sft", disable=jax.process_index() != 0)
        while st.sft_step < cfg.sft.steps and not stop.sync():
            s = st.sft_step + 1
            rng = np.random.default_rng((st.seed, PHASE_SFT, s))  # step s draws the same rows after a resume
            pairs = [self.sft_items[i] for i in rng.choice(len(self.sft_items), rows, replace=False)]
            st.params, st.opt_state, m = self.sft_update(
                st.params, st.opt_state, sft_batch(self.tok, cfg, pairs, self.sampler.pad_id, eos), _coefs(cfg))
            st.sft_step = s
            bar.update(1)
            if s % 10 == 0 or s == cfg.sft.steps:
                self._write(writer, s, {"nll": float(m["nll"]), "grad_norm": float(m["grad_norm"])}, kind="sft")
        bar.close()

    def start_rl(self) -> None:
        """SFT (if any) is done: fix the KL reference, give the RL optimizer a fresh state."""
        st = self.state
        st.ref_params = jax.tree.map(jnp.copy, st.params) if self.cfg.algo.kl_coef > 0 else None
        if self.cfg.sft.steps > 0:
            st.opt_state = init_optimizer(self.optimizer, st.params, self.mesh)
        st.stage = "rl"

    def _recompute_logp(self, rows: int):
        if rows not in self._logprobs:
            self._logprobs[rows] = make_logprobs(self.policy.graphdef, self.cfg.model.compute_dtype,
                                                 self.state.params, self.mesh, rows)
        return self._logprobs[rows]

    def teacher_logprobs(self, out, *, min_rows: int = 0) -> np.ndarray:
        """The current policy's tempered log-probs [n, L] of out's tokens (rows padded to the caller's
        `min_rows`, as the sampler's, and the buffer to one width, so the pass compiles once)."""
        n, width = out.rows, out.tokens.shape[1]
        rows, w = max(min_rows, n), max(self.logprob_width, width)
        tokens = np.full((rows, w), out.pad_id, np.int32)
        tokens[:n, :width] = out.tokens
        temps = np.ones(rows, np.float32)
        temps[:n] = out.temperature
        lp = self._recompute_logp(rows)(self.state.params, tokens, temps)
        return hosts.to_host(lp)[:n, :width]

    def sampling_params(self):
        """The policy as the sampler should see it: in the update's compute dtype, so old log-probs are
        the trainer's numbers (a bf16 run samples with bf16 weights, not its float32 master copy)."""
        if self.sample_dtype == jnp.float32:
            return self.state.params
        return self._cast_for_sampling(self.state.params)

    def rollouts(self, pool: RewardPool, prompt_ids: np.ndarray) -> tuple[Rollouts, dict]:
        """The step's rows: plan (explorers may change it), sample, score, revise, advantages."""
        cfg, st = self.cfg, self.state
        items, prompts = self.setup.items, self.setup.prompts
        info = {name: StepInfo(st.step, prompt_ids, self.key(KEY_PHASE[name], st.step)) for name in self.explorers.names}
        plan = self.explorers.plan(st.explore, plan_rows(cfg, prompt_ids, self.key(PHASE_ROLLOUT, st.step)), info)
        if hosts.count() > 1:  # explorer state is the same on every host by construction; this checks it each step
            hosts.check_same(hosts.digest(plan.prompt, plan.group, plan.temperature, plan.row_keys,
                                          [len(x) for x in plan.prefix], np.concatenate([(), *plan.prefix])),
                             f"the row plan of step {st.step}")
        params = self.sampling_params()
        t0 = time.perf_counter()
        out = sample_plan(self.sampler, params, cfg, prompts, plan)
        t1 = time.perf_counter()
        score_fn = lambda plan, out: score(pool, self.tok, cfg, items, plan, out, self.judge)  # noqa: E731
        rollouts = score_fn(plan, out)
        sampled = rollout_metrics(rollouts)  # the step's groups as sampled, before any hindsight revision
        t2 = time.perf_counter()
        sample_fn = lambda plan, contexts=None, **shape: sample_plan(  # noqa: E731
            self.sampler, params, cfg, prompts, plan, contexts, **shape)
        rollouts, revise_metrics = self.explorers.revise(st.explore, rollouts, info, sample_fn, score_fn,
                                                         self.teacher_logprobs)
        rollouts = with_advantages(rollouts, cfg.algo.advantage)
        t3 = time.perf_counter()
        metrics = {**sampled, **revise_metrics,
                   # every token sampled this step: the rows' call and any explorer's own calls (HeRL's revisions)
                   "sampled_tokens": int(out.num_generated.sum()) + int(revise_metrics.get("herl_sampled_tokens", 0)),
                   "sample_tokens_per_s": float(out.num_generated.sum() / max(t1 - t0, 1e-9)),
                   "time_sample_s": t1 - t0, "time_reward_s": t2 - t1, "time_revise_s": t3 - t2}
        return rollouts, dict(info=info, **metrics)

    def rl_step(self, pool: RewardPool, writer: Tracker) -> dict:
        cfg, st = self.cfg, self.state
        t0 = time.perf_counter()
        rollouts, metrics = self.rollouts(pool, np.asarray(next(self.data)))
        info = metrics.pop("info")
        writer.samples(st.step, rollouts, self.setup.items)
        t1 = time.perf_counter()
        full = update_rows(rollouts)
        if cfg.algo.recompute_old_logp:
            mask = full.loss_mask
            trainer_logp = hosts.to_host(self._recompute_logp(full.rows)(st.params, full.tokens, full.temperature)) * mask
            metrics["logp_gap_sampler_recomputed"] = float(np.abs(trainer_logp - full.old_logp)[mask].mean()) \
                if mask.any() else 0.0
            full = full.replace(old_logp=trainer_logp.astype(np.float32))
        rows = full.rows  # N, unless an explorer added rows (each row count compiles its own programs)
        if rows % cfg.algo.minibatches:
            raise ValueError(f"the step ended with {rows} rows, which algo.minibatches={cfg.algo.minibatches} "
                             f"does not divide")
        mb_rows = rows // cfg.algo.minibatches
        ups, positions = [], 0
        for epoch in range(cfg.algo.ppo_epochs):
            order = np.arange(rows) if cfg.algo.minibatches == 1 else np.asarray(
                jax.random.permutation(jax.random.fold_in(self.key(PHASE_MINIBATCH, st.step), epoch), rows))
            for m in range(cfg.algo.minibatches):
                batch = minibatch(cfg, full, order[m * mb_rows:(m + 1) * mb_rows], min_group=self.min_group,
                                  extra_contexts=self.extra_contexts, min_context=self.min_context)
                positions += batch_positions(batch)
                st.params, st.opt_state, um = self.update(st.params, st.opt_state, batch, _coefs(cfg), st.ref_params)
                ups.append(um)
        ups = jax.device_get(ups)
        t2 = time.perf_counter()
        st.explore, explore_metrics = self.explorers.observe(st.explore, rollouts, info)
        st.explore = self._global(st.explore)
        first = ups[0]
        metrics.update({
            "loss": float(np.mean([u["loss"] for u in ups])),
            "grad_norm": float(np.mean([u["grad_norm"] for u in ups])),
            "lr": float(ups[-1]["lr"]), "clip_low": float(np.mean([u["clip_low"] for u in ups])),
            "clip_high": float(np.mean([u["clip_high"] for u in ups])),
            "dual_clip": float(np.mean([u["dual_clip"] for u in ups])), "kl": float(np.mean([u["kl"] for u in ups])),
            # first update: the weights that produced old_logp (the sampler's, or the recomputed ones)
            "logp_gap_sampler_trainer": float(first["logp_gap"]),
            "skipped_nonfinite": int(sum(u["skipped_nonfinite"] for u in ups)),
            "update_tokens_per_s": float(sum(u["update_tokens"] for u in ups) / max(t2 - t1, 1e-9)),
            # positions that go through forward and backward (contexts once each in the shared layout),
            # loss-bearing or padding
            "update_positions_per_s": float(positions / max(t2 - t1, 1e-9)),
            "time_update_s": t2 - t1, "time_step_s": time.perf_counter() - t0,
            "compilations": compile_counter.compilations(), "reward_errors": hosts.sum_int(pool.stats.errors),
            "reward_timeouts": hosts.sum_int(pool.stats.timeouts), "reward_memory": hosts.sum_int(pool.stats.memory),
            "reward_killed": hosts.sum_int(pool.stats.killed), "dropped_prompts": self.dropped_prompts,
            **({"judge_parse_failures": self.judge.parse_failures, "judge_pass_rate": self.judge.pass_rate}
               if self.judge is not None else {}),
            **explore_metrics,
        })
        metrics["time_other_s"] = metrics["time_step_s"] - metrics["time_sample_s"] - metrics["time_reward_s"] \
            - metrics["time_revise_s"] - metrics["time_update_s"]
        return metrics

    def evaluate(self, pool: RewardPool) -> dict:
        items = self.eval_items if self.cfg.eval.split == "heldout" else self.train_items[:self.cfg.eval.size]
        return evaluate(self.sampler, self.sampling_params(), pool, self.tok, self.cfg, items,
                        self.key(PHASE_EVAL, self.state.step), self.judge)

    # -- the loop ---------------------------------------------------------------------------------
    def _write(self, writer: Tracker, step: int, metrics: dict, kind: str = "train") -> None:
        writer.write(step, metrics, kind=kind)
        self.state.metrics_rows = writer.rows

    def _eval(self, writer: Tracker, pool: RewardPool, kind: str, label: str) -> dict:
        result = self.evaluate(pool)
        self._write(writer, self.state.sft_step if kind == "eval_before_sft" else self.state.step, result, kind)
        self.log(f"{label} held-out: {_fmt(result)}")
        return result

    @holding_folder  # for the run's lifetime; the kernel releases it if the process dies
    def train(self) -> dict:
        cfg = self.cfg
        resumed = self.try_resume()
        st = self.state
        self.folder.record_start()
        if resumed and st.stage == "rl" and st.step >= cfg.train.steps:
            return self._already_complete()
        writer = Tracker(cfg, keep_rows=st.metrics_rows)
        last_eval: dict = {}
        saved = ""
        watchdog = (cfg.train.watchdog_floor_s, cfg.train.watchdog_ceiling_s)
        with self.reward_pool() as pool, StopFlag(self._maintenance_url(), self.log, watchdog) as stop:
            if st.stage == "start" and cfg.sft.steps > 0:
                self._eval(writer, pool, "eval_before_sft", "before SFT")
                st.stage = "sft"
            if st.stage in ("start", "sft") and not stop.sync():
                if cfg.sft.steps > 0:
                    self.run_sft(writer, stop)
                if not stop.sync():
                    self.start_rl()
                    last_eval = self._eval(writer, pool, "eval", "step 0")
                    saved = self.save(wait=stop.agreed)  # SFT and the step-0 evaluation are not redone
            bar = tqdm(total=cfg.train.steps, initial=st.step, desc="train", disable=jax.process_index() != 0)
            while st.stage == "rl" and st.step < cfg.train.steps and not stop.sync():
                st.step += 1
                m = self.rl_step(pool, writer)
                self._write(writer, st.step, m)
                bar.set_postfix(reward=f"{m['reward_mean']:.3f}", acc=f"{m['accuracy']:.2f}",
                                H=f"{m['entropy']:.2f}", T=f"{m['temperature']:.2f}",
                                tok_s=f"{m['sample_tokens_per_s']:.0f}")
                bar.update(1)
                if st.step % cfg.eval.every == 0 or st.step == cfg.train.steps:
                    last_eval = self._eval(writer, pool, "eval", f"step {st.step}")
                stopping = stop.sync()  # every process, every step: the collective runs in step with the others
                if st.step % cfg.train.checkpoint_every == 0 or st.step == cfg.train.steps or stopping:
                    saved = self.save(wait=stop.agreed)
            bar.close()
            if stop.sync() and st.stage != "rl":
                saved = self.save(wait=True)
        self.ckpt.close()
        self.sft_ckpt.close()
        writer.close()
        self.stopped = stop.agreed
        if stop.agreed:
            self.log(f"stopped by {stop.describe()}; saved {saved}; run the same command again to resume "
                     f"(exit status {RESUME_EXIT_CODE})")
            return last_eval
        if jax.process_index() == 0 and (self.out_dir / "metrics.jsonl").exists():
            self.log(summary(self.out_dir))
        if cfg.train.export_final:
            self._export(self.out_dir / "final")
        return last_eval

    def _export(self, final: Path) -> None:
        """The policy as a Hugging Face folder, written by process 0 (every process takes part in gathering
        parameters sharded over hosts)."""
        params = self.state.params
        if hosts.count() > 1:
            params = jax.tree.map(lambda x: jnp.asarray(hosts.to_host(x)), params)
        if jax.process_index() == 0:
            export_policy(nnx.merge(self.policy.graphdef, params), final, self.tok)
            self.log(f"exported the final policy to {final}")

    def _already_complete(self) -> dict:
        self.ckpt.close()
        self.sft_ckpt.close()
        final = self.out_dir / "final"
        self.log(f"{self.out_dir} is complete: {self.state.step} of train.steps={self.cfg.train.steps} RL steps done"
                 + (f"; final policy in {final}" if (final / "config.json").is_file() else "")
                 + "; raise train.steps to continue it, or use another train.out_dir")
        if self.cfg.train.export_final and not (final / "config.json").is_file():
            self._export(final)
        return {}


def _fmt(m: dict) -> str:
    return ", ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in m.items())
