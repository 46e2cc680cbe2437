"""`jaxrl-llm` command line: train, sft, eval, export, sample, prepare-model, bench, ablate, ablate-check,
ablate-ci."""

from __future__ import annotations

import argparse
import sys
import time

from jaxrl_llm.hub import offline_unless_reachable


def _cmd_prepare(args) -> int:
    from jaxrl_llm.model.registry import prepare

    print(prepare(args.name))
    return 0


def _cmd_sample(args) -> int:
    import jax
    import numpy as np

    from jaxrl_llm.model.hf_io import load_hf_folder
    from jaxrl_llm.model.registry import resolve
    from jaxrl_llm.model.tokenizer import encode_chat, load_tokenizer, pad_id, stop_ids
    from jaxrl_llm.sampling.sampler import FINISH_STOP, Sampler
    from jaxrl_llm.utils import compile_counter

    folder = resolve(args.model)
    model, cfg = load_hf_folder(folder, param_dtype=args.dtype)
    tok = load_tokenizer(folder)
    messages = ([{"role": "system", "content": args.system}] if args.system else []) + \
        [{"role": "user", "content": args.prompt}]
    ids = encode_chat(tok, messages) if not args.raw else tok(args.prompt)["input_ids"]
    sampler, state = Sampler.for_model(model, pad_id=pad_id(tok), stop_ids=stop_ids(tok, cfg.eos_token_ids))
    key = jax.random.key(args.seed)
    t0 = time.perf_counter()
    out = sampler(state, [ids] * args.num_samples, max_new_tokens=args.max_new_tokens,
                  temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, key=key)
    t1 = time.perf_counter()
    for i in range(args.num_samples):
        reason = "stop" if out.finish_reason[i] == FINISH_STOP else "length"
        text = tok.decode(out.generated(i), skip_special_tokens=True)
        print(f"--- sample {i} ({out.num_generated[i]} tokens, {reason}) ---\n{text}")
    total = int(np.sum(out.num_generated))
    print(f"[{folder.name}] {total} new tokens in {t1 - t0:.2f}s (first call includes compilation; "
          f"{compile_counter.compilations()} programs compiled)", file=sys.stderr)
    return 0


def _load_cfg(args, extra=()):
    from jaxrl_llm.config import load_config

    return load_config(args.config, list(args.overrides) + list(extra))


def _cmd_train(args) -> int:
    from jaxrl_llm.parallel.distributed import initialize_from_env
    from jaxrl_llm.train.loop import Run
    from jaxrl_llm.train.stop import RESUME_EXIT_CODE

    initialize_from_env()  # launch scripts say which processes make up the run
    run = Run(_load_cfg(args))
    run.train()
    return RESUME_EXIT_CODE if run.stopped else 0


def _cmd_sft(args) -> int:
    """Supervised training only: the configured sft steps, then export (no RL steps)."""
    from jaxrl_llm.train.loop import Run
    from jaxrl_llm.train.stop import RESUME_EXIT_CODE

    cfg = _load_cfg(args, ["train.steps=0"])
    if cfg.sft.steps == 0:
        raise ValueError("jaxrl-llm sft trains sft.steps supervised steps, and the config has sft.steps=0: give "
                         "sft.steps=N (and the reference answers it trains on: data.worked, or a reference column)")
    run = Run(cfg)
    run.train()
    return RESUME_EXIT_CODE if run.stopped else 0


def _cmd_eval(args) -> int:
    import json

    from jaxrl_llm.train.eval_cmd import command

    # read-only: no lock (a live run can be evaluated), nothing moved or written into the run's folder
    print(json.dumps(command(args, log=lambda m: print(m, file=sys.stderr)), indent=2))
    return 0


def _cmd_export(args) -> int:
    from jaxrl_llm.train.export import command

    print(command(args, log=lambda m: print(m, file=sys.stderr)))
    return 0


