"""Device memory of the training update, as XLA's own analysis of the compiled program reports it.

Compiles (never runs) the RL update a run of the config would compile, with abstract inputs
(`jax.ShapeDtypeStruct`s for parameters, optimizer state and batch; nothing is allocated), and
prints `compiled.memory_analysis()`: argument, output, temporary, generated-code and aliased
(donated) bytes per device, and the peak they imply (arguments + temporaries + outputs - aliases).
Figures quoted in configs and the README come from here, not from hand arithmetic.

The batch is one minibatch of the trainer's rows at their largest (prompts of data.max_prompt_len
tokens, responses of rollout.max_new_tokens; a row is the sampler's buffer, `Sampler.shapes`), put
in the layout the trainer gives the update (plan/shapes.py, rl/spec.py minibatch), compiled through
the trainer's own update (plan/program.py). The figures are those of the backend the program is
compiled for: XLA:CPU on a machine without accelerators compiles the same program with another
buffer assignment and schedule than XLA:GPU or XLA:TPU (model.remat's savings show on all three: model/remat.py).

    jaxrl-llm bench memory --config configs/gpu_qwen2.5_0.5b.yaml --model-shape qwen2.5-0.5b
    jaxrl-llm bench memory --config configs/tpu_qwen2.5_1.5b.yaml --model-shape qwen2.5-1.5b --platform cpu
"""

from __future__ import annotations

import argparse
import json
import math

from jaxrl_llm.plan.program import MODEL_SHAPES, config_update, model_config

_GIB = 1024 ** 3


def _mesh(cfg, devices: int | None, platform: str | None):
    import jax
    import numpy as np

    from jaxrl_llm.parallel.mesh import make_mesh

    shape = {"data": cfg.mesh.data, "fsdp": cfg.mesh.fsdp, "tensor": cfg.mesh.tensor}
    n = devices or int(np.prod([max(s, 1) for s in shape.values()]))  # -1 (the remaining devices): one
    available = jax.devices(platform) if platform else jax.devices()
    if len(available) < n:
        raise ValueError(f"mesh {shape} needs {n} devices; {available[0].platform} has {len(available)} "
                         f"(compile for fake CPU devices with --platform cpu)")
    return make_mesh(shape, devices=available[:n])


def update_memory(cfg, model_cfg=None, *, devices: int | None = None, platform: str | None = None) -> dict:
    """XLA's memory analysis (bytes per device) of the compiled update program for `cfg` (plan/program.py), and
    the facts it depends on. `model_cfg` defaults to the config's model (its HF folder must be here). The
    optimizer state is laid out as the trainer lays it out (rl/update.py optimizer_shardings)."""
    import jax

    from jaxrl_llm.plan.shapes import config_shapes
    from jaxrl_llm.rl.batch import shapes
    from jaxrl_llm.rl.spec import rows_per_update, update_spec

    model_cfg = model_cfg or model_config(cfg)
    mesh = _mesh(cfg, devices, platform)
    _, params, _, a = config_update(cfg, model_cfg, mesh)
    m, spec, length = a.memory, update_spec(cfg), config_shapes(cfg, model_cfg).row_width
    n_params = sum(math.prod(x.shape) for x in jax.tree.leaves(params))
    out = {
        "argument_bytes": int(m.argument_size_in_bytes), "output_bytes": int(m.output_size_in_bytes),
        "temp_bytes": int(m.temp_size_in_bytes), "generated_code_bytes": int(m.generated_code_size_in_bytes),
        "alias_bytes": int(m.alias_size_in_bytes), "peak_bytes": a.peak,
    }
    xla_peak = getattr(m, "peak_memory_in_bytes", None)
    if xla_peak and mesh.devices.flat[0].platform != "cpu":  # XLA:CPU leaves it near the argument size
        out["xla_peak_bytes"] = int(xla_peak)
    out.update({
        "backend": mesh.devices.flat[0].platform, "devices": int(mesh.devices.size), "mesh": dict(mesh.shape),
        "parameters": n_params, "param_dtype": model_cfg.param_dtype, "compute_dtype": spec.compute_dtype,
        "remat": bool(cfg.model.remat), "layout": spec.layout, "rows_per_update": rows_per_update(cfg),
        "micro_batches": a.micro_batches, "rows_per_micro_batch": a.rows_per_micro_batch, "row_length": length,
        "batch_shapes": shapes(a.batch), "vocab": model_cfg.vocab_size,
        "use_kl": spec.use_kl,
        # what the configs' first comments counted: float32 logits of one micro-batch's whole rows (the rows
        # layout materialises them; the shared layout computes its logits in chunks)
        "logits_bytes_per_micro_batch": a.rows_per_micro_batch * (length - 1) * model_cfg.vocab_size * 4,
        "lower_s": round(a.lower_s, 2), "compile_s": round(a.compile_s, 2),
    })
    return out


