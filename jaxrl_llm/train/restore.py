"""The policy `jaxrl-llm eval` and `jaxrl-llm export` read, without building a run: no optimizer state, no
lock, and nothing written into the run's folder.

- A run's checkpoint (`--config`, `--step`): a checkpoint holds the whole train state (train/state.py:
  parameters, optimizer state, KL reference, explorer state); only its `params` subtree is read (an orbax
  partial restore), straight into its sharded layout on the mesh. `--step N` is RL step N
  (`checkpoints/N`), `--step sft-N` SFT step N (`sft_checkpoints/N`); without it the newest intact
  checkpoint (RL, else SFT), skipping damaged ones (named, left in place), as a resume would; a run with
  no checkpoint at all gives the config's initial policy (its model folder, or the scratch model at
  train.seed), as `jaxrl-llm eval` always has. A checkpoint of another model shape is refused.
- A model (`--model`): a local HF folder, a known short name, or anything `prepare-model` prepared (a GGUF
  file, a Hub id), loaded as it is.

Output folders are checked here too: eval and export never write inside the run's folder.
"""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path

import jax
import orbax.checkpoint as ocp
from flax import nnx

from jaxrl_llm.config import Config
from jaxrl_llm.model import lora
from jaxrl_llm.model.config import ModelConfig
from jaxrl_llm.model.hf_io import load_hf_folder
from jaxrl_llm.model.registry import resolve
from jaxrl_llm.model.tokenizer import load_tokenizer
from jaxrl_llm.model.transformer import abstract_model
from jaxrl_llm.parallel.rules import sharding_tree
from jaxrl_llm.train.checkpoint import (CheckpointDamagedError, CheckpointMismatchError, CheckpointReadError,
                                        Checkpointer, is_damage)
from jaxrl_llm.train.policy import Policy, build_policy
from jaxrl_llm.train.run_dir import RunFolder


@dataclasses.dataclass(frozen=True)
class Loaded:
    """A policy and its parameters, with where they came from."""

    policy: Policy
    params: nnx.State
    name: str  # names the default output folder: <run>-step<N>, <run>-sft<N>, <run>-initial, <model folder>
    step: int  # the RL step of the train state (0 for a model folder, an SFT checkpoint, the initial policy)
    seed: int  # the run's key root: evaluation keys derive from it as in training
    source: str  # the checkpoint or folder, in words


def parse_step(text: str | None) -> tuple[str, int] | None:
    """`--step`: "N" (RL step N) or "sft-N"; None for the newest checkpoint."""
    if text is None:
        return None
    kind, _, number = text.rpartition("-") if text.startswith("sft-") else ("rl", "", text)
    if not number.isdigit():
        raise ValueError(f"--step {text!r}: expected an RL step number (e.g. 4) or sft-<step> (e.g. sft-20)")
    return kind, int(number)


def refuse_inside_run(out: Path, cfg: Config, what: str) -> None:
    """Eval and export read a run, never write into it (a live trainer may be writing there)."""
    run, target = Path(cfg.train.out_dir).resolve(), Path(out).resolve()
    if target == run or run in target.parents:
        raise ValueError(f"{what} {out} is inside the run folder {cfg.train.out_dir}; `jaxrl-llm eval` and `export` "
                         f"never write into a training run: pick a folder outside it")


def _abstract(tree):
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree)


def skeleton(cfg: Config, mesh) -> tuple[Policy, nnx.State]:
    """The policy of `cfg` with abstract parameters (shape, dtype, sharding; no memory): what a checkpoint of
    that run restores into. The scratch model is built as train/policy.py builds it."""
    if cfg.model.name == "scratch":
        from jaxrl_llm.model.char_tokenizer import char_tokenizer

        tok = char_tokenizer()
        model_cfg = ModelConfig(**{"vocab_size": len(tok), **cfg.model.scratch,
                                   "param_dtype": cfg.model.param_dtype, "eos_token_ids": (tok.eos_token_id,)})
    else:
        folder = resolve(cfg.model.name)
        model_cfg = ModelConfig.from_hf_folder(folder, param_dtype=cfg.model.param_dtype)
        tok = load_tokenizer(folder, cfg.data.chat_template_override)
    graphdef, abstract = nnx.split(abstract_model(model_cfg))
    like = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), abstract,
                        sharding_tree(abstract, mesh))
    return Policy(graphdef, model_cfg, tok), like


