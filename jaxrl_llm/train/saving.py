"""The train state in checkpoints: what a checkpoint of a stage holds, saving it, and resuming from the
newest intact one (RL's `checkpoints/`, else SFT's `sft_checkpoints/`)."""

from __future__ import annotations

import jax

from jaxrl_llm.model import lora
from jaxrl_llm.train.run_dir import holding_folder


def arrays_like(run, registry: dict) -> dict:
    """The array fields a checkpoint of `registry`'s stage holds for this run (structure and layout)."""
    st = run.state
    # SFT's and RL's optimizers share a structure; with LoRA, parameters and reference are the adapters alone
    like = {"params": lora.trainable(st.params), "opt_state": st.opt_state}
    if registry.get("stage") == "rl" and run.cfg.algo.kl_coef > 0:
        like["ref_params"] = lora.trainable(st.params)
    if jax.tree.leaves(st.explore):
        like["explore"] = st.explore
    return like


def save(run, wait: bool = False) -> str:
    """Checkpoint the train state; returns what was saved, in words."""
    st = run.state
    st.data = run.data.get_state()
    if run.pool is not None:
        st.counts = run.counts(run.pool)
    arrays, registry = st.split()
    registry["model_signature"], registry["config"] = run.policy.signature(), run.folder.record
    ckpt, step = (run.ckpt, st.step) if st.stage == "rl" else (run.sft_ckpt, st.sft_step)
    what = f"RL step {st.step}" if st.stage == "rl" else \
        f"SFT step {st.sft_step}/{run.cfg.sft.steps} (policy and SFT optimizer state)"
    if not ckpt.save(step, arrays, registry, wait=wait):  # the checkpoint this state was resumed from
        return f"{what}: already in {ckpt.directory}/{step}, kept as it was"
    return f"{what} to {ckpt.directory}/{step}"


@holding_folder  # a damaged checkpoint may be moved aside: only by the folder's one writer
def try_resume(run) -> bool:
    """Put the newest intact checkpoint's state into `run`; False when there is none (or train.resume is off)."""
    if not run.cfg.train.resume:
        return False
    like = lambda registry: arrays_like(run, registry)  # noqa: E731
    sig, check = run.policy.signature(), run.folder.check
    found = run.ckpt.restore_latest(like, sig, log=run.log, check=check)
    if found is None:
        found = run.sft_ckpt.restore_latest(like, sig, log=run.log, check=check)
        if found is None:
            return False
    where, arrays, reg = found
    run.state = st = run.state.joined(arrays, reg)
    run.data.set_state(st.data)
    run.counts_base = dict(st.counts)
    if st.seed != run.cfg.train.seed:  # the key root must stay that of the checkpointed run
        run.log(f"train.seed={run.cfg.train.seed} ignored: resuming the run seeded {st.seed}")
    run.root = st.root()
    path = f"{(run.ckpt if st.stage == 'rl' else run.sft_ckpt).directory}/{where}"
    run.log(f"resumed from {path} ("
            + (f"RL step {st.step}" if st.stage == "rl" else f"SFT step {st.sft_step}/{run.cfg.sft.steps}") + ")")
    run.folder.resumed(reg, path, st.step)
    return True
