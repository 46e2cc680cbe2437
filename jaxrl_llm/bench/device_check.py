"""A short check of an accelerator (tools/device_check.sh): how close our jitted programs come to the
device's limits, in a few minutes, with nothing downloaded.

1. Sampler decode: new tokens/s of the jitted sampler (greedy, KV cache, every row decoding to the end)
   on a model of SmolLM2-135M's shape with random weights in bf16, and the fraction of the device's
   HBM-bandwidth roofline that reaches: each decode step must read every weight once and each row's
   keys and values so far, so bytes per step / (seconds per step x bandwidth).
2. Update MFU: one RL update (shared-prefix layout, bf16 compute over float32 master weights, Adam) of
   that model on a batch of rows; model FLOPs (6 x matmul parameters per position, attention scores
   left out, as `bench step` counts them) per second against the device's peak bf16 rate.
3. A short toy run: `jaxrl-llm train --config configs/toy.yaml` for a few steps, its wall time.

Peak rates come from the table below by `device_kind`; an unknown device (or a CPU) reports the
measured rates without fractions. `--quick` shrinks everything for a CPU smoke test.

    python -m jaxrl_llm.bench.device_check [--quick] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# device_kind substring -> (HBM bandwidth GB/s, dense bf16 peak TFLOP/s), from the vendors' data sheets
PEAKS = {
    "H200": (4800, 989), "H100": (3350, 989), "A100": (2039, 312), "L4": (300, 121), "L40S": (864, 362),
    "TPU v5p": (2765, 459), "TPU v5 lite": (819, 197), "TPU v5e": (819, 197), "TPU v4": (1228, 275),
    "TPU v6 lite": (1640, 918), "TPU v6e": (1640, 918),
}
SMOLLM2 = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30, num_heads=9, num_kv_heads=3,
               head_dim=64, tie_embeddings=True, rope_theta=100000.0, rms_norm_eps=1e-5, max_position_embeddings=8192)
TINY = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4, num_kv_heads=2,
            head_dim=16, tie_embeddings=True, max_position_embeddings=512)


def peaks(kind: str):
    for key, value in PEAKS.items():
        if key.lower() in kind.lower():
            return value
    return None


def _timed(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def decode_check(shape: dict, batch: int, prompt: int, new: int, repeats: int) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np

    from jaxrl_llm.model.config import ModelConfig
    from jaxrl_llm.model.transformer import init_model
    from jaxrl_llm.sampling.sampler import Sampler

    cfg = ModelConfig(**shape, param_dtype="bfloat16")
    model = init_model(cfg)
    sampler, state = Sampler.for_model(model, pad_id=0, stop_ids=())
    prompts = np.random.RandomState(0).randint(3, cfg.vocab_size, size=(batch, prompt)).tolist()

    def go():
        out = sampler(state, prompts, max_new_tokens=new, temperature=0.0, key=jax.random.key(0))
        return out

    go()  # compiles
    short = lambda: sampler(state, prompts, max_new_tokens=1, temperature=0.0, key=jax.random.key(0))  # noqa: E731
    short()
    t_all, t_prefill = _timed(go, repeats), _timed(short, repeats)
    steps = new - 1
    decode_s = t_all - t_prefill
    separated = decode_s > 0.1 * t_all  # else timing noise swamps the difference (tiny shapes): count it all
    if not separated:
        decode_s = t_all
    per_step = decode_s / steps
    weights = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(state))
    kv_per_token = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * jnp.dtype(jnp.bfloat16).itemsize
    mean_len = prompt + new / 2
    bytes_per_step = weights + batch * mean_len * kv_per_token
    return {"batch": batch, "prompt": prompt, "new": new, "tokens_per_s": batch * steps / decode_s,
            "prefill_separated": separated,
            "step_ms": per_step * 1e3, "bytes_per_step": bytes_per_step,
            "achieved_gb_s": bytes_per_step / per_step / 1e9}


def update_check(shape: dict, prompts: int, group: int, ctx: int, new: int, repeats: int) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    from jaxrl_llm.bench.step_bench import _matmul_params
    from jaxrl_llm.config import load_config
    from jaxrl_llm.model.config import ModelConfig
    from jaxrl_llm.model.transformer import init_model
    from jaxrl_llm.parallel.mesh import make_mesh
    from jaxrl_llm.parallel.rules import shard_state
    from jaxrl_llm.rl.batch import RowBatch, positions
    from jaxrl_llm.rl.layout import shared_layout
    from jaxrl_llm.rl.spec import loss_coefs
    from jaxrl_llm.rl.update import UpdateSpec, init_optimizer, make_optimizer, make_update

    cfg = ModelConfig(**shape, param_dtype="float32")
    mesh = make_mesh({"data": -1})
    graphdef, state = nnx.split(init_model(cfg))
    params = shard_state(state, mesh)
    optimizer = make_optimizer(1e-6)
    opt_state = init_optimizer(optimizer, params, mesh)
    n = prompts * group
    rng = np.random.RandomState(0)
    tokens = rng.randint(3, cfg.vocab_size, size=(n, ctx + new)).astype(np.int32)
    tokens[:, :ctx] = np.repeat(tokens[::group, :ctx], group, axis=0)  # groups share their prompt
    mask = np.zeros_like(tokens, bool)
    mask[:, ctx:] = True
    rows = RowBatch.make(tokens, mask, context_len=np.full(n, ctx), old_logp=np.full(tokens.shape, -1.0),
                         advantages=rng.randn(n).astype(np.float32))
    batch = shared_layout(rows, np.arange(n), group)
    spec = UpdateSpec(layout="shared", compute_dtype="bfloat16")
    update = make_update(graphdef, spec, optimizer, params, opt_state, mesh)
    coefs = loss_coefs(load_config(None, [f"rollout.max_new_tokens={new}"]))  # the default config's loss coefficients
    fresh = lambda: (jax.tree.map(jnp.copy, params), jax.tree.map(jnp.copy, opt_state))  # noqa: E731
    jax.block_until_ready(update(*fresh(), batch, coefs))  # compiles
    times = []
    for _ in range(repeats):
        p, o = fresh()
        jax.block_until_ready((p, o))
        t0 = time.perf_counter()
        jax.block_until_ready(update(p, o, batch, coefs))
        times.append(time.perf_counter() - t0)
    body, head = _matmul_params(cfg)
    body_pos = positions(batch) - batch.tokens.shape[0] * batch.tokens.shape[1]
    flops = 6.0 * (body * body_pos + head * int(batch.tokens.size))
    return {"rows": n, "context": ctx, "new": new, "update_s": min(times), "model_tflop": flops / 1e12,
            "tflop_s": flops / min(times) / 1e12}


def toy_run(steps: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "jaxrl_llm.cli", "train", "--config", "configs/toy.yaml", f"train.steps={steps}",
               f"train.out_dir={tmp}", "train.tensorboard=false", "train.export_final=false",
               f"eval.every={steps}", "eval.size=64", "sft.steps=50"]
        t0 = time.perf_counter()
        out = subprocess.run(cmd, cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True,
                             env={**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"})
        wall = time.perf_counter() - t0
    if out.returncode != 0:
        return {"ok": False, "error": out.stderr[-1500:] or out.stdout[-1500:]}
    return {"ok": True, "steps": steps, "wall_s": wall, "summary": [ln for ln in out.stdout.splitlines()
                                                                     if ln.startswith("summary")][-1:]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jaxrl_llm.bench.device_check", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny sizes (a CPU smoke test)")
    parser.add_argument("--json", default=None, help="also write the figures to this file")
    args = parser.parse_args(argv)
    import jax

    dev = jax.devices()[0]
    kind = getattr(dev, "device_kind", dev.platform)
    out = {"platform": dev.platform, "device_kind": kind, "devices": jax.device_count(), "jax": jax.__version__}
    peak = peaks(kind) if dev.platform != "cpu" else None
    shape = TINY if args.quick else SMOLLM2
    t0 = time.perf_counter()
    if args.quick:
        out["decode"] = decode_check(shape, batch=4, prompt=16, new=64, repeats=2)
        out["update"] = update_check(shape, prompts=2, group=4, ctx=16, new=16, repeats=1)
        out["toy_run"] = {"ok": None, "skipped": "--quick"}
    else:
        out["decode"] = decode_check(shape, batch=64, prompt=128, new=256, repeats=3)
        out["update"] = update_check(shape, prompts=8, group=8, ctx=256, new=256, repeats=3)
        out["toy_run"] = toy_run(20)
    out["seconds"] = time.perf_counter() - t0
    if peak:
        bw, tf = peak
        out["hbm_gb_s"], out["peak_bf16_tflop_s"] = bw, tf
        out["decode"]["roofline_fraction"] = out["decode"]["achieved_gb_s"] / bw
        out["update"]["mfu"] = out["update"]["tflop_s"] / tf
    d, u = out["decode"], out["update"]
    print(f"device: {out['devices']} x {kind} ({dev.platform}), jax {jax.__version__}")
    print(f"sampler decode: {d['tokens_per_s']:,.0f} new tokens/s (batch {d['batch']}, {d['step_ms']:.2f} ms a step, "
          f"{d['achieved_gb_s']:.0f} GB/s of weights + KV read"
          + (f", {d['roofline_fraction']:.0%} of the {out['hbm_gb_s']} GB/s HBM roofline)" if peak else ")"))
    print(f"update: {u['update_s']:.3f} s for {u['rows']} rows of {u['context']} + {u['new']} tokens, "
          f"{u['tflop_s']:.2f} model TFLOP/s in bf16" + (f", MFU {u['mfu']:.1%} of {out['peak_bf16_tflop_s']}" if peak
                                                          else ""))
    toy = out["toy_run"]
    print("toy run: " + (f"{toy['steps']} steps in {toy['wall_s']:.1f} s (compiles included) {toy['summary']}"
                         if toy.get("ok") else f"{toy}"))
    print(f"device check took {out['seconds']:.0f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    return 0 if toy.get("ok") is not False else 1


if __name__ == "__main__":
    raise SystemExit(main())
