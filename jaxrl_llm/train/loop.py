"""The training run: the only place that knows the order of a step's phases.

    prompts -> rollouts (sampler) -> rewards (process pool) -> advantages -> update(s) -> metrics
    every eval.every steps: held-out evaluation; every train.checkpoint_every: checkpoint

Random keys derive from fold_in(root, phase, step), the data iterator's state is checkpointed, so
a resumed run draws the same prompts and samples as an uninterrupted one.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import yaml
from flax import nnx
from tqdm import tqdm

from jaxrl_llm.config import Config
from jaxrl_llm.data.pipeline import prompt_batches
from jaxrl_llm.data.tasks import load_splits
from jaxrl_llm.model.hf_io import export_hf_folder
from jaxrl_llm.model.tokenizer import pad_id, stop_ids
from jaxrl_llm.parallel.mesh import make_mesh
from jaxrl_llm.rewards.pool import RewardPool
from jaxrl_llm.rl.update import UpdateSpec, init_optimizer, make_optimizer, make_update
from jaxrl_llm.sampling.sampler import Sampler
from jaxrl_llm.train.checkpoint import Checkpointer
from jaxrl_llm.train.evaluate import evaluate
from jaxrl_llm.train.metrics import MetricsWriter
from jaxrl_llm.train.policy import build_policy, encode_items
from jaxrl_llm.train.rollout import collect, update_batch
from jaxrl_llm.train.sft import sft_batch
from jaxrl_llm.utils import compile_counter

PHASE_ROLLOUT, PHASE_EVAL, PHASE_SFT, PHASE_MINIBATCH = 1, 2, 3, 4


class _StopFlag:
    """SIGTERM / SIGINT ask the loop to checkpoint after the current step and exit cleanly."""

    def __init__(self):
        self.requested = False
        self._old = {}

    def __enter__(self):
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame):
        self.requested = True

    def __exit__(self, *exc):
        for sig, old in self._old.items():
            signal.signal(sig, old)


def _coefs(cfg: Config) -> dict:
    a = cfg.algo
    return {"eps_low": a.eps_low, "eps_high": a.eps_high, "dual_clip": a.dual_clip, "kl_coef": a.kl_coef,
            "norm_len": float(cfg.rollout.max_new_tokens)}


class Run:
    """Everything a run holds; `train()` drives it. Built once, then only its arrays change."""

    def __init__(self, cfg: Config, log=print):
        self.cfg, self.log = cfg, log
        self.out_dir = Path(cfg.train.out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        (self.out_dir / "config.yaml").write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
        self.mesh = make_mesh({"data": cfg.mesh.data, "fsdp": cfg.mesh.fsdp, "tensor": cfg.mesh.tensor})
        self.policy = build_policy(cfg, self.mesh, self.out_dir)
        tok = self.tok = self.policy.tokenizer
        train_items, eval_items = load_splits(cfg.data)
        self.train_items, dropped = encode_items(tok, cfg, train_items)
        eval_items, eval_dropped = encode_items(tok, cfg, eval_items)
        self.eval_items = eval_items[:cfg.eval.size]
        self.dropped_prompts = dropped + eval_dropped
        if not self.train_items:
            raise ValueError("no training prompts left (all dropped as longer than data.max_prompt_len?)")
        self.sampler = Sampler(self.policy.graphdef, pad_id=pad_id(tok),
                               stop_ids=stop_ids(tok, self.policy.model_cfg.eos_token_ids), mesh=self.mesh)
        self.rows = cfg.rollout.prompts_per_step * cfg.rollout.group_size
        o = cfg.optim
        self.optimizer = make_optimizer(o.lr, warmup_steps=o.warmup_steps, schedule=o.schedule,
                                        total_steps=cfg.train.steps * cfg.algo.ppo_epochs * cfg.algo.minibatches,
                                        weight_decay=o.weight_decay, b1=o.b1, b2=o.b2, max_grad_norm=o.max_grad_norm)
        self.params = self.policy.params
        self.opt_state = init_optimizer(self.optimizer, self.params, self.mesh)
        mb_rows = self.rows // cfg.algo.minibatches
        self.ref_params = jax.tree.map(jnp.copy, self.params) if cfg.algo.kl_coef > 0 else None
        spec = UpdateSpec(mode="rl", loss_agg=cfg.algo.loss_agg, kl_estimator=cfg.algo.kl_estimator,
                          use_kl=cfg.algo.kl_coef > 0, micro_batches=max(1, mb_rows // cfg.algo.micro_batch),
                          compute_dtype=cfg.model.compute_dtype)
        self.update = make_update(self.policy.graphdef, spec, self.optimizer, self.params, self.opt_state,
                                  self.mesh, mb_rows, self.ref_params)
        self.data = prompt_batches(len(self.train_items), cfg.rollout.prompts_per_step, cfg.data.seed)
        self.root = jax.random.key(cfg.train.seed)
        self.ckpt = Checkpointer(self.out_dir / "checkpoints", keep=cfg.train.keep_checkpoints,
                                 async_save=cfg.train.async_checkpoint)
        self.step = 0
        self.sft_done = cfg.sft.steps == 0

    # -- state that checkpoints carry -------------------------------------------------------------
    def registry(self) -> dict:
        return {"model_signature": self.policy.signature(), "step": self.step, "data": self.data.get_state(),
                "sft_done": self.sft_done, "seed": self.cfg.train.seed}

    def save(self, wait: bool = False) -> None:
        self.ckpt.save(self.step, {"params": self.params, "opt_state": self.opt_state}, self.registry(), wait=wait)

    def try_resume(self) -> bool:
        if not self.cfg.train.resume or self.ckpt.latest_step() is None:
            return False
        arrays, reg = self.ckpt.restore({"params": self.params, "opt_state": self.opt_state},
                                        self.policy.signature())
        self.params, self.opt_state = arrays["params"], arrays["opt_state"]
        self.step, self.sft_done = reg["step"], reg["sft_done"]
        self.data.set_state(reg["data"])
        if reg["seed"] != self.cfg.train.seed:  # the key root must stay that of the checkpointed run
            self.log(f"train.seed={self.cfg.train.seed} ignored: resuming the run seeded {reg['seed']}")
            self.root = jax.random.key(reg["seed"])
        self.log(f"resumed from {self.ckpt.directory}/{self.step}")
        return True

    def key(self, phase: int, step: int) -> jax.Array:
        return jax.random.fold_in(jax.random.fold_in(self.root, phase), step)

    # -- phases -----------------------------------------------------------------------------------
    def run_sft(self, writer: MetricsWriter) -> None:
        cfg = self.cfg
        opt = make_optimizer(cfg.sft.lr, max_grad_norm=cfg.optim.max_grad_norm)
        opt_state = init_optimizer(opt, self.params, self.mesh)
        rows = cfg.sft.batch_size
        spec = UpdateSpec(mode="sft", micro_batches=max(1, rows // cfg.algo.micro_batch),
                          compute_dtype=cfg.model.compute_dtype)
        update = make_update(self.policy.graphdef, spec, opt, self.params, opt_state, self.mesh, rows)
        rng = np.random.default_rng(int(jax.random.randint(self.key(PHASE_SFT, 0), (), 0, 2**31 - 1)))
        eos = self.tok.eos_token_id
        for s in tqdm(range(1, cfg.sft.steps + 1), desc="sft", disable=jax.process_index() != 0):
            pairs = [self.train_items[i] for i in rng.choice(len(self.train_items), rows, replace=False)]
            self.params, opt_state, m = update(self.params, opt_state,
                                               sft_batch(self.tok, cfg, pairs, self.sampler.pad_id, eos), _coefs(cfg))
            if s % 10 == 0 or s == cfg.sft.steps:
                writer.write(s, {"nll": float(m["nll"]), "grad_norm": float(m["grad_norm"])}, kind="sft")
        self.sft_done = True

    def rl_step(self, pool: RewardPool) -> dict:
        cfg = self.cfg
        t0 = time.perf_counter()
        batch = [self.train_items[i] for i in next(self.data)]
        rollouts, metrics = collect(self.sampler, self.params, pool, self.tok, cfg, batch,
                                    self.key(PHASE_ROLLOUT, self.step))
        t1 = time.perf_counter()
        full = update_batch(rollouts)
        mb_rows = self.rows // cfg.algo.minibatches
        ups = []
        for epoch in range(cfg.algo.ppo_epochs):
            order = np.arange(self.rows) if cfg.algo.minibatches == 1 else np.asarray(
                jax.random.permutation(jax.random.fold_in(self.key(PHASE_MINIBATCH, self.step), epoch), self.rows))
            for m in range(cfg.algo.minibatches):
                idx = order[m * mb_rows:(m + 1) * mb_rows]
                self.params, self.opt_state, um = self.update(self.params, self.opt_state,
                                                              {k: v[idx] for k, v in full.items()}, _coefs(cfg))
                ups.append(um)
        ups = jax.device_get(ups)
        t2 = time.perf_counter()
        first = ups[0]
        metrics.update({
            "loss": float(np.mean([u["loss"] for u in ups])),
            "grad_norm": float(np.mean([u["grad_norm"] for u in ups])),
            "lr": float(ups[-1]["lr"]), "clip_low": float(np.mean([u["clip_low"] for u in ups])),
            "clip_high": float(np.mean([u["clip_high"] for u in ups])),
            "dual_clip": float(np.mean([u["dual_clip"] for u in ups])), "kl": float(np.mean([u["kl"] for u in ups])),
            "logp_gap_sampler_trainer": float(first["logp_gap"]),  # first update: same weights as the sampler
            "skipped_nonfinite": int(sum(u["skipped_nonfinite"] for u in ups)),
            "update_tokens_per_s": float(sum(u["update_tokens"] for u in ups) / max(t2 - t1, 1e-9)),
            # every position of every row goes through forward and backward, loss-bearing or not
            "update_positions_per_s": float(len(ups) * mb_rows * (full["tokens"].shape[1] - 1)
                                            / max(t2 - t1, 1e-9)),
            "time_update_s": t2 - t1, "time_step_s": t2 - t0,
            "time_other_s": (t2 - t0) - metrics["time_sample_s"] - metrics["time_reward_s"] - (t2 - t1),
            "compilations": compile_counter.compilations(), "reward_errors": pool.stats.errors,
            "reward_timeouts": pool.stats.timeouts, "dropped_prompts": self.dropped_prompts,
        })
        return metrics

    def evaluate(self, pool: RewardPool) -> dict:
        return evaluate(self.sampler, self.params, pool, self.tok, self.cfg, self.eval_items,
                        self.key(PHASE_EVAL, self.step))

    # -- the loop ---------------------------------------------------------------------------------
    def train(self) -> dict:
        cfg = self.cfg
        resumed = self.try_resume()
        writer = MetricsWriter(self.out_dir, tensorboard=cfg.train.tensorboard, resume_step=self.step)
        last_eval: dict = {}
        with RewardPool(cfg.reward.workers, cfg.reward.timeout_s) as pool, _StopFlag() as stop:
            if not resumed:
                if not self.sft_done:
                    writer.write(0, self.evaluate(pool), kind="eval_before_sft")
                    self.run_sft(writer)
                last_eval = self.evaluate(pool)
                writer.write(0, last_eval, kind="eval")
                self.log(f"step 0 held-out: {_fmt(last_eval)}")
            bar = tqdm(total=cfg.train.steps, initial=self.step, desc="train", disable=jax.process_index() != 0)
            while self.step < cfg.train.steps and not stop.requested:
                self.step += 1
                m = self.rl_step(pool)
                writer.write(self.step, m)
                bar.set_postfix(reward=f"{m['reward_mean']:.3f}", acc=f"{m['accuracy']:.2f}",
                                H=f"{m['entropy']:.2f}", T=f"{m['temperature']:.2f}",
                                tok_s=f"{m['sample_tokens_per_s']:.0f}")
                bar.update(1)
                if self.step % cfg.eval.every == 0 or self.step == cfg.train.steps:
                    last_eval = self.evaluate(pool)
                    writer.write(self.step, last_eval, kind="eval")
                    self.log(f"step {self.step} held-out: {_fmt(last_eval)}")
                if self.step % cfg.train.checkpoint_every == 0 or self.step == cfg.train.steps or stop.requested:
                    self.save(wait=stop.requested)
            bar.close()
        self.ckpt.close()
        writer.close()
        if stop.requested:
            self.log(f"stopped by signal after step {self.step}; checkpoint saved")
        elif cfg.train.export_final and jax.process_index() == 0:
            model = nnx.merge(self.policy.graphdef, self.params)
            export_hf_folder(model, self.out_dir / "final", tokenizer=self.tok)
            self.log(f"exported the final policy to {self.out_dir / 'final'}")
        return last_eval


def _fmt(m: dict) -> str:
    return ", ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in m.items())
