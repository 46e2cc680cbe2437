"""Time HeRL's teacher-forced log-prob pass (train_on: original) at a config's model shape: the rows it ran
over before f3c8700 (the step's N) against the rows it runs over now (prompts_per_step x replace_top_n,
bucketed). Random weights: only the shapes matter.

    .venv/bin/python tools/teacher_pass_bench.py --config configs/rubric_smollm2.yaml --width 224
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", required=True)
    ap.add_argument("--width", type=int, default=224, help="token buffer width (the trainer's logprob_width)")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)

    import jax
    from flax import nnx

    from jaxrl_llm.plan.program import model_config
    from jaxrl_llm.config import load_config
    from jaxrl_llm.model.transformer import init_model
    from jaxrl_llm.parallel.mesh import make_mesh
    from jaxrl_llm.rl.spec import rows_per_step
    from jaxrl_llm.rl.update import make_logprobs
    from jaxrl_llm.sampling.buckets import bucket

    cfg = load_config(args.config)
    graphdef, params = nnx.split(init_model(model_config(cfg)))
    mesh = make_mesh({"data": 1, "fsdp": 1, "tensor": 1})
    before = rows_per_step(cfg)
    after = min(before, bucket(cfg.rollout.prompts_per_step * cfg.explore.herl.replace_top_n))
    for name, rows in (("before (the step's rows)", before), ("now (the rows a step can move)", after)):
        fn = make_logprobs(graphdef, cfg.model.compute_dtype, params, mesh, rows)
        tokens = np.random.default_rng(0).integers(3, 1000, size=(rows, args.width)).astype(np.int32)
        temps = np.ones(rows, np.float32)
        jax.block_until_ready(fn(params, tokens, temps))  # compile
        times = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            jax.block_until_ready(fn(params, tokens, temps))
            times.append(time.perf_counter() - t0)
        print(f"{name}: {rows} rows x {args.width} tokens: {min(times):.2f} s (min of {args.repeats})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
