"""The options of `jaxrl-llm eval` and `jaxrl-llm export` beside --config and the a.b=value overrides (what they
do: train/eval_cmd.py, train/export.py). Nothing heavy is imported here: every command line parses them."""

from __future__ import annotations

DTYPES = ("bfloat16", "float32", "float16")


def add_eval_arguments(p) -> None:
    """`jaxrl-llm eval`'s own options (beside --config and the a.b=value overrides)."""
    p.add_argument("--step", default=None, metavar="N|sft-N",
                   help="checkpoint of the run to evaluate: RL step N or sft-N; None: the newest intact one")
    p.add_argument("--model", default=None, metavar="PATH",
                   help="evaluate this model (HF folder, short name, prepared .gguf or Hub id) instead of a checkpoint")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="where completions.jsonl and summary.json go, never inside the run's folder; None: "
                        "eval_out/<run>-step<N> or eval_out/<model> in the current directory")
    p.add_argument("--temperature", type=float, nargs="+", default=None, metavar="T",
                   help="temperatures, one pass each, 0 greedy; None: 0, 1 and rollout.temperature")
    p.add_argument("--samples", type=int, default=None, help="samples per problem at T > 0; None: eval.samples")
    p.add_argument("--pass-k", type=int, nargs="+", default=None, metavar="K",
                   help="pass@k figures at T > 0; None: 1 2 4 8 16 up to --samples")
    p.add_argument("--max-new-tokens", type=int, default=None,
                   help="tokens per completion at most; None: eval.max_new_tokens, else rollout.max_new_tokens")


def add_export_arguments(p) -> None:
    p.add_argument("--step", default=None, metavar="N|sft-N",
                   help="checkpoint to export: RL step N or sft-N; None: the newest intact one")
    p.add_argument("--out", required=True, metavar="DIR", help="the HF folder to write (new or empty, outside the run)")
    p.add_argument("--dtype", choices=DTYPES, default="bfloat16", help="dtype of the exported weights")
    p.add_argument("--adapter", action="store_true",
                   help="a LoRA run (model.lora.rank > 0): write its adapter alone in PEFT's format (float32) "
                        "instead of the merged model")

