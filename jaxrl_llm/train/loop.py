"""The training run: its parts (built by train/build.py) and its train state, the only thing that changes.

    data -> policy -> explorers' footprint -> run shapes -> memory plan -> update, sampler, judge -> state
    train(): resume -> [eval before SFT] -> SFT -> step-0 eval -> RL steps (train/step.py) -> report, export

Random keys derive from fold_in(root, phase, step), the data iterator's state is checkpointed, so
a resumed run draws the same prompts and samples as an uninterrupted one.
"""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
from tqdm import tqdm

from jaxrl_llm.config import Config
from jaxrl_llm.data.pipeline import prompt_batches
from jaxrl_llm.explore.base import Explorers
from jaxrl_llm.explore.registry import build_explorers
from jaxrl_llm.parallel import hosts
from jaxrl_llm.parallel.mesh import make_mesh
from jaxrl_llm.plan.shapes import RunShapes
from jaxrl_llm.rewards.pool import RewardPool
from jaxrl_llm.rl.forward import cast_floats
from jaxrl_llm.rl.spec import rl_optimizer, sft_optimizer, update_spec
from jaxrl_llm.rl.update import abstract_optimizer_state, init_optimizer, make_update
from jaxrl_llm.train import build, report, saving, stages
from jaxrl_llm.train.checkpoint import Checkpointer
from jaxrl_llm.train.policy import build_policy
from jaxrl_llm.train.run_dir import RunFolder, holding_folder
from jaxrl_llm.train.state import TrainState, phase_key
from jaxrl_llm.train.step import PolicyLogprobs
from jaxrl_llm.train.stop import StopFlag, maintenance_url
from jaxrl_llm.train.tracking import Tracker
from jaxrl_llm.utils.cpu import bf16_advice