def _restore_params(ckpt: Checkpointer, step: int, policy: Policy, like: nnx.State) -> tuple[nnx.State, dict]:
    """(params, registry) of checkpoint `step`; CheckpointDamagedError when its files are damaged."""
    where = f"{ckpt.directory}/{step}"
    try:
        registry = ckpt.manager.restore(step, args=ocp.args.Composite(registry=ocp.args.JsonRestore()))["registry"]
    except Exception as e:  # noqa: BLE001 - sorted into damage or a read error
        raise (CheckpointDamagedError if is_damage(e) else CheckpointReadError)(
            f"{where}: registry unreadable ({type(e).__name__}: {str(e).strip()[:300]})") from None
    if registry.get("model_signature") != policy.signature():
        raise CheckpointMismatchError(f"{where}: written for model {registry.get('model_signature')}, but the config "
                                      f"describes {policy.signature()}; evaluate it with the run's own config")
    saved = registry.get("array_shapes") or {}
    differ = [f"{k} {saved[k]} -> {list(x.shape)}" for k, x in
              ((jax.tree_util.keystr(p), x) for p, x in jax.tree_util.tree_leaves_with_path({"params": like}))
              if k in saved and saved[k] != list(x.shape)]
    if differ:
        raise CheckpointMismatchError(f"{where}: parameters of other shapes than the config's "
                                      f"({'; '.join(differ[:4])})")
    item = {"params": like}
    try:
        arrays = ckpt.manager.restore(step, args=ocp.args.Composite(arrays=ocp.args.PyTreeRestore(
            item, restore_args=ocp.checkpoint_utils.construct_restore_args(item), partial_restore=True)))["arrays"]
    except Exception as e:  # noqa: BLE001
        raise (CheckpointDamagedError if is_damage(e) else CheckpointReadError)(
            f"{where}: parameters unreadable ({type(e).__name__}: {str(e).strip().splitlines()[0][:300]})") from None
    return arrays["params"], registry


def load_checkpoint(cfg: Config, mesh, step: str | None = None, log=print) -> Loaded:
    """The run's policy at `step` (see the module docstring), parameters only."""
    wanted = parse_step(step)
    out_dir = Path(cfg.train.out_dir)
    if cfg.model.lora.rank:  # checkpoints hold the adapters alone: the base is the model the run was built from
        with tempfile.TemporaryDirectory(prefix="jaxrl-llm-eval-") as scratch:
            policy, fresh = build_policy(cfg, mesh, Path(scratch))
        base, like = lora.frozen(fresh), _abstract(lora.trainable(fresh))
    else:
        (policy, like), base, fresh = skeleton(cfg, mesh), None, None
    folders = {"rl": out_dir / "checkpoints", "sft": out_dir / "sft_checkpoints"}
    ckpts = {kind: Checkpointer(d, log=log, read_only=True) for kind, d in folders.items() if d.is_dir()}
    available = {kind: sorted(c.manager.all_steps()) for kind, c in ckpts.items()}
    if wanted is not None:
        kind, number = wanted
        if number not in available.get(kind, []):
            raise FileNotFoundError(f"{folders[kind]}/{number}: no such checkpoint (RL steps: "
                                    f"{available.get('rl') or 'none'}; SFT steps: {available.get('sft') or 'none'})")
        order = [(kind, number)]
    else:
        order = [(kind, s) for kind in ("rl", "sft") for s in reversed(available.get(kind, []))]
    damaged = []
    for kind, number in order:
        try:
            params, registry = _restore_params(ckpts[kind], number, policy, like)
        except CheckpointDamagedError as e:
            if wanted is not None:
                raise
            damaged.append(f"{folders[kind]}/{number}")
            log(f"checkpoint {folders[kind]}/{number} is damaged: {e}; left in place (read-only), trying an older one")
            continue
        where = f"{folders[kind]}/{number}"
        RunFolder(cfg, log, read_only=True).resumed(registry, where, registry.get("step", 0))
        name = f"{out_dir.name}-step{number}" if kind == "rl" else f"{out_dir.name}-sft{number}"
        return Loaded(policy, lora.combine(params, base), name, int(registry.get("step", 0)),
                      int(registry.get("seed", cfg.train.seed)), where)
    if damaged:
        raise CheckpointDamagedError(f"{out_dir}: no intact checkpoint (damaged: {', '.join(damaged)}, left in place)")
    log(f"{out_dir} holds no checkpoint: evaluating the config's initial policy (model.name={cfg.model.name})")
    if fresh is None:  # (a LoRA run's initial policy is built above already)
        with tempfile.TemporaryDirectory(prefix="jaxrl-llm-eval-") as scratch:  # the scratch tokenizer's files
            policy, fresh = build_policy(cfg, mesh, Path(scratch))
    return Loaded(policy, fresh, f"{out_dir.name}-initial", 0, cfg.train.seed, f"the initial {cfg.model.name} policy")


def load_model(name: str, cfg: Config, mesh) -> Loaded:
    """A model folder or anything `resolve` knows, in the config's param dtype."""
    folder = resolve(name)
    model, model_cfg = load_hf_folder(folder, mesh=mesh, param_dtype=cfg.model.param_dtype)
    graphdef, params = nnx.split(model)
    tok = load_tokenizer(folder, cfg.data.chat_template_override)
    return Loaded(Policy(graphdef, model_cfg, tok), params, folder.name, 0, cfg.train.seed,
                  str(folder))
