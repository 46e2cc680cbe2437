"""Device memory of the training update, as XLA's own analysis of the compiled program reports it.

Compiles (never runs) the RL update a run of the config would compile, with abstract inputs
(`jax.ShapeDtypeStruct`s for parameters, optimizer state and batch; nothing is allocated), and
prints `compiled.memory_analysis()`: argument, output, temporary, generated-code and aliased
(donated) bytes per device, and the peak they imply (arguments + temporaries + outputs - aliases).
Figures quoted in configs and the README come from here, not from hand arithmetic.

The batch is one minibatch of the trainer's rows at their largest (prompts of data.max_prompt_len
tokens, responses of rollout.max_new_tokens; a row is the sampler's buffer, `Sampler.shapes`), put
in the layout the trainer gives the update (rollout.shared_prefix: rl/layout.py shared_layout, else
rows_layout). The figures are those of the backend the program is compiled for: XLA:CPU on a
machine without accelerators compiles the same program with another buffer assignment and schedule
than XLA:GPU or XLA:TPU (it does not realise remat's savings, jax-ml/jax#19822).

    jaxrl-llm bench memory --config configs/gpu_qwen2.5_0.5b.yaml --model-shape qwen2.5-0.5b
    jaxrl-llm bench memory --config configs/tpu_qwen2.5_1.5b.yaml --model-shape qwen2.5-1.5b --platform cpu
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import time

# Built-in model shapes, for configs whose model folder is not on this machine (no weights needed).
_QWEN2 = dict(architecture="qwen2", attention_bias=True, tie_embeddings=True, rope_theta=1e6, rms_norm_eps=1e-6,
              max_position_embeddings=32768, vocab_size=151936, num_kv_heads=2)
MODEL_SHAPES = {
    "qwen2.5-0.5b": dict(_QWEN2, hidden_size=896, intermediate_size=4864, num_layers=24, num_heads=14, head_dim=64),
    "qwen2.5-1.5b": dict(_QWEN2, hidden_size=1536, intermediate_size=8960, num_layers=28, num_heads=12,
                         head_dim=128),
    "qwen2.5-7b": dict(_QWEN2, hidden_size=3584, intermediate_size=18944, num_layers=28, num_heads=28,
                       num_kv_heads=4, head_dim=128, vocab_size=152064, tie_embeddings=False),
}

_GIB = 1024 ** 3


def model_config(cfg, model_shape: str | None = None):
    """The ModelConfig a run of `cfg` would build: the config's HF folder when it is here (or its scratch
    model), else the built-in shape `model_shape`."""
    from jaxrl_llm.model.config import ModelConfig

    if cfg.model.name == "scratch":
        from jaxrl_llm.model.char_tokenizer import char_tokenizer

        tok = char_tokenizer()  # as train/policy.py build_policy
        return ModelConfig(**{"vocab_size": len(tok), **cfg.model.scratch, "param_dtype": cfg.model.param_dtype,
                              "eos_token_ids": (tok.eos_token_id,)})
    from jaxrl_llm.model.registry import resolve

    try:
        folder = resolve(cfg.model.name, auto_prepare=False)
    except (ValueError, FileNotFoundError) as e:
        if model_shape is None:
            raise ValueError(f"{e}; pass --model-shape with one of {', '.join(MODEL_SHAPES)}") from None
    else:
        return ModelConfig.from_hf_folder(folder, param_dtype=cfg.model.param_dtype)
    if model_shape not in MODEL_SHAPES:
        raise ValueError(f"unknown model shape {model_shape!r}; known: {', '.join(MODEL_SHAPES)}")
    return ModelConfig(**MODEL_SHAPES[model_shape], param_dtype=cfg.model.param_dtype)


def row_length(cfg, model_cfg) -> int:
    """Length of the longest rows the trainer updates on: the sampler's buffer for prompts of
    data.max_prompt_len tokens and rollout.max_new_tokens new tokens (as Run builds its Sampler)."""
    from jaxrl_llm.sampling.sampler import Sampler

    sampler = Sampler(None, pad_id=0, max_cache_len=model_cfg.max_position_embeddings)
    max_new = min(cfg.rollout.max_new_tokens, sampler.max_cache_len - 1)  # the sampler's per-row clamp
    return sampler.shapes(1, cfg.data.max_prompt_len, max_new)[2]


def _worst_case_rows(cfg, model_cfg, context: int | None = None, width: int | None = None) -> dict:
    """The trainer's rows (train/rollout.py update_rows) at their largest: every prompt `context` tokens
    (default data.max_prompt_len) in rows of `width` (default the sampler's buffer for it), every response
    rollout.max_new_tokens, groups of group_size rows sharing their prompt. Only shapes matter; the values
    just make contexts distinct per group."""
    import numpy as np

    n = cfg.rollout.prompts_per_step * cfg.rollout.group_size
    width, ctx = width or row_length(cfg, model_cfg), context or cfg.data.max_prompt_len
    new = min(cfg.rollout.max_new_tokens, width - ctx)
    tokens = np.zeros((n, width), np.int32)
    tokens[:, :ctx] = (np.arange(n) // cfg.rollout.group_size + 1)[:, None]
    mask = np.zeros((n, width), bool)
    mask[:, ctx:ctx + new] = True
    from jaxrl_llm.rl.batch import RowBatch

    return RowBatch.make(tokens, mask, context_len=np.full(n, ctx, np.int32), advantages=np.zeros(n, np.float32))


def _update_program(cfg, model_cfg, graphdef, optimizer, mesh):
    """One RL update as train/loop.py Run builds and calls it: (spec, batch [numpy, one minibatch in the
    layout the trainer gives the update], the batch's shardings, coefficients, step(params, opt_state,
    batch, coefs, ref_params)). The one place that knows update_fn's signature, the spec's fields and
    the trainer's batch layouts."""
    import numpy as np

    from jaxrl_llm.rl.update import batch_shardings, update_fn
    from jaxrl_llm.train.loop import _coefs, minibatch, rl_update_spec

    rows = cfg.rollout.prompts_per_step * cfg.rollout.group_size
    mb_rows = rows // cfg.algo.minibatches
    spec = rl_update_spec(cfg)
    # with several minibatches the trainer draws rows at random; a stride spreads them over the groups,
    # the most distinct contexts a micro-batch can get
    batch = minibatch(cfg, _worst_case_rows(cfg, model_cfg), np.arange(mb_rows) * cfg.algo.minibatches)

    def step(params, opt_state, batch, coefs, ref_params=None):
        return update_fn(graphdef, spec, optimizer, params=params, opt_state=opt_state, batch=batch, coefs=coefs,
                         ref_params=ref_params)

    return spec, batch, batch_shardings(mesh, spec, batch), _coefs(cfg), step


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


