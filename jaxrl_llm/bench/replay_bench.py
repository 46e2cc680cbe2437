"""Cost of the RRL replay array's operations against its capacity (issue #9: 1k to 64k states).

    jaxrl-llm bench replay [--capacities 1024,4096,16384,65536] [--prefix 64] [--candidates 256]
                           [--draws 8] [--prompts 2000] [--repeats 7] [--out OUT.json]

Each capacity gets a full array of random states (the worst case: every slot competes), then each
jitted operation (array donated, as the trainer calls it) is timed: median of `repeats` calls after
one warm-up call. Printed per operation: ms per call and that time divided by C log2 C, scaled to
1 at the smallest capacity (stays near 1 or falls when the cost grows no faster than a sort).
"""

from __future__ import annotations

import argparse
import json
import math
import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm.explore import replay as rp


def full_state(capacity: int, prefix: int, prompts: int, seed: int = 0) -> rp.ReplayState:
    rng = np.random.default_rng(seed)
    length = rng.integers(1, prefix + 1, capacity).astype(np.int32)
    tokens = rng.integers(1, 50000, (capacity, prefix)).astype(np.int32)
    tokens[np.arange(prefix)[None, :] >= length[:, None]] = 0
    prompt = rng.integers(0, prompts, capacity).astype(np.int32)
    s = rp.empty(capacity, prefix)
    fp = rp.fingerprint(jnp.asarray(tokens), jnp.asarray(length), jnp.asarray(prompt))
    return s.replace(tokens=jnp.asarray(tokens), length=jnp.asarray(length), prompt=jnp.asarray(prompt),
                     value_sum=jnp.asarray(rng.random(capacity, np.float32) * 3),
                     visits=jnp.asarray(rng.integers(0, 4, capacity).astype(np.float32)),
                     prior=jnp.asarray(rng.random(capacity, np.float32)), fingerprint=fp)


def _time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats + 1):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - t0)
    return float(np.median(times[1:])) * 1e3


def measure(capacity: int, prefix: int, candidates: int, draws: int, prompts: int, repeats: int) -> dict:
    ops = rp.jitted()
    rng = np.random.default_rng(1)
    box = {"s": full_state(capacity, prefix, prompts)}
    cand_len = rng.integers(1, prefix + 1, candidates).astype(np.int32)
    cand = (jnp.asarray(rng.integers(1, 50000, (candidates, prefix)).astype(np.int32)), jnp.asarray(cand_len),
            jnp.asarray(rng.integers(0, prompts, candidates).astype(np.int32)),
            jnp.asarray(rng.random(candidates, np.float32) + 1.0), jnp.ones(candidates, bool))
    idx = jnp.arange(draws, dtype=jnp.int32) * (capacity // draws)
    solved = jnp.asarray(rng.random(prompts) < 0.01)
    key = jax.random.key(0)

    def run(op):
        def call():
            out = op(box["s"])
            if isinstance(out, tuple) and isinstance(out[0], rp.ReplayState):
                box["s"] = out[0]
            elif isinstance(out, rp.ReplayState):
                box["s"] = out
            return out
        return call

    result = {"capacity": capacity}
    result["insert"] = _time(run(lambda s: ops.insert(s, *cand, 3, 2, 0.5)), repeats)
    result["sample"] = _time(run(lambda s: ops.sample(s, key, k=draws, c_ucb=0.5, temperature=0.1)), repeats)
    result["update_values"] = _time(run(lambda s: ops.update_values(s, idx, jnp.ones(draws), jnp.full(draws, 4.0),
                                                                    jnp.ones(draws, bool))), repeats)
    result["backtrack"] = _time(run(lambda s: ops.backtrack(s, idx, jnp.ones(draws, bool), 1.0, 0.0)), repeats)
    result["drop_prompts"] = _time(run(lambda s: ops.drop_prompts(s, solved)), repeats)
    return result


OPS = ("insert", "sample", "update_values", "backtrack", "drop_prompts")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="jaxrl-llm bench replay", description=__doc__.splitlines()[0])
    ap.add_argument("--capacities", default="1024,4096,16384,65536")
    ap.add_argument("--prefix", type=int, default=64)
    ap.add_argument("--candidates", type=int, default=256)
    ap.add_argument("--draws", type=int, default=8)
    ap.add_argument("--prompts", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--out", default="")
    args = ap.parse_args(argv)
    caps = [int(c) for c in args.capacities.split(",")]
    rows = [measure(c, args.prefix, args.candidates, args.draws, args.prompts, args.repeats) for c in caps]
    base = rows[0]["capacity"] * math.log2(rows[0]["capacity"])
    print(f"replay array, prefix {args.prefix} tokens, {args.candidates} candidates, {args.draws} draws, "
          f"{jax.devices()[0].platform}: ms per call (cost / (C log2 C), 1 at C={caps[0]})")
    print("| capacity | " + " | ".join(OPS) + " |")
    print("|---|" + "---|" * len(OPS))
    for r in rows:
        scale = r["capacity"] * math.log2(r["capacity"]) / base
        cells = [f"{r[op]:.2f} ({r[op] / rows[0][op] / scale:.2f})" for op in OPS]
        print(f"| {r['capacity']:,} | " + " | ".join(cells) + " |")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "rows": rows}, f, indent=2)
    return 0
