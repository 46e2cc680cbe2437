#!/usr/bin/env bash
# How hard a task is for the starting policy of an ablation: SFT only (the config's sft.steps), then
# evaluate on TRAINING problems (eval.split=train): greedy, pass@1 at T = 1 and pass@k from eval.samples.
#   bash tools/task_start.sh CONFIG OUT_JSON [a.b=value ...]
set -euo pipefail
cd "$(dirname "$0")/.."
config=$1; out=$2; shift 2
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1
dir=runs/measure/$(basename "$out" .json)
.venv/bin/jaxrl-llm sft --config "$config" "$@" train.out_dir="$dir" train.export_final=false
.venv/bin/jaxrl-llm eval --config "$config" "$@" train.out_dir="$dir" eval.split=train | tee "$out"