def abstract_state(cfg, model_cfg, mesh):
    """(graphdef, parameters, optimizer, optimizer state) of a run of `cfg` on `mesh` as ShapeDtypeStructs with
    the trainer's shardings (parameters by parallel/rules.py, Adam's moments like them): nothing allocated."""
    import jax
    from flax import nnx

    from jaxrl_llm.model.transformer import abstract_model
    from jaxrl_llm.parallel.rules import sharding_tree
    from jaxrl_llm.rl.update import abstract_optimizer_state, make_optimizer

    model = abstract_model(model_cfg)
    model.remat = cfg.model.remat  # as train/policy.py _with_remat
    graphdef, state = nnx.split(model)
    params = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), state,
                          sharding_tree(state, mesh))
    o = cfg.optim
    optimizer = make_optimizer(o.lr, warmup_steps=o.warmup_steps, schedule=o.schedule,
                               total_steps=cfg.train.steps * cfg.algo.ppo_epochs * cfg.algo.minibatches,
                               weight_decay=o.weight_decay, b1=o.b1, b2=o.b2, max_grad_norm=o.max_grad_norm)
    return graphdef, params, optimizer, abstract_optimizer_state(optimizer, params, mesh)


_ANALYSES: dict = {}  # XLA memory analyses by the update program's text


