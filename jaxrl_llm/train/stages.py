"""The stages of a run, in order: evaluation before SFT, SFT steps, the start of RL (KL reference, a fresh
optimizer state) and the step-0 evaluation, RL steps. A checkpoint marks how far a run got, so a resumed
run redoes nothing it finished. Each stage returns early (the caller checkpoints) when a stop is agreed."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from tqdm import tqdm

from jaxrl_llm.model import lora
from jaxrl_llm.rl.spec import loss_coefs, sft_spec
from jaxrl_llm.rl.update import abstract_optimizer_state, init_optimizer, make_update
from jaxrl_llm.train import outcomes as held_out_outcomes
from jaxrl_llm.train import start_cache
from jaxrl_llm.train.evaluate import evaluate
from jaxrl_llm.train.metrics import replace_text
from jaxrl_llm.train.sft import sft_batch
from jaxrl_llm.train.state import PHASE_EVAL, PHASE_SFT
from jaxrl_llm.train.step import rl_step


def write(run, writer, step: int, metrics: dict, kind: str = "train") -> None:
    """A metrics row, and the count of rows written in the train state (a resume keeps exactly those)."""
    writer.write(step, metrics, kind=kind)
    run.state.metrics_rows = writer.rows


def eval_items(run) -> list:
    """What the evaluation samples (eval.split: the held-out items, or the first training items)."""
    cfg = run.cfg
    return run.eval_items if cfg.eval.split == "heldout" else run.train_items[:cfg.eval.size]


def held_out(run, pool, outcomes: dict | None = None) -> dict:
    """The evaluation's figures for the current policy (and each problem's outcomes into `outcomes`)."""
    return evaluate(run.sampler, run.sampling_params(), pool, run.tok, run.cfg, eval_items(run),
                    run.key(PHASE_EVAL, run.state.step), run.judge, outcomes)


def eval_stage(run, writer, pool, kind: str, label: str) -> dict:
    outcomes: dict = {}
    result = held_out(run, pool, outcomes)
    write(run, writer, run.state.sft_step if kind == "eval_before_sft" else run.state.step, result, kind)
    if kind == "eval" and outcomes and jax.process_index() == 0:  # RL-stage evaluations: held_out/step<N>.jsonl
        held_out_outcomes.write(run.cfg.train.out_dir, run.state.step, eval_items(run), outcomes)
    run.log(f"{label} held-out: {fmt(result)}")
    return result


def start_eval(run, writer, pool) -> dict:
    """The step-0 evaluation; with eval.start_cache, taken from a run that started from the same weights with the
    same evaluation when one is kept there, else made and kept (train/start_cache.py)."""
    cache, step0 = run.cfg.eval.start_cache, held_out_outcomes.path(run.cfg.train.out_dir, 0)
    if not cache or jax.process_count() > 1:
        return eval_stage(run, writer, pool, "eval", "step 0")
    digest = start_cache.params_digest(run.state.params)
    entry = start_cache.load(cache, run.folder.record, digest, run.log)
    if entry is None:
        result = eval_stage(run, writer, pool, "eval", "step 0")
        try:
            kept = start_cache.store(cache, run.folder.record, digest, result,
                                     step0.read_text() if step0.is_file() else "", run.cfg.train.out_dir)
            run.log(f"step 0: evaluation kept for runs that start like this one ({kept})")
        except OSError as e:  # a cache that cannot be written costs later runs an evaluation, not this run
            run.log(f"step 0: the evaluation could not be kept in {cache} ({type(e).__name__}: {e})")
        return result
    result = {**entry["row"], "start_reused": 1}
    write(run, writer, 0, result, "eval")
    if entry["outcomes"]:
        step0.parent.mkdir(parents=True, exist_ok=True)
        replace_text(step0, entry["outcomes"])
    run.log(f"step 0 held-out (taken from {entry['source']}: same weights, same evaluation): {fmt(result)}")
    return result


def sft(run, writer, stop) -> None:
    """SFT steps from the current one on; returns early (the caller checkpoints) when a stop is asked."""
    cfg, st = run.cfg, run.state
    if run.sft_update is None:
        run.sft_update = make_update(run.policy.graphdef, sft_spec(cfg), run.sft_opt, st.params,
                                     abstract_optimizer_state(run.sft_opt, st.params, run.mesh), run.mesh)
    rows, eos = cfg.sft.batch_size, run.tok.eos_token_id
    bar = tqdm(total=cfg.sft.steps, initial=st.sft_step, desc="sft", disable=jax.process_index() != 0)
    while st.sft_step < cfg.sft.steps and not stop.sync():
        s = st.sft_step + 1
        rng = np.random.default_rng((st.seed, PHASE_SFT, s))  # step s draws the same rows after a resume
        pairs = [run.sft_items[i] for i in rng.choice(len(run.sft_items), rows, replace=False)]
        coefs = {**loss_coefs(cfg), "dropout_key": rng.integers(0, 2 ** 32, 2, dtype=np.uint32)}  # LoRA dropout's
        st.params, st.opt_state, m = run.sft_update(
            st.params, st.opt_state, sft_batch(run.tok, cfg, pairs, run.sampler.pad_id, eos), coefs)
        st.sft_step = s
        bar.update(1)
        if s % 10 == 0 or s == cfg.sft.steps:
            write(run, writer, s, {"nll": float(m["nll"]), "grad_norm": float(m["grad_norm"])}, kind="sft")
    bar.close()


def start_rl(run) -> None:
    """SFT (if any) is done: fix the KL reference, give the RL optimizer a fresh state."""
    st = run.state
    # with LoRA the reference is the same frozen base with the adapters of this moment: no second copy of the base
    st.ref_params = jax.tree.map(jnp.copy, lora.trainable(st.params)) if run.cfg.algo.kl_coef > 0 else None
    # the state holds SFT's optimizer whenever SFT ran or a run resumed mid-SFT, even if sft.steps is now 0 (a
    # key that may change on resume): its moments, step count and hyperparameters must not carry into RL
    if st.stage == "sft" or run.cfg.sft.steps > 0:
        st.opt_state = init_optimizer(run.optimizer, st.params, run.mesh)
    st.stage = "rl"


def before_rl(run, writer, pool, stop) -> tuple[dict, str]:
    """The stages up to RL step 1 that this run has not done: (the step-0 evaluation, what was saved)."""
    cfg, st = run.cfg, run.state
    last_eval, saved = {}, ""
    if st.stage == "start" and cfg.sft.steps > 0:
        eval_stage(run, writer, pool, "eval_before_sft", "before SFT")
        st.stage = "sft"
    if st.stage in ("start", "sft") and not stop.sync():
        if cfg.sft.steps > 0:
            sft(run, writer, stop)
        if not stop.sync():
            start_rl(run)
            last_eval = start_eval(run, writer, pool)
            saved = run.save(wait=stop.agreed)  # SFT and the step-0 evaluation are not redone
    return last_eval, saved


def rl(run, writer, pool, stop, last_eval: dict, saved: str) -> tuple[dict, str]:
    """RL steps up to train.steps, evaluating every eval.every and checkpointing every train.checkpoint_every
    steps (and at the end, and when a stop is agreed)."""
    cfg, st = run.cfg, run.state
    bar = tqdm(total=cfg.train.steps, initial=st.step, desc="train", disable=jax.process_index() != 0)
    # one agreement per step, read by both the save and the loop: a stop asked between two agreements would
    # otherwise end the loop on a step that no save saw (the work since the last checkpoint lost)
    stopping = stop.sync()
    while st.stage == "rl" and st.step < cfg.train.steps and not stopping:
        st.step += 1
        m = rl_step(run, pool, writer)
        write(run, writer, st.step, m)
        bar.set_postfix(reward=f"{m['reward_mean']:.3f}", acc=f"{m['accuracy']:.2f}", H=f"{m['entropy']:.2f}",
                        T=f"{m['temperature']:.2f}", tok_s=f"{m['sample_tokens_per_s']:.0f}")
        bar.update(1)
        if st.step % cfg.eval.every == 0 or st.step == cfg.train.steps:
            last_eval = eval_stage(run, writer, pool, "eval", f"step {st.step}")
        stopping = stop.sync()  # every process, every step: the collective runs in step with the others
        if st.step % cfg.train.checkpoint_every == 0 or st.step == cfg.train.steps or stopping:
            saved = run.save(wait=stop.agreed)
    bar.close()
    return last_eval, saved


def fmt(m: dict) -> str:
    return ", ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in m.items())
