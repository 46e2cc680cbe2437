"""Our sampler against tunix's on SmolLM2-135M-Instruct: the same prompts (natural text, tokenized once by the
model's tokenizer), greedy, float32, every row generating `--new` tokens; new tokens/s (best of `--repeats` timed
calls after a warm-up call each) and the share of greedy tokens that agree.

tunix's own dependencies are heavy (tensorflow-datasets, metrax, kagglehub, ...); its sampler and Llama model need
only a few, so they go into a folder of their own and tunix's package __init__ (which imports its trainers) is
skipped:

    .venv/bin/pip install --target /tmp/tunix --no-deps google-tunix==0.1.7 jaxtyping wadler_lindig sentencepiece
    TUNIX_PATH=/tmp/tunix .venv/bin/python tools/bench_vs_tunix.py --new 512 --repeats 2
"""

from __future__ import annotations

import argparse
import os
import sys
import types

import numpy as np

TEXT = ("The history of mathematics is the study of the origin of discoveries in mathematics and the methods and "
        "notation of the past. Before the modern age and the worldwide spread of knowledge, written examples of new "
        "mathematical developments have come to light only in a few locales. Explain, step by step, how the ancient "
        "Babylonians computed square roots, then check the method on the number two and on the number ten.")


def _tunix():
    path = os.environ.get("TUNIX_PATH")
    if not path:
        raise SystemExit("set TUNIX_PATH to the folder tunix was installed into (see this file's docstring)")
    sys.path.append(path)
    pkg = types.ModuleType("tunix")  # tunix/__init__.py imports its trainers and their dependencies: skipped
    pkg.__path__ = [os.path.join(path, "tunix")]
    sys.modules["tunix"] = pkg
    from tunix.generate import sampler as tunix_sampler
    from tunix.models.llama3 import model as tunix_model
    from tunix.models.llama3 import params as tunix_params

    return tunix_sampler, tunix_model, tunix_params


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--new", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args(argv)
    tunix_sampler, tunix_model, tunix_params = _tunix()
    import jax
    import jax.numpy as jnp
    from transformers import AutoTokenizer

    from jaxrl_llm.bench.sampler_bench import best_of
    from jaxrl_llm.model.hf_io import load_hf_folder
    from jaxrl_llm.model.registry import resolve
    from jaxrl_llm.sampling.sampler import Sampler

    folder = resolve("smollm2-135m-instruct")
    tok = AutoTokenizer.from_pretrained(folder)
    words = TEXT.split()
    prompts = [" ".join(words[i % 7:] + words[:i % 7]) for i in range(args.batch)]  # rows differ, same length
    ids = [tok.encode(p) for p in prompts]
    never = tok.vocab_size + 7  # a stop id no row can draw: every row generates --new tokens

    ours_model, mc = load_hf_folder(folder, param_dtype="float32")
    ours, state = Sampler.for_model(ours_model, pad_id=tok.pad_token_id or 0, stop_ids=())

    def run_ours():
        return ours(state, ids, max_new_tokens=args.new, temperature=0.0, key=jax.random.key(0))

    cfg = tunix_model.ModelConfig(num_layers=mc.num_layers, vocab_size=mc.vocab_size, embed_dim=mc.hidden_size,
                                  hidden_dim=mc.intermediate_size, num_heads=mc.num_heads, head_dim=mc.head_dim,
                                  num_kv_heads=mc.num_kv_heads, rope_theta=int(mc.rope_theta), norm_eps=mc.rms_norm_eps,
                                  weight_tying=mc.tie_embeddings)
    theirs_model = tunix_params.create_model_from_safe_tensors(str(folder), cfg, dtype=jnp.float32)
    longest = max(len(x) for x in ids)
    # tunix pads the prompts to a power of two and needs prompt + steps below the cache size
    cache = tunix_sampler.CacheConfig(cache_size=(1 << (longest - 1).bit_length()) + args.new + 8,
                                      num_layers=mc.num_layers, num_kv_heads=mc.num_kv_heads, head_dim=mc.head_dim)
    theirs = tunix_sampler.Sampler(theirs_model, tok, cache)

    def run_theirs():
        return theirs(prompts, max_generation_steps=args.new, max_prompt_length=longest, temperature=0.0,
                      eos_tokens=[never], echo=False)

    results = {}
    for name, fn in (("jaxrl-llm", run_ours), ("tunix", run_theirs)):
        out = fn()  # compile / warm up (greedy: every call returns these tokens)
        results[name] = (best_of(fn, args.repeats), out)
    ours_tokens = np.stack([results["jaxrl-llm"][1].generated(i)[:args.new] for i in range(args.batch)])
    theirs_tokens = [np.asarray(t)[:args.new] for t in results["tunix"][1].tokens]
    n = min(min(len(t) for t in theirs_tokens), args.new)
    agree = float(np.mean(ours_tokens[:, :n] == np.stack([t[:n] for t in theirs_tokens])))
    print(f"\nSmolLM2-135M-Instruct, batch {args.batch}, prompts {min(map(len, ids))}-{longest} tokens, {args.new} new "
          f"tokens, greedy, float32, {jax.devices()[0].platform}, jax {jax.__version__}")
    print("| sampler | new tok/s | time (s) |\n|---|---|---|")
    for name, (t, _) in results.items():
        print(f"| {name} | {args.batch * args.new / t:,.0f} | {t:.1f} |")
    print(f"\nours / tunix: {results['tunix'][0] / results['jaxrl-llm'][0]:.2f}x; greedy tokens equal over the first "
          f"{n}: {agree:.1%}")
    print(f"command: TUNIX_PATH=... .venv/bin/python tools/bench_vs_tunix.py --batch {args.batch} --new {args.new} "
          f"--repeats {args.repeats}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