def update_memory(cfg, model_cfg=None, *, devices: int | None = None, platform: str | None = None) -> dict:
    """XLA's memory analysis (bytes per device) of the compiled update program for `cfg`, and the facts
    it depends on. `model_cfg` defaults to the config's model (its HF folder must be here). The
    optimizer state is laid out as the trainer lays it out (rl/update.py optimizer_shardings)."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from jaxrl_llm.rl.batch import shapes

    model_cfg = model_cfg or model_config(cfg)
    mesh = _mesh(cfg, devices, platform)
    graphdef, params, optimizer, opt_state = abstract_state(cfg, model_cfg, mesh)
    replicated = NamedSharding(mesh, P())
    opt_sh = jax.tree.map(lambda x: x.sharding, opt_state)

    length = row_length(cfg, model_cfg)
    spec, np_batch, batch_sh, coefs, step = _update_program(cfg, model_cfg, graphdef, optimizer, mesh)
    batch = jax.tree.map(lambda v, s: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=s), np_batch, batch_sh)
    coefs = {k: jax.ShapeDtypeStruct((), jnp.float32, sharding=replicated) for k in coefs}
    args = (params, opt_state, batch, coefs) + ((params,) if spec.use_kl else ())
    param_out = jax.tree.map(lambda x: x.sharding, params)
    jitted = jax.jit(lambda p, o, b, c, *ref: step(p, o, b, c, ref[0] if ref else None),
                     out_shardings=(param_out, opt_sh, replicated), donate_argnums=(0, 1))
    t0 = time.perf_counter()
    lowered = jitted.lower(*args)
    t1 = time.perf_counter()
    key = hashlib.sha256(lowered.as_text().encode()).hexdigest()
    if key not in _ANALYSES:  # a program compiled before (plan() and then check() of one config) is not again
        _ANALYSES[key] = lowered.compile().memory_analysis()
    t2 = time.perf_counter()
    m = _ANALYSES[key]

    if spec.layout == "shared":  # [M micro-batches, R rows, Ls own tokens], contexts [M, G, Lc]
        micro_batches, micro_rows, _ = np_batch.tokens.shape
    else:
        micro_batches, micro_rows = spec.micro_batches, np_batch.tokens.shape[0] // spec.micro_batches
    n_params = sum(math.prod(x.shape) for x in jax.tree.leaves(params))
    out = {
        "argument_bytes": int(m.argument_size_in_bytes), "output_bytes": int(m.output_size_in_bytes),
        "temp_bytes": int(m.temp_size_in_bytes), "generated_code_bytes": int(m.generated_code_size_in_bytes),
        "alias_bytes": int(m.alias_size_in_bytes),
    }
    out["peak_bytes"] = out["argument_bytes"] + out["temp_bytes"] + out["output_bytes"] - out["alias_bytes"]
    xla_peak = getattr(m, "peak_memory_in_bytes", None)
    if xla_peak and mesh.devices.flat[0].platform != "cpu":  # XLA:CPU leaves it near the argument size
        out["xla_peak_bytes"] = int(xla_peak)
    out.update({
        "backend": mesh.devices.flat[0].platform, "devices": int(mesh.devices.size), "mesh": dict(mesh.shape),
        "parameters": n_params, "param_dtype": model_cfg.param_dtype, "compute_dtype": spec.compute_dtype,
        "remat": bool(cfg.model.remat), "layout": spec.layout,
        "rows_per_update": cfg.rollout.prompts_per_step * cfg.rollout.group_size // cfg.algo.minibatches,
        "micro_batches": int(micro_batches), "rows_per_micro_batch": int(micro_rows), "row_length": length,
        "batch_shapes": shapes(np_batch), "vocab": model_cfg.vocab_size,
        "use_kl": spec.use_kl,
        # what the configs' first comments counted: float32 logits of one micro-batch's whole rows (the rows
        # layout materialises them; the shared layout computes its logits in chunks)
        "logits_bytes_per_micro_batch": int(micro_rows) * (length - 1) * model_cfg.vocab_size * 4,
        "lower_s": round(t1 - t0, 2), "compile_s": round(t2 - t1, 2),
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
    if r["backend"] == "cpu" and r["remat"]:
        lines.append("note: XLA:CPU's schedule does not realise remat's savings (model.remat=false reports about the "
                     "same temporaries; jax-ml/jax#19822): on GPU / TPU, compile there (--platform) for their figure")
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
                   help="print the trainer's whole memory plan per device (parallel/memory_plan.py) and whether it "
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
        from jaxrl_llm.parallel.memory_plan import plan, suggestions

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
