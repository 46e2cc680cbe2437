"""Sampling reasoning-length responses whose lengths spread: what each way of decoding costs for the same tokens.

Rows get their own lengths from a lognormal spread (median --median, capped at --cap), forced through per-row
token budgets with no stop token, so every variant generates exactly the same tokens (asserted), and the
figures compare cost alone:
- whole buffer: one call, every decode step attending over the whole cache (`decode_level=0`, the sampler
  before issue 28);
- growing cache: one call, the cache growing through levels (`Sampler.decode_level`, default 256);
- slots (S): the rows through S decode slots (`Sampler.decode_slots`, sampling/slots.py): finished rows leave,
  waiting rows refill their slots, live rows are compacted into fewer slots when no row waits;
- length oracle: the rows sorted by length into --oracle-calls calls (whole buffer each), as if lengths were
  known ahead: what rows riding along after they finish, and attention over empty slots, cost;
- full batch: the same rows all at the median length: the rate a batch of equal rows reaches (the bound).

    .venv/bin/python tools/bench_long_sampling.py --model smollm2-135m-instruct --rows 32 --prompt-len 64
    .venv/bin/python tools/bench_long_sampling.py --rows 64 --slots 16,32   # more rows than slots

Prints one JSON line per variant and a markdown table (seconds are the best of --repeats after a warm-up call).
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m-instruct", help="a known short name or an HF folder")
    ap.add_argument("--rows", type=int, default=32)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--median", type=int, default=96)
    ap.add_argument("--cap", type=int, default=512)
    ap.add_argument("--sigma", type=float, default=0.8, help="the lognormal's sigma")
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--oracle-calls", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--slots", default="", help="comma-separated slot counts (default: --rows)")
    args = ap.parse_args(argv)

    import jax

    from jaxrl_llm.model.hf_io import load_hf_folder
    from jaxrl_llm.model.registry import resolve
    from jaxrl_llm.sampling.sampler import DECODE_LEVEL, Sampler

    model, cfg = load_hf_folder(resolve(args.model), param_dtype="float32")
    rng = np.random.RandomState(0)
    prompts = rng.randint(3, cfg.vocab_size, size=(args.rows, args.prompt_len)).tolist()
    lengths = np.clip(np.round(args.median * np.exp(args.sigma * rng.randn(args.rows))), 1, args.cap).astype(int)
    whole, state = Sampler.for_model(model, pad_id=0, stop_ids=(), decode_level=0)
    grow, _ = Sampler.for_model(model, pad_id=0, stop_ids=(), decode_level=DECODE_LEVEL)
    key = jax.random.key(0)
    row_keys = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(key, np.arange(args.rows))

    def one_call(sampler):
        return lambda: [sampler(state, prompts, max_new_tokens=lengths, temperature=args.temperature,
                                row_keys=row_keys, stop_ids=())]

    order = np.argsort(lengths)
    parts = np.array_split(order, args.oracle_calls)

    def oracle():
        return [whole(state, [prompts[i] for i in p], max_new_tokens=lengths[p], temperature=args.temperature,
                      row_keys=row_keys[p], stop_ids=()) for p in parts]

    median = int(np.median(lengths))

    def full_batch():
        return [whole(state, prompts, max_new_tokens=median, temperature=args.temperature, row_keys=row_keys,
                      stop_ids=())]

    slot_samplers = {}
    for n in [int(x) for x in (args.slots or str(args.rows)).split(",")]:
        slot_samplers[f"slots ({n})"] = Sampler.for_model(model, pad_id=0, stop_ids=(), decode_level=DECODE_LEVEL,
                                                          decode_slots=n)[0]
    variants = {"whole buffer": one_call(whole), f"growing cache ({DECODE_LEVEL})": one_call(grow),
                **{name: one_call(s) for name, s in slot_samplers.items()},
                f"length oracle ({args.oracle_calls} calls)": oracle, "full batch at the median": full_batch}
    results, outputs = [], {}
    for name, fn in variants.items():
        outputs[name] = fn()  # warm-up: compiles
        times = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        tokens = int(sum(o.num_generated.sum() for o in outputs[name]))
        results.append({"variant": name, "seconds": min(times), "tokens": tokens, "tok_per_s": tokens / min(times)})
        if name in slot_samplers:  # decode steps x slots computed, against the tokens generated
            st = slot_samplers[name].slot_stats
            results[-1].update(slot_steps=st.slot_steps, admits=st.admits, decodes=st.decodes, regroups=st.regroups)
        print(json.dumps(results[-1]), flush=True)

    # the same tokens from every variant that samples these lengths (the oracle's rows back in order)
    ref = outputs["whole buffer"][0]
    for name in list(variants)[1:-1]:
        outs = outputs[name]
        if len(outs) > 1:
            got = [None] * args.rows
            for p, o in zip(parts, outs):
                for j, i in enumerate(p):
                    got[i] = o.generated(j)
        else:
            got = [outs[0].generated(i) for i in range(args.rows)]
        same = sum(got[i] == ref.generated(i) for i in range(args.rows))
        print(f"{name}: {same} of {args.rows} rows token for token equal to the whole buffer's")

    base = results[0]["seconds"]
    print(f"\n{args.model}, {args.rows} rows, {args.prompt_len}-token prompts, T={args.temperature}, lengths lognormal "
          f"(median {median}, max {lengths.max()}, {int(lengths.sum())} tokens), {jax.devices()[0].platform}\n")
    print("| variant | seconds | new tok/s | vs whole buffer |")
    print("|---|---|---|---|")
    for r in results:
        print(f"| {r['variant']} | {r['seconds']:.1f} | {r['tok_per_s']:.0f} | {r['seconds'] / base:.2f}x |")


if __name__ == "__main__":
    main()
