"""A policy as a Hugging Face folder: config.json, model.safetensors, the tokenizer files and
generation_config.json (bos / eos / pad ids: generation stops where our sampler stops), loadable by
`transformers.AutoModelForCausalLM.from_pretrained` and by `jaxrl-llm eval --model`.

    jaxrl-llm export --config X [--step N | --step sft-N] --out DIR [--dtype bfloat16|float32|float16]

exports any checkpoint of a run (train/restore.py reads its parameters only; default: the newest) in
bfloat16 unless told otherwise; `--out` must not exist yet or be empty, and must lie outside the run's folder.
The end of training (train.export_final) writes `<out_dir>/final` with the same function, in the run's
parameter dtype.
"""

from __future__ import annotations

from pathlib import Path

from flax import nnx

from jaxrl_llm.config import Config
from jaxrl_llm.model.hf_io import export_hf_folder
from jaxrl_llm.model.tokenizer import pad_id, stop_ids
from jaxrl_llm.model.transformer import Transformer
from jaxrl_llm.train.cli_options import DTYPES
from jaxrl_llm.train.restore import load_checkpoint, refuse_inside_run

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


def export_checkpoint(cfg: Config, mesh, out: Path, step: str | None = None, dtype: str = "bfloat16",
                      log=print) -> Path:
    """`jaxrl-llm export`: checkpoint `step` of the run (the newest when None) to the HF folder `out`."""
    if dtype not in DTYPES:
        raise ValueError(f"--dtype {dtype!r}: expected one of {', '.join(DTYPES)}")
    out = Path(out)
    refuse_inside_run(out, cfg, "--out")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"--out {out} already exists and is not an empty folder; remove it or pick another")
    loaded = load_checkpoint(cfg, mesh, step, log=log)
    export_policy(nnx.merge(loaded.policy.graphdef, loaded.params), out, loaded.policy.tokenizer, dtype)
    log(f"exported {loaded.source} (RL step {loaded.step}) in {dtype} to {out}")
    return out


def command(args, log=print) -> Path:
    from jaxrl_llm.config import load_config
    from jaxrl_llm.parallel.mesh import make_mesh

    cfg = load_config(args.config, list(args.overrides))
    mesh = make_mesh({"data": cfg.mesh.data, "fsdp": cfg.mesh.fsdp, "tensor": cfg.mesh.tensor})
    return export_checkpoint(cfg, mesh, Path(args.out), args.step, args.dtype, log=log)
