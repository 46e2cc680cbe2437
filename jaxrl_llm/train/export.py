"""A policy as a Hugging Face folder: config.json, model.safetensors, the tokenizer files and
generation_config.json (bos / eos / pad ids: generation stops where our sampler stops), loadable by
`transformers.AutoModelForCausalLM.from_pretrained` and by `jaxrl-llm eval --model`.

    jaxrl-llm export --config X [--step N | --step sft-N] --out DIR [--dtype bfloat16|float32|float16]

exports any checkpoint of a run (train/restore.py reads its parameters only; default: the newest) in
bfloat16 unless told otherwise; `--out` must not exist yet or be empty, and must lie outside the run's folder.
The end of training (train.export_final) writes `<out_dir>/final` with the same function, in the run's
parameter dtype.

A LoRA run (model.lora.rank > 0) exports the merged model (W + alpha / rank A B) the same way; `--adapter` writes
the adapter alone in PEFT's format instead (adapter_config.json + adapter_model.safetensors, which
`peft.PeftModel.from_pretrained` loads onto the transformers base), and the end of training writes it to
`<out_dir>/final_adapter` beside `final`.
"""

from __future__ import annotations

from pathlib import Path

from flax import nnx

from jaxrl_llm.config import Config
from jaxrl_llm.model import lora
from jaxrl_llm.model.hf_io import export_hf_folder
from jaxrl_llm.model.tokenizer import pad_id, stop_ids
from jaxrl_llm.model.transformer import Transformer
from jaxrl_llm.train.cli_options import DTYPES
from jaxrl_llm.train.restore import load_checkpoint, refuse_inside_run
from jaxrl_llm.utils.atomic import atomic_folder

def export_policy(model: Transformer, folder: Path, tokenizer, dtype: str | None = None) -> Path:
    """Write the HF folder of `model` (its parameter dtype unless `dtype`) with `tokenizer`'s files."""
    from transformers import GenerationConfig

    export_hf_folder(model, folder, tokenizer=tokenizer, dtype=dtype)
    cfg = model.cfg
    stops = list(stop_ids(tokenizer, cfg.eos_token_ids))
    GenerationConfig(bos_token_id=cfg.bos_token_id if cfg.bos_token_id is not None else tokenizer.bos_token_id,
                     eos_token_id=stops[0] if len(stops) == 1 else stops,
                     pad_token_id=pad_id(tokenizer)).save_pretrained(str(folder))
    return Path(folder)


def export_adapter(model: Transformer, folder: Path, base_model: str) -> Path:
    """The LoRA adapter of `model` alone, in PEFT's format (model/lora.py save_peft_adapter)."""
    return lora.save_peft_adapter(model, folder, base_model=base_model)


def export_checkpoint(cfg: Config, mesh, out: Path, step: str | None = None, dtype: str = "bfloat16",
                      log=print, adapter: bool = False) -> Path:
    """`jaxrl-llm export`: checkpoint `step` of the run (the newest when None) to the HF folder `out` (the PEFT
    adapter folder with `adapter`)."""
    if adapter and not cfg.model.lora.rank:
        raise ValueError("--adapter exports a LoRA adapter, but this run trains every weight (model.lora.rank is 0)")
    if dtype not in DTYPES:
        raise ValueError(f"--dtype {dtype!r}: expected one of {', '.join(DTYPES)}")
    out = Path(out)
    refuse_inside_run(out, cfg, "--out")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"--out {out} already exists and is not an empty folder; remove it or pick another")
    loaded = load_checkpoint(cfg, mesh, step, log=log)
    model = nnx.merge(loaded.policy.graphdef, loaded.params)
    if adapter:
        with atomic_folder(out) as folder:
            export_adapter(model, folder, cfg.model.name)
        log(f"exported the LoRA adapter of {loaded.source} (RL step {loaded.step}) in PEFT's format to {out}")
        return out
    with atomic_folder(out) as folder:  # whole or not at all (utils/atomic.py)
        export_policy(model, folder, loaded.policy.tokenizer, dtype)
    log(f"exported {loaded.source} (RL step {loaded.step}) in {dtype}" + (" with its LoRA adapter merged" if
        cfg.model.lora.rank else "") + f" to {out}")
    return out


def command(args, log=print) -> Path:
    from jaxrl_llm.config import load_config
    from jaxrl_llm.parallel.mesh import make_mesh

    cfg = load_config(args.config, list(args.overrides))
    mesh = make_mesh({"data": cfg.mesh.data, "fsdp": cfg.mesh.fsdp, "tensor": cfg.mesh.tensor})
    return export_checkpoint(cfg, mesh, Path(args.out), args.step, args.dtype, log=log, adapter=args.adapter)
