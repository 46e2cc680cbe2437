"""Where one decode step's time goes: the step as the sampler runs it, and each of its parts as a program of its
own, at decode shapes (B rows, one new token each, a cache of S slots), in float32 and in bfloat16.

Parts: choosing the token from the logits (greedy and sampled), the output head, the layers (all of them, no
head), and within one layer the projections (q, k, v, o), the cache write, attention over the cache, the MLP
and the two norms with RoPE. Each part is timed alone (best of `--repeats` runs of `--iters` calls, each call
blocked on), so parts do not sum exactly to the step: the step is one program that XLA fuses across them.
GFLOP/s is reported for the matmul parts (2 x multiply-adds / time).

    jaxrl-llm bench decode                                  # SmolLM2-135M-Instruct, 16 rows, 640 slots
    jaxrl-llm bench decode --rows 16 --slots 128,640 --dtypes float32,bfloat16
"""

from __future__ import annotations

import argparse
import platform
import time

import numpy as np

from jaxrl_llm.utils.cpu import BF16_FLAGS, cpu_flags


def _time(fn, args, iters: int, repeats: int, carry: int | None = None) -> float:
    """Seconds per call: best over `repeats` runs of `iters` calls (compiled and warmed first). `carry`: the
    argument (a KV cache) that the call updates; it is donated and the call's second output fed back in its
    place, so the cache is written in place as in the sampler's loop (not copied every call)."""
    import jax

    args = list(args)

    def call():
        out = fn(*args)
        if carry is not None:
            args[carry] = out[1]
        return out

    jax.block_until_ready(call())
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(iters):
            out = call()
        jax.block_until_ready(out)
        best = min(best, (time.perf_counter() - t0) / iters)
    return best


