"""New tokens/s of our sampler alone on SmolLM2-135M-Instruct (16 rows, 64-token random prompts, greedy), best of two
calls after a warm-up: quick enough to alternate two checkouts in one window (the bf16 before/after of
docs/benchmarks.md). `jaxrl-llm bench sampler` compares against transformers as well.

    PYTHONPATH=. .venv/bin/python tools/sampler_tok_s.py bfloat16 128 LABEL
"""

import sys

import jax
import numpy as np

from jaxrl_llm.bench.sampler_bench import best_of
from jaxrl_llm.model.hf_io import load_hf_folder
from jaxrl_llm.model.registry import resolve
from jaxrl_llm.sampling.sampler import Sampler

dtype, new, label = sys.argv[1], int(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else ""
model, _ = load_hf_folder(resolve("smollm2-135m-instruct"), param_dtype=dtype)
prompts = np.random.RandomState(0).randint(3, model.cfg.vocab_size, size=(16, 64)).tolist()
sampler, state = Sampler.for_model(model, pad_id=0, stop_ids=())


def run():
    return sampler(state, prompts, max_new_tokens=new, temperature=0.0, key=jax.random.key(0))


run()  # compile
best = best_of(run, 2)
print(f"{label} {dtype}: {16 * new / best:.0f} new tok/s", flush=True)
