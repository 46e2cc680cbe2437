"""One training step's phases with the shared-prefix path on and off, on the same batch.

Builds the run of `--config` (model, data, reward pool), draws the first batch of prompts, and for
each layout (`rollout.shared_prefix` true: contexts prefilled once in sampling and encoded once in
the update; false: every row carries its prompt) times sampling, rewards and the update (best of
`--repeats` after a warm-up call that compiles), reads XLA's memory analysis of the compiled update
program, and counts the step's model FLOPs (2 x matmul parameters per position forward, 3x that for
forward + backward; attention scores left out) against this machine's measured float32 matmul rate.
Both layouts update on the same rows (the sampler draws the same tokens with either prefill), in
micro-batches of algo.micro_batch rows, unless `--unshared-micro-batch` gives the plain layout its own
(for configs whose micro-batch the plain layout cannot hold in memory: it keeps every row's context).

    jaxrl-llm bench step --config configs/default.yaml
    jaxrl-llm bench step --config configs/bench_long_prompt.yaml --repeats 1 --unshared-micro-batch 4
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
import time

import numpy as np

_GIB = 1024 ** 3


def matmul_gflops(n: int = 2048, repeats: int = 5) -> float:
    """Best float32 matmul rate of this machine through XLA (GFLOP/s)."""
    import jax
    import jax.numpy as jnp

    a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
    f = jax.jit(lambda x, y: x @ y)
    f(a, a).block_until_ready()
    best = min(_timed(lambda: f(a, a).block_until_ready()) for _ in range(repeats))
    return 2 * n ** 3 / best / 1e9


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _matmul_params(model_cfg) -> tuple[int, int]:
    """(parameters in the layers' matmuls, parameters of the head): multiply-adds per position."""
    c = model_cfg
    attn = c.hidden_size * c.head_dim * (2 * c.num_heads + 2 * c.num_kv_heads)
    mlp = 3 * c.hidden_size * c.intermediate_size
    return c.num_layers * (attn + mlp), c.hidden_size * c.vocab_size


def _model_flops(model_cfg, positions_body: int, positions_head: int, factor: int) -> float:
    body, head = _matmul_params(model_cfg)
    return factor * 2.0 * (body * positions_body + head * positions_head)


def _update_positions(batch, shared: bool) -> tuple[int, int]:
    """(positions through the layers, positions through the head) of one update call."""
    if shared:
        body = int(batch.ctx_tokens.size + batch.tokens.size - batch.tokens.shape[0] * batch.tokens.shape[1])
        return body, int(batch.tokens.size)
    n, length = batch.tokens.shape
    return n * (length - 1), n * (length - 1)


def bench(cfg, repeats: int, log=print, unshared_micro_batch: int | None = None) -> dict:
    import jax

    from jaxrl_llm.model import lora
    from jaxrl_llm.plan.program import analyse_update
    from jaxrl_llm.rl.batch import shapes
    from jaxrl_llm.rl.spec import loss_coefs, minibatch, rows_per_update, update_spec
    from jaxrl_llm.rl.update import init_optimizer, make_update
    from jaxrl_llm.sampling.sampler import Sampler
    from jaxrl_llm.train.loop import Run
    from jaxrl_llm.train.rollout import collect, update_rows
    from jaxrl_llm.train.state import PHASE_ROLLOUT

    run = Run(cfg, log=log)
    per_minibatch = rows_per_update(cfg)
    if unshared_micro_batch is not None and (unshared_micro_batch < 1 or per_minibatch % unshared_micro_batch):
        raise ValueError(f"--unshared-micro-batch {unshared_micro_batch} must divide the {per_minibatch} rows of "
                         "a minibatch")
    model_cfg, graphdef = run.policy.model_cfg, run.policy.graphdef
    prompts = [run.train_items[i] for i in next(run.data)]
    key = run.key(PHASE_ROLLOUT, 0)
    idx = np.arange(per_minibatch)
    out: dict = {"config": cfg.train.out_dir, "rows": run.rows, "matmul_gflops": matmul_gflops()}
    tokens_seen = None
    coefs = loss_coefs(cfg)
    with run.reward_pool() as pool:
        for shared in (True, False):
            name = "shared" if shared else "unshared"
            sampler = Sampler(graphdef, pad_id=run.sampler.pad_id, stop_ids=run.sampler.stop_ids,
                              max_cache_len=run.sampler.max_cache_len, mesh=run.mesh, share_prefill=shared)
            params = run.sampling_params()
            rollouts, m = collect(sampler, params, pool, run.tok, cfg, prompts, key)  # compiles
            sample_s, reward_s = [], []
            for _ in range(repeats):
                rollouts, m = collect(sampler, params, pool, run.tok, cfg, prompts, key)
                sample_s.append(m["time_sample_s"])
                reward_s.append(m["time_reward_s"])
            if tokens_seen is None:
                tokens_seen = rollouts.out.tokens
            elif not np.array_equal(tokens_seen, rollouts.out.tokens):
                raise AssertionError("shared and unshared prefill sampled different tokens")
            full = update_rows(rollouts)
            ucfg = cfg
            if not shared and unshared_micro_batch:
                ucfg = dataclasses.replace(cfg, algo=dataclasses.replace(cfg.algo, micro_batch=unshared_micro_batch))
            batch = minibatch(ucfg, full, idx, shared)
            spec = update_spec(ucfg, shared)
            policy = run.state.params
            # the reference at the start of RL: the policy itself (with LoRA: its adapters, over the same base)
            ref = (lora.trainable(policy),) if spec.use_kl else ()
            opt_state = init_optimizer(run.optimizer, policy, run.mesh)
            update = make_update(graphdef, spec, run.optimizer, policy, opt_state, run.mesh)
            # the program the timed calls run, compiled ahead, with XLA's analyses
            mem = analyse_update(update, ucfg, policy, opt_state, batch, shared)
            copy = lambda tree: jax.tree.map(lambda x: x.copy(), tree)  # noqa: E731
            fresh = lambda: (copy(policy), copy(opt_state))  # noqa: E731
            p, o = fresh()
            jax.block_until_ready(update(p, o, batch, coefs, *ref))
            update_s = []
            for _ in range(repeats):
                p, o = fresh()
                jax.block_until_ready(p)
                update_s.append(_timed(lambda: jax.block_until_ready(update(p, o, batch, coefs, *ref))))
            body, head = _update_positions(batch, shared)
            on = rollouts.out
            contexts = len({tuple(ids) for _, ids in prompts}) if shared else run.rows  # rows prefilled
            prefill = contexts * sampler.shapes(run.rows, int(on.context_len.max()), cfg.rollout.max_new_tokens)[1]
            decoded = int(on.num_generated.sum())
            r = {"sample_s": min(sample_s), "reward_s": min(reward_s), "update_s": min(update_s),
                 "update_peak_gib": mem.peak / _GIB, "update_temp_gib": mem.memory.temp_size_in_bytes / _GIB,
                 "update_positions": body, "update_head_positions": head,
                 "update_model_gflop": _model_flops(model_cfg, body, head, 3) / 1e9,
                 "sample_model_gflop": _model_flops(model_cfg, prefill + decoded, run.rows + decoded, 1) / 1e9,
                 "micro_batch_rows": ucfg.algo.micro_batch, "batch_shapes": shapes(batch)}
            r["step_s"] = r["sample_s"] + r["reward_s"] + r["update_s"]
            r["update_gflops"] = r["update_model_gflop"] / r["update_s"]
            out[name] = r
            log(f"{name}: {json.dumps({k: v for k, v in r.items() if k != 'batch_shapes'})}")
    s, u = out["shared"], out["unshared"]
    out["ratios"] = {k: s[k] / u[k] for k in ("step_s", "sample_s", "update_s", "update_peak_gib",
                                               "update_model_gflop", "sample_model_gflop")}
    return out


def table(out: dict) -> str:
    s, u, r = out["shared"], out["unshared"], out["ratios"]
    rows = [("step (sample + reward + update), s", "step_s", "{:.2f}"), ("sampling, s", "sample_s", "{:.2f}"),
            ("update, s", "update_s", "{:.2f}"), ("update peak memory (XLA), GiB", "update_peak_gib", "{:.3f}"),
            ("update model GFLOP", "update_model_gflop", "{:.1f}"),
            ("sampling model GFLOP", "sample_model_gflop", "{:.1f}")]
    lines = ["| | unshared | shared | shared / unshared |", "|---|---|---|---|",
             f"| micro-batch, rows | {u['micro_batch_rows']} | {s['micro_batch_rows']} | |"]
    for label, k, fmt in rows:
        lines.append(f"| {label} | {fmt.format(u[k])} | {fmt.format(s[k])} | {r[k]:.2f} |" if k in r else
                     f"| {label} | {fmt.format(u[k])} | {fmt.format(s[k])} | |")
    lines.append(f"| update rate, model GFLOP/s (matmul rate {out['matmul_gflops']:.0f}) | "
                 f"{u['update_gflops']:.0f} ({u['update_gflops'] / out['matmul_gflops']:.0%}) | "
                 f"{s['update_gflops']:.0f} ({s['update_gflops'] / out['matmul_gflops']:.0%}) | |")
    return "\n".join(lines)


def main(argv=None) -> int:
    from jaxrl_llm.config import load_config

    parser = argparse.ArgumentParser(prog="jaxrl-llm bench step", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, metavar="YAML", help="run config whose step to time")
    parser.add_argument("overrides", nargs="*", metavar="a.b=value", help="config overrides")
    parser.add_argument("--repeats", type=int, default=2, help="timed calls per phase (best is kept)")
    parser.add_argument("--json", default=None, help="also write the figures to this file")
    parser.add_argument("--unshared-micro-batch", type=int, default=None, metavar="ROWS",
                        help="micro-batch rows of the plain layout (default: algo.micro_batch, as the shared one)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_config(args.config, list(args.overrides) + [f"train.out_dir={tmp}", "train.tensorboard=false",
                                                                "train.resume=false"])
        out = bench(cfg, args.repeats, unshared_micro_batch=args.unshared_micro_batch)
    print(table(out))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    return 0
