"""The training update under several settings, on the trainer's own update program (rl/update.py make_update
through plan/program.py), one device: by default at reasoning length, dense attention against blockwise
(model.attention_block); `--settings` compares any overrides (full fine-tuning against LoRA, say).

For each setting: XLA's memory analysis of the compiled update (its peak: arguments + temporaries +
outputs - donated, and the temporaries alone), the measured RSS growth of one call (Linux; VmHWM reset through
/proc/self/clear_refs) and its wall time (best of --repeats calls after a warm-up call, the settings' calls interleaved so that a slow spell of a
shared machine falls on all of them). The batch is
the update's worst case for the config (prompts of data.max_prompt_len tokens, responses of --tokens); random
weights (the update's cost does not depend on their values).

    .venv/bin/python tools/bench_long_update.py --config configs/smollm2_long.yaml --tokens 2048 --rows 2 \
        --analysis-only
    .venv/bin/python tools/bench_long_update.py --config configs/smollm2_long.yaml --tokens 1024 --rows 2
    .venv/bin/python tools/bench_long_update.py --config configs/default.yaml --tokens 0 \
        --settings "model.lora.rank=0" "model.lora.rank=16 model.lora.alpha=32"

`--tokens 0` keeps the config's own rows (its worst-case minibatch). Prints one JSON line per setting and a
markdown table.
"""

from __future__ import annotations

import argparse
import json


def build(config: str, overrides: list[str], name: str) -> dict:
    """The setting's compiled update, its inputs and XLA's analysis of it."""
    import jax

    from jaxrl_llm.bench.random_update import random_update
    from jaxrl_llm.config import load_config
    from jaxrl_llm.parallel.mesh import make_mesh
    from jaxrl_llm.plan.program import analyse_update, model_config, peak_bytes
    from jaxrl_llm.plan.shapes import config_shapes
    from jaxrl_llm.rl.spec import loss_coefs

    cfg = load_config(config, [*overrides, "mesh.data=1"])
    mc = model_config(cfg)
    update, params, opt_state = random_update(cfg, mc, make_mesh({"data": 1}))
    batch = config_shapes(cfg, mc).worst_case_minibatch(cfg)
    analysis = analyse_update(update, cfg, params, opt_state, batch)
    m = analysis.memory
    facts = {"setting": name, "xla_peak_bytes": peak_bytes(m), "xla_temp_bytes": int(m.temp_size_in_bytes),
             "compile_s": round(analysis.compile_s, 1), "micro_batches": analysis.micro_batches,
             "rows_per_micro_batch": analysis.rows_per_micro_batch, "row_width": config_shapes(cfg, mc).row_width,
             "platform": jax.devices()[0].platform, "rss_growth_bytes": 0, "update_s": float("nan"), "times": []}
    return {"facts": facts, "call": (update, params, opt_state, batch, loss_coefs(cfg))}


def run_once(setting: dict) -> None:
    """One call of the setting's update on fresh copies of its state: wall time and RSS growth."""
    from jaxrl_llm.bench.random_update import timed_call

    seconds, growth = timed_call(*setting["call"])
    f = setting["facts"]
    f["times"].append(round(seconds, 3))
    f["update_s"] = min(f["times"])
    f["rss_growth_bytes"] = max(f["rss_growth_bytes"], growth)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", required=True)
    ap.add_argument("--tokens", type=int, default=2048, help="response tokens per row (rollout.max_new_tokens); "
                    "0: the config's own rows")
    ap.add_argument("--rows", type=int, default=2, help="rows of one group, all in one micro-batch")
    ap.add_argument("--settings", nargs="+", default=["model.attention_block=0", "model.attention_block=512"],
                    help="each a space-separated list of overrides: the settings compared, the first the baseline")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--analysis-only", action="store_true", help="compile and read XLA's analysis; run nothing "
                    "(for shapes whose dense update does not fit this machine)")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args(argv)
    overrides = [f"rollout.max_new_tokens={args.tokens}", "rollout.prompts_per_step=1",
                 f"rollout.group_size={args.rows}", f"algo.micro_batch={args.rows}"] if args.tokens else []
    settings = [build(args.config, [*overrides, *args.overrides, *s.split()], s) for s in args.settings]
    if not args.analysis_only:
        for s in settings:  # warm-up: the first call of a program pays for more than the program
            run_once(s)
            s["facts"].update(times=[], rss_growth_bytes=0)
        for _ in range(args.repeats):  # interleaved, so a slower spell of the machine hits every setting
            for s in settings:
                run_once(s)
    results = [s["facts"] for s in settings]
    for r in results:
        print(json.dumps(r), flush=True)
    base = results[0]
    shape = f"{args.tokens}-token responses, {args.rows} rows of one group" if args.tokens else \
        f"{args.config}'s rows: {base['micro_batches']} micro-batch(es) of {base['rows_per_micro_batch']}"
    print(f"\n{shape}, {base['platform']}, row width {base['row_width']}\n")
    print("| setting | XLA peak | XLA temporaries | RSS growth | update s |")
    print("|---|---|---|---|---|")
    for r in results:
        name = r["setting"]
        rel = lambda k: f" ({r[k] / base[k]:.2f}x)" if r is not base and base[k] else ""  # noqa: E731
        ran = r["update_s"] == r["update_s"]  # not NaN: the update was run
        rss = f"{r['rss_growth_bytes'] / 2**20:.0f} MiB{rel('rss_growth_bytes')}" if ran else "-"
        secs = f"{r['update_s']:.2f}{rel('update_s')}" if ran else "-"
        print(f"| {name} | {r['xla_peak_bytes'] / 2**20:.0f} MiB{rel('xla_peak_bytes')} | "
              f"{r['xla_temp_bytes'] / 2**20:.0f} MiB{rel('xla_temp_bytes')} | {rss} | {secs} |")


if __name__ == "__main__":
    main()