def profile(model, rows: int, slots: int, dtype: str, iters: int, repeats: int) -> list[dict]:
    """[{part, ms, gflop, gflops}] for one decode step of `rows` rows over a cache of `slots` slots."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from jaxrl_llm.model import attention
    from jaxrl_llm.model.transformer import KVCache, dot, rope, rope_angles
    from jaxrl_llm.rl.forward import cast_floats
    from jaxrl_llm.sampling.decode import RowSettings, RowState, cache_dtype, decode_step
    from jaxrl_llm.sampling.processors import choose_tokens

    cfg = model.cfg
    dt = jnp.dtype(dtype)
    graphdef, state = nnx.split(model)
    state = jax.jit(lambda s: cast_floats(s, dt))(state)
    m = nnx.merge(graphdef, state)
    b, d, f, v = rows, cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
    h, k, e, n_layers = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.num_layers
    rng = np.random.RandomState(0)
    fill = slots // 2  # rows sit halfway through the cache (the mask hides the rest; dense work is the same)
    cache = KVCache.zeros(cfg, b, slots, dtype=cache_dtype(dt))
    cache = KVCache([x + jnp.asarray(rng.normal(size=x.shape), dt) for x in cache.keys],
                    [x + jnp.asarray(rng.normal(size=x.shape), dt) for x in cache.values])
    pos = jnp.full((b,), fill, jnp.int32)
    tok = jnp.asarray(rng.randint(0, v, size=b), jnp.int32)
    logits = jnp.asarray(rng.normal(size=(b, v)) * 3, jnp.float32)
    x = jnp.asarray(rng.normal(size=(b, 1, d)), dt)
    temps = {"greedy": jnp.zeros((b,), jnp.float32), "sampled": jnp.full((b,), 0.7, jnp.float32)}
    keys = jax.random.key_data(jax.random.split(jax.random.key(0), b))
    ones, zeros_i = jnp.ones((b,), jnp.float32), jnp.zeros((b,), jnp.int32)

    parts = []
    fresh = jax.jit(lambda c: jax.tree.map(lambda a: a + 0, c))  # a copy for each call that updates it in place

    def add(name, fn, args, flop=0.0, carry=None):
        jitted = jax.jit(fn, donate_argnums=() if carry is None else (carry,))
        s = _time(jitted, args, iters, repeats, carry)
        parts.append(dict(part=name, ms=s * 1e3, gflop=flop / 1e9, gflops=flop / s / 1e9 if flop else None))

    # the whole step, as sampler.py's loop body runs it (sampled at T=0.7)
    def step(st, cache, logits, temp):
        mm = nnx.merge(graphdef, st)
        settings = RowSettings(jnp.full((b,), 10 ** 6, jnp.int32), temp, ones, zeros_i, keys)
        rs = RowState(jnp.zeros((b, slots), jnp.int32), jnp.zeros((b, slots)), jnp.zeros((b, slots)), cache,
                      logits, pos, zeros_i, jnp.zeros((b,), bool), zeros_i)
        out = decode_step(mm, settings, jnp.asarray([-1], jnp.int32), rs)
        return out.logits, out.cache

    weights_flop = 2.0 * b * (n_layers * (d * (h + 2 * k) * e + h * e * d + 3 * d * f) + d * v)
    attn_flop = 2.0 * b * n_layers * 2 * h * e * slots
    add("step (sampled, T=0.7)", step, (state, fresh(cache), logits, temps["sampled"]), weights_flop + attn_flop,
        carry=1)

    def choose(lg, t):
        return choose_tokens(lg, t, ones, zeros_i, jax.random.wrap_key_data(keys))

    for name, t in temps.items():
        add(f"choose token ({name})", choose, (logits, t))

    def layers(st, tok, cache):
        mm = nnx.merge(graphdef, st)
        hidden, cache = mm(tok[:, None], pos[:, None], cache)
        return hidden, cache

    add(f"{n_layers} layers (no head)", layers, (state, tok, fresh(cache)),
        weights_flop - 2.0 * b * d * v + attn_flop, carry=2)
    add("head (logits)", lambda st, hid: nnx.merge(graphdef, st).logits(hid), (state, x[:, 0]), 2.0 * b * d * v)

    blk = m.layers[0]
    lgd, lst = nnx.split(blk)
    cos_sin = rope_angles(pos[:, None], e, cfg.rope_theta, cfg.rope_scaling)
    ck, cv = cache.keys[0], cache.values[0]

    def proj(st, x):
        a = nnx.merge(lgd, st).attn
        return dot("btd,dhe->bthe", x, a.q[...]), dot("btd,dke->btke", x, a.k[...]), dot("btd,dke->btke", x, a.v[...])

    def oproj(st, o):
        w = nnx.merge(lgd, st).attn.o[...]
        return dot("btf,fd->btd", o.reshape(b, 1, h * e), w.reshape(h * e, d))

    def write(kv, kk, vv):
        r = jnp.arange(b)[:, None]
        return None, (kv[0].at[r, :, :, pos[:, None]].set(kk), kv[1].at[r, :, pos[:, None]].set(vv))

    def attend(q, ck, cv):
        g = h // k
        q_bkqe = q.reshape(b, 1, k, g, e).transpose(0, 2, 1, 3, 4).reshape(b, k, g, e)
        kpos = jnp.broadcast_to(jnp.arange(slots), (b, slots))
        return attention.dense(q_bkqe, ck, cv, jnp.repeat(pos[:, None], g, axis=1), kpos, None)

    def norms_rope(st, x, q, kk):
        blk = nnx.merge(lgd, st)
        return blk.attn_norm(x), blk.mlp_norm(x), rope(q, cos_sin), rope(kk, cos_sin)

    q = jnp.asarray(rng.normal(size=(b, 1, h, e)), dt)
    kk = jnp.asarray(rng.normal(size=(b, 1, k, e)), dt)
    vv = jnp.asarray(rng.normal(size=(b, 1, k, e)), dt)
    o = jnp.asarray(rng.normal(size=(b, 1, h, e)), dt)
    per = " (one layer)"
    add("layer: q, k, v projections" + per, proj, (lst, x), 2.0 * b * d * (h + 2 * k) * e)
    add("layer: o projection" + per, oproj, (lst, o), 2.0 * b * h * e * d)
    add("layer: cache write" + per, write, (fresh((ck, cv)), kk, vv), carry=0)
    add("layer: attention over the cache" + per, attend, (q, ck, cv), 2.0 * b * 2 * h * e * slots)
    add("layer: MLP" + per, lambda st, x: nnx.merge(lgd, st).mlp(x), (lst, x), 2.0 * b * 3 * d * f)
    add("layer: 2 norms + RoPE" + per, norms_rope, (lst, x, q, kk))
    return parts


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="jaxrl-llm bench decode", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--slots", default="640", help="cache lengths, comma-separated")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    import jax

    from jaxrl_llm.model.hf_io import load_hf_folder
    from jaxrl_llm.model.registry import resolve

    model, _ = load_hf_folder(resolve(args.model), param_dtype="float32")
    flags = " ".join(sorted(cpu_flags() & {"avx512f", "amx_tile", *BF16_FLAGS})) or "no bf16 flags"
    print(f"{args.model}, {args.rows} rows, one token each; {platform.processor() or platform.machine()} ({flags}), "
          f"{jax.devices()[0].platform}, jax {jax.__version__}")
    for slots in (int(s) for s in args.slots.split(",")):
        results = {dt: profile(model, args.rows, slots, dt, args.iters, args.repeats) for dt in args.dtypes.split(",")}
        dts = list(results)
        print(f"\n{slots} cache slots")
        print("| part | " + " | ".join(f"{dt} ms | {dt} GFLOP/s" for dt in dts) + " |")
        print("|---|" + "---|---|" * len(dts))
        for i, p in enumerate(results[dts[0]]):
            cells = []
            for dt in dts:
                r = results[dt][i]
                cells += [f"{r['ms']:.3f}", f"{r['gflops']:.0f}" if r["gflops"] else ""]
            print(f"| {p['part']} | " + " | ".join(cells) + " |")
    print(f"\ncommand: jaxrl-llm bench decode --model {args.model} --rows {args.rows} --slots {args.slots} "
          f"--dtypes {args.dtypes} --iters {args.iters} --repeats {args.repeats}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
