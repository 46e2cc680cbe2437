"""New tokens/s of our jitted sampler against transformers' PyTorch `generate` on the same weights.

Same batch, prompt length and new tokens; greedy; KV cache on both sides; stop tokens off so every
row generates exactly `--new` tokens. Compilation (ours) and the first call (theirs) are warm-up
and not timed; each side reports the best of `--repeats` timed calls.

    jaxrl-llm bench sampler                    # toy model and SmolLM2-135M-Instruct
    jaxrl-llm bench sampler --models toy
"""

from __future__ import annotations

import argparse
import platform
import tempfile
import time
from pathlib import Path

import numpy as np

TOY = dict(vocab_size=8192, hidden_size=256, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=4,
           num_key_value_heads=2, max_position_embeddings=1024, tie_word_embeddings=True)


def best_of(fn, repeats: int) -> float:
    """Seconds of `fn`'s fastest call of `repeats` (warm it up first)."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def _torch_model(name: str, workdir: Path, dtype: str = "float32"):
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    if name == "toy":
        torch.manual_seed(0)
        model = LlamaForCausalLM(LlamaConfig(**TOY))
        folder = workdir / "toy"
        model.save_pretrained(folder)
    else:
        from jaxrl_llm.model.registry import resolve

        folder = resolve(name)
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, local_files_only=True)
    return model.to(getattr(torch, dtype)).eval(), folder


def bench_one(name: str, batch: int, prompt_len: int, new: int, repeats: int, workdir: Path,
              dtype: str = "float32") -> dict:
    import jax
    import torch

    from jaxrl_llm.model.hf_io import load_hf_folder
    from jaxrl_llm.sampling.sampler import Sampler

    hf_model, folder = _torch_model(name, workdir, dtype)
    vocab = hf_model.config.vocab_size
    prompts = np.random.RandomState(0).randint(3, vocab, size=(batch, prompt_len))

    ours, _ = load_hf_folder(folder, param_dtype=dtype)  # as a run samples: weights in the compute dtype
    sampler, state = Sampler.for_model(ours, pad_id=0, stop_ids=())

    def run_ours():
        return sampler(state, prompts.tolist(), max_new_tokens=new, temperature=0.0, key=jax.random.key(0))

    ours_out = run_ours()  # compile
    t_ours = best_of(run_ours, repeats)

    input_ids = torch.tensor(prompts)
    kwargs = dict(max_new_tokens=new, min_new_tokens=new, do_sample=False, use_cache=True, pad_token_id=0,
                  attention_mask=torch.ones_like(input_ids))

    def run_hf():
        with torch.inference_mode():
            return hf_model.generate(input_ids, **kwargs)

    hf_out = run_hf()
    t_hf = best_of(run_hf, repeats)
    agree = float(np.mean(np.asarray(hf_out[:, prompt_len:]) ==
                          np.stack([ours_out.generated(i) for i in range(batch)])))
    n_tokens = batch * new
    return dict(model=name, ours=n_tokens / t_ours, hf=n_tokens / t_hf, ratio=t_hf / t_ours, agree=agree)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="jaxrl-llm bench sampler", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="toy,smollm2-135m-instruct")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--new", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"),
                        help="weights and compute on both sides (bfloat16: model.compute_dtype=bfloat16's sampling)")
    args = parser.parse_args(argv)
    import torch

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            rows.append(bench_one(name, args.batch, args.prompt_len, args.new, args.repeats, Path(tmp), args.dtype))
            print(f"done: {rows[-1]}", flush=True)
    cmd = (f"jaxrl-llm bench sampler --models {args.models} --batch {args.batch} --prompt-len {args.prompt_len} "
           f"--new {args.new} --repeats {args.repeats} --dtype {args.dtype}")
    print(f"\nbatch {args.batch}, prompt {args.prompt_len}, {args.new} new tokens, greedy, {args.dtype}; "
          f"{platform.processor() or platform.machine()}, torch threads {torch.get_num_threads()}")
    print("| model | jaxrl-llm new tok/s | transformers generate new tok/s | ratio | greedy tokens equal |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['ours']:,.0f} | {r['hf']:,.0f} | {r['ratio']:.2f}x | {r['agree']:.1%} |")
    print(f"\ncommand: {cmd}")
    return 0