def _gib(b: int) -> str:
    return f"{b / _GIB:.2f} GiB" if b >= _GIB / 10 else f"{b / 2 ** 20:.2f} MiB"


def report(r: dict) -> str:
    lines = [
        f"update program: {r['rows_per_update']} rows of up to {r['row_length']} tokens, {r['layout']} layout, "
        f"{r['micro_batches']} micro-batches of {r['rows_per_micro_batch']} rows; vocab {r['vocab']}; "
        f"{r['parameters'] / 1e6:.1f}M parameters in {r['param_dtype']}, compute {r['compute_dtype']}, "
        f"remat {r['remat']}, KL reference {r['use_kl']}",
        "batch: " + ", ".join(f"{k} {tuple(v)}" for k, v in r["batch_shapes"].items()),
        f"compiled for {r['devices']} {r['backend']} device(s), mesh {r['mesh']} (lower {r['lower_s']} s, "
        f"compile {r['compile_s']} s); XLA memory analysis per device:",
        f"  arguments       {_gib(r['argument_bytes'])}",
        f"  outputs         {_gib(r['output_bytes'])}",
        f"  temporaries     {_gib(r['temp_bytes'])}",
        f"  generated code  {_gib(r['generated_code_bytes'])}",
        f"  aliased         {_gib(r['alias_bytes'])}  (donated parameters and optimizer state)",
        f"  peak            {_gib(r['peak_bytes'])}  (arguments + temporaries + outputs - aliased)",
    ]
    if "xla_peak_bytes" in r:
        lines.append(f"  XLA peak        {_gib(r['xla_peak_bytes'])}  (peak_memory_in_bytes)")
    lines.append(f"for scale: one micro-batch's float32 logits are {_gib(r['logits_bytes_per_micro_batch'])} "
                 f"(all devices together)")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="jaxrl-llm bench memory", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=None, help="YAML run config (default: the built-in defaults)")
    p.add_argument("overrides", nargs="*", help="a.b=c config overrides")
    p.add_argument("--model-shape", choices=sorted(MODEL_SHAPES), default=None,
                   help="built-in model shape to use when the config's model folder is not here")
    p.add_argument("--platform", default=None, help="backend to compile for (default: JAX's default); "
                   "cpu gets as many fake devices as the config's mesh needs")
    p.add_argument("--devices", type=int, default=None,
                   help="devices in the mesh (default: the product of the config's mesh sizes, -1 counting 1)")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    p.add_argument("--plan", action="store_true",
                   help="print the trainer's whole memory plan per device (plan/memory.py) and whether it "
                        "fits, for devices of train.device_memory_gib (set it for a machine that is not here, "
                        "e.g. train.device_memory_gib=80 for an 80 GB GPU)")
    args = p.parse_args(argv)

    from jaxrl_llm.config import load_config

    cfg = load_config(args.config, args.overrides)
    sizes = [cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor]
    need = args.devices or math.prod(max(s, 1) for s in sizes)
    if need > 1:
        import jax

        try:  # fake CPU devices for the mesh; only possible before JAX starts its backends
            jax.config.update("jax_num_cpu_devices", max(need, jax.config.jax_num_cpu_devices))
        except RuntimeError:
            pass
    if args.plan:
        from jaxrl_llm.plan.memory import plan, suggestions

        mp = plan(cfg, model_config(cfg, args.model_shape))
        print(mp.report())
        tips = [] if mp.fits else suggestions(mp, cfg)
        print("fits" if mp.fits else "does not fit" + (": " + "; or ".join(tips) if tips else ""))
        return 0 if mp.fits else 1
    r = update_memory(cfg, model_config(cfg, args.model_shape), devices=args.devices, platform=args.platform)
    print(json.dumps(r, indent=2) if args.json else report(r))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
