"""What an explorer's context floors cost the update (rl/layout.py shared_layout, plan/shapes.py RunShapes).

Explorers' groups have any sizes and their contexts (RRL's prompt + prefix, HeRL's revise prompts) any length, so
a run fixes the update's context axis at a bound (contexts a micro-batch can hold) and its context length at a
floor, one shape for the whole run. Until 2026-12-07 both were rounded up to powers of two: an RRL run on
configs/smollm2_steps.yaml (micro-batches of 16 rows, replay groups of at least 4, prompts of up to 60 tokens,
prefixes of up to 40) encoded 8 contexts of 128 slots per micro-batch where 5 of 112 suffice, and GRPO encodes 2
of 64. This times the trainer's own update program (rl/update.py, random weights: the cost does not depend on
them) on the config's worst-case rows laid out with each setting's floors, calls interleaved, best of --repeats.

    .venv/bin/python tools/bench_explorer_layout.py --config configs/smollm2_steps.yaml \
        --context 60 --floors 2x16 8x128 5x112

Each --floors item is CONTEXTSxLENGTH (min_contexts x min_context). Prints one JSON line per setting and a table.
"""

from __future__ import annotations

import argparse
import json


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", required=True)
    ap.add_argument("--floors", nargs="+", default=["2x16", "8x128", "5x112"])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--context", type=int, default=0, help="prompt tokens of every row (0: data.max_prompt_len)")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args(argv)

    import jax
    import numpy as np

    from jaxrl_llm.bench.random_update import random_update, timed_call
    from jaxrl_llm.config import load_config
    from jaxrl_llm.parallel.mesh import make_mesh
    from jaxrl_llm.plan.program import model_config
    from jaxrl_llm.plan.shapes import config_shapes, worst_case_rows
    from jaxrl_llm.rl.batch import positions
    from jaxrl_llm.rl.layout import shared_layout
    from jaxrl_llm.rl.spec import loss_coefs

    cfg = load_config(args.config, [*args.overrides, "mesh.data=1"])
    mc = model_config(cfg)
    update, params, opt_state = random_update(cfg, mc, make_mesh({"data": 1}))
    shapes = config_shapes(cfg, mc)
    n = shapes.rows_per_update
    rows = worst_case_rows(cfg, n, context=args.context or cfg.data.max_prompt_len, width=shapes.row_width)
    micro = min(cfg.algo.micro_batch, n)
    settings = []
    for item in args.floors:
        g, lc = (int(x) for x in item.lower().split("x"))
        batch = shared_layout(rows, np.arange(n), micro, min_contexts=g, min_context=lc)
        settings.append({"floors": item, "ctx_tokens": list(batch.ctx_tokens.shape),
                         "tokens": list(batch.tokens.shape), "positions": positions(batch), "times": [],
                         "batch": batch})

    def call(s):
        return timed_call(update, params, opt_state, s["batch"], loss_coefs(cfg))[0]

    for s in settings:  # warm-up: compiles each shape
        call(s)
    for _ in range(args.repeats):
        for s in settings:
            s["times"].append(round(call(s), 3))
    base = settings[0]
    print(f"\n{args.config}: {n} rows, micro-batches of {micro}, {jax.devices()[0].platform}\n")
    print("| floors (contexts x length) | context axis | rows | positions | update s (best) |")
    print("|---|---|---|---|---|")
    for s in settings:
        s.pop("batch")
        s["update_s"] = min(s["times"])
        print(json.dumps(s), flush=True)
    for s in settings:
        rel = "" if s is base else f" ({s['update_s'] / base['update_s']:.2f}x)"
        print(f"| {s['floors']} | {s['ctx_tokens']} | {s['tokens']} | {s['positions']:,} | {s['update_s']:.2f}{rel} |")


if __name__ == "__main__":
    main()