def _cmd_bench(args) -> int:
    if args.what == "sampler":
        from jaxrl_llm.bench.sampler_bench import main as bench_main
    elif args.what == "step":
        from jaxrl_llm.bench.step_bench import main as bench_main
    elif args.what == "decode":
        from jaxrl_llm.bench.decode_profile import main as bench_main
    elif args.what == "replay":
        from jaxrl_llm.bench.replay_bench import main as bench_main
    else:
        from jaxrl_llm.bench.memory import main as bench_main
    return bench_main(args.rest)


def main(argv=None) -> int:
    from jaxrl_llm.parallel.distributed import DistributedError

    parser = argparse.ArgumentParser(prog="jaxrl-llm", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    shown = argparse.ArgumentDefaultsHelpFormatter

    for name, fn, text in (("train", _cmd_train, "GRPO training (resumes from the run's latest checkpoint)"),
                           ("sft", _cmd_sft, "supervised warm start on reference answers only"),
                           ("eval", _cmd_eval, "evaluation of a run's checkpoint (or --model) on its task, "
                                               "every completion written out"),
                           ("export", _cmd_export, "a run's checkpoint as a Hugging Face folder")):
        p = sub.add_parser(name, help=text, description=text, formatter_class=shown)
        p.add_argument("--config", required=name != "eval", metavar="YAML",
                       help="run config, e.g. configs/default.yaml (SmolLM2 on CPU) or configs/toy.yaml")
        p.add_argument("overrides", nargs="*", metavar="a.b=value",
                       help="config overrides, e.g. train.steps=10 optim.lr=1e-5")
        p.set_defaults(fn=fn)
    from jaxrl_llm.train.cli_options import add_eval_arguments, add_export_arguments

    add_eval_arguments(sub.choices["eval"])
    add_export_arguments(sub.choices["export"])

    p = sub.add_parser("prepare-model", help="a local HF folder from a known short name, a .gguf file or a Hub id "
                                             "(org/name); a local folder is checked")
    p.add_argument("name")
    p.set_defaults(fn=_cmd_prepare)

    text = "sample chat completions from a model folder or short name"
    p = sub.add_parser("sample", help=text, description=text, formatter_class=shown)
    p.add_argument("--model", default="smollm2-135m-instruct", help="local HF folder or known short name")
    p.add_argument("--prompt", default="What is 12 + 35? Answer briefly.", help="the user message")
    p.add_argument("--system", default=None, help="optional system message")
    p.add_argument("--raw", action="store_true", help="encode the prompt as is, without the chat template")
    p.add_argument("--num-samples", type=int, default=2, help="completions to draw (one batch)")
    p.add_argument("--max-new-tokens", type=int, default=96, help="new tokens per completion at most")
    p.add_argument("--temperature", type=float, default=0.7, help="0 is greedy")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus mass kept (1: off)")
    p.add_argument("--top-k", type=int, default=0, help="most likely tokens kept (0: off)")
    p.add_argument("--seed", type=int, default=0, help="random seed of the draw")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32", help="parameter dtype")
    p.set_defaults(fn=_cmd_sample)

    p = sub.add_parser("bench", help="benchmarks: `bench sampler|decode|step|memory|replay --help`")
    p.add_argument("what", choices=("sampler", "decode", "step", "memory", "replay"),
                   help="sampler: ours vs transformers generate; decode: one decode step's time by part; step: a "
                        "training step's phases with the shared prefix on and off; memory: XLA's memory analysis of "
                        "the update")
    p.add_argument("rest", nargs=argparse.REMAINDER, help="the benchmark's own options")
    p.set_defaults(fn=_cmd_bench)
    from jaxrl_llm.ablate.command import add_commands as add_ablate_commands

    add_ablate_commands(sub)

    args = parser.parse_args(argv)  # --help and usage errors end here, before any network check
    if getattr(args, "hub", True):  # a command reading only local records (hub=False) asks nothing of the network
        offline_unless_reachable()  # before a command imports the HF libraries: they read HF_HUB_OFFLINE on import
    try:
        return args.fn(args)
    except (ValueError, FileNotFoundError, DistributedError) as e:
        print(f"jaxrl-llm: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