class Run:
    """A run: what stays fixed (policy graph, data, shapes, sampler, compiled updates, explorers) and its
    train state (train/state.py). `train()` drives it through its stages (train/stages.py); a checkpoint
    marks how far it got (train/saving.py), so a resumed run redoes nothing it finished.
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
        raw = build.load_data(cfg, self.log)  # before the model: a data error comes first
        self.mesh = make_mesh({"data": cfg.mesh.data, "fsdp": cfg.mesh.fsdp, "tensor": cfg.mesh.tensor})
        self.policy, params = build_policy(cfg, self.mesh, self.folder.policy_dir())
        self.tok = self.policy.tokenizer
        data = build.encode_data(self.tok, cfg, raw)
        self.train_items, self.eval_items, self.sft_items = data.train_items, data.eval_items, data.sft_items
        self.dropped_prompts, self.truncated_prompts = data.dropped_prompts, data.truncated_prompts
        if data.truncated_prompts:
            self.log(f"{data.truncated_prompts} prompts longer than data.max_prompt_len={cfg.data.max_prompt_len} "
                     f"keep only their last tokens (data.overlong=truncate); metric truncated_prompts")
        self.pool, self.counts_base = None, {}  # the reward pool while training; the checkpoint's counts (resumed)
        self.data = prompt_batches(len(self.train_items), cfg.rollout.prompts_per_step, cfg.data.seed)
        self.explorers = Explorers(build_explorers(cfg))
        self.setup = build.explorer_setup(cfg, data, self.tok, self.mesh, self.policy.model_cfg.vocab_size)
        explore_state, footprint = self.explorers.start(self.setup)
        self.shapes = RunShapes.of(cfg, self.policy.model_cfg, data.longest, footprint)
        self.optimizer, self.sft_opt = rl_optimizer(cfg), sft_optimizer(cfg)
        self.update = make_update(self.policy.graphdef, update_spec(cfg), self.optimizer, params,
                                  abstract_optimizer_state(self.optimizer, params, self.mesh), self.mesh)
        self.sft_update = None  # built when SFT runs
        # before the optimizer state, the sampler's cache or any step takes memory: refuse what cannot fit
        self.memory_plan = build.plan_memory(cfg, self.shapes, self.policy, self.mesh, params, self.optimizer,
                                             self.update, self.log) if cfg.train.memory_check else None
        self.logprobs = PolicyLogprobs(self.policy.graphdef, cfg.model.compute_dtype, self.mesh,
                                       self.shapes.logprob_width)
        self.sample_dtype = jnp.dtype(cfg.model.compute_dtype)
        advice = bf16_advice(jax.default_backend(), cfg.model.compute_dtype)
        if advice:
            self.log(advice)
        self._cast_for_sampling = jax.jit(lambda p: cast_floats(p, self.sample_dtype))
        self.sampler = build.make_sampler(cfg, self.policy, self.shapes, self.mesh)
        self.judge = build.make_judge(cfg, self.sampler, self.sampling_params, self.tok, self.mesh, self.rows)
        first_opt = self.sft_opt if cfg.sft.steps > 0 else self.optimizer
        self.state = TrainState(params=params, opt_state=init_optimizer(first_opt, params, self.mesh),
                                explore=build.everywhere(self.mesh, explore_state), seed=cfg.train.seed)
        self.root = self.state.root()
        self.ckpt, self.sft_ckpt = (Checkpointer(self.out_dir / name, keep=cfg.train.keep_checkpoints, log=self.log,
                                                 async_save=cfg.train.async_checkpoint, read_only=self.folder.read_only)
                                    for name in ("checkpoints", "sft_checkpoints"))

    # -- what other code reads of a run ---------------------------------------------------------------
    rows = property(lambda self: self.shapes.rows)
    min_group = property(lambda self: self.shapes.min_group)
    extra_contexts = property(lambda self: self.shapes.extra_contexts)
    min_context = property(lambda self: self.shapes.min_context)
    _logprobs = property(lambda self: self.logprobs.programs)

    def key(self, phase: int, step: int) -> jax.Array:
        return phase_key(self.root, phase, step)

    def sampling_params(self):
        """The policy as the sampler should see it: in the update's compute dtype, so old log-probs are
        the trainer's numbers (a bf16 run samples with bf16 weights, not its float32 master copy)."""
        if self.sample_dtype == jnp.float32:
            return self.state.params
        return self._cast_for_sampling(self.state.params)

    def teacher_logprobs(self, out, *, min_rows: int = 0):
        """The current policy's tempered log-probs [n, L] of out's tokens (train/step.py PolicyLogprobs)."""
        return self.logprobs.of_output(self.state.params, out, min_rows=min_rows)

    def reward_pool(self) -> RewardPool:  # its workers load this run's tasks' scorers before the first item is timed
        scorers = {it.scorer for it, _ in self.train_items + self.eval_items}
        r = self.cfg.reward
        return RewardPool(r.workers, r.timeout_s, scorers=scorers, memory_mb=r.memory_mb, file_mb=r.file_mb,
                          start_retries=r.start_retries, functions=r.functions)

    def counts(self, pool: RewardPool) -> dict:
        """The run's counts of what went wrong from its start: reward checks (over every host) and the judge's, on
        from the checkpoint's (TrainState.counts) in a resumed run. A collective: every process calls it."""
        s = pool.stats
        now = {"reward_errors": hosts.sum_int(s.errors), "reward_timeouts": hosts.sum_int(s.timeouts),
               "reward_memory": hosts.sum_int(s.memory), "reward_killed": hosts.sum_int(s.killed),
               **({"judge_parse_failures": self.judge.parse_failures, "judge_too_long": self.judge.too_long}
                  if self.judge is not None else {})}
        return {k: self.counts_base.get(k, 0) + v for k, v in now.items()}

    def health(self, pool: RewardPool) -> dict:
        """The step's counts of what went wrong so far (`counts`), dropped prompts, the judge's pass rate."""
        return {**self.counts(pool), "dropped_prompts": self.dropped_prompts,
                "truncated_prompts": self.truncated_prompts,
                **({"judge_pass_rate": self.judge.pass_rate} if self.judge is not None else {})}

    def evaluate(self, pool: RewardPool) -> dict:
        return stages.held_out(self, pool)

    def run_sft(self, writer, stop) -> None:
        stages.sft(self, writer, stop)

    def save(self, wait: bool = False) -> str:
        return saving.save(self, wait)

    def try_resume(self) -> bool:
        return saving.try_resume(self)

    @holding_folder  # for the run's lifetime; the kernel releases it if the process dies
    def train(self) -> dict:
        cfg = self.cfg
        resumed = self.try_resume()
        self.folder.record_start()
        if resumed and self.state.stage == "rl" and self.state.step >= cfg.train.steps:
            return report.already_complete(self)
        writer = Tracker(cfg, keep_rows=self.state.metrics_rows)
        maintenance = maintenance_url(cfg.train.maintenance_url, self.mesh.devices.flat[0].platform)
        watchdog = (cfg.train.watchdog_floor_s, cfg.train.watchdog_ceiling_s, cfg.train.watchdog_stale_s)
        with self.reward_pool() as pool, StopFlag(maintenance, self.log, watchdog) as stop:
            self.pool = pool  # what a save reads its counts from
            last_eval, saved = stages.before_rl(self, writer, pool, stop)
            last_eval, saved = stages.rl(self, writer, pool, stop, last_eval, saved)
            if stop.sync() and self.state.stage != "rl":
                saved = self.save(wait=True)
            self.pool = None
        # the last checkpoint may still be committing (async) and the export is to come: a SIGTERM there would kill
        # the process at once, losing that checkpoint. The handlers stay on (no watchdog: other hosts may be gone)
        with StopFlag(log=self.log) as late:
            report.finish(self, writer, stop, saved)
        if late.requested:
            self.log(f"{late.describe()} arrived while the run closed: its last save and export completed first")
        return last_eval
