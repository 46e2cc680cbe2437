#!/usr/bin/env bash
# The memory plans of the larger machines' configs again, now that model.remat's savings show in XLA:CPU's
# analysis (jaxrl_llm/model/remat.py). One file per plan in this folder; a plan already written is skipped.
set -uo pipefail
cd "$(dirname "$0")/../../.."
out=tools/results/remat_plans
plan() {  # name config shape G [overrides...]  (shape and G "-": the config's own model, host memory)
  local name=$1 config=$2 shape=$3 g=$4; shift 4
  [ -s "$out/$name.txt" ] && return
  local args=(--plan --platform cpu --config "$config")
  [ "$shape" != - ] && args+=(--model-shape "$shape" train.device_memory_gib="$g")
  { echo "jaxrl-llm bench memory ${args[*]} $*"
    /usr/bin/time -f "%e s wall, %U s user" .venv/bin/jaxrl-llm bench memory "${args[@]}" "$@"; echo "rc $?"; } \
      > "$out/$name.tmp" 2>&1
  grep -v "huggingface.co did not answer" "$out/$name.tmp" > "$out/$name.txt"; rm -f "$out/$name.tmp"
}
plan default_full configs/default.yaml - - model.remat=true
plan default_lora configs/default.yaml - - model.remat=true model.lora.rank=16 model.lora.alpha=32
plan gpu_24gb_1.5b_lora configs/gpu_24gb_qwen2.5_1.5b_lora.yaml qwen2.5-1.5b 24
plan gpu_24gb_1.5b_lora_1024 configs/gpu_24gb_qwen2.5_1.5b_lora.yaml qwen2.5-1.5b 24 rollout.max_new_tokens=1024 algo.micro_batch=4
plan gpu_80gb_7b_lora configs/gpu_qwen2.5_7b_lora.yaml qwen2.5-7b 80
plan tpu_v5e-8_7b_lora configs/tpu_v5e-8_qwen2.5_7b_lora.yaml qwen2.5-7b 16
plan tpu_v5e-8_1.5b configs/tpu_qwen2.5_1.5b.yaml qwen2.5-1.5b 16
plan gpu_80gb_0.5b configs/gpu_qwen2.5_0.5b.yaml qwen2.5-0.5b 80
plan gpu_80gb_0.5b_mb8 configs/gpu_qwen2.5_0.5b.yaml qwen2.5-0.5b 80 algo.micro_batch=8
plan gpu_8x_7b configs/gpu_8x_qwen2.5_7b.yaml qwen2.5-7b 80
plan tpu_v5p-64_7b configs/tpu_v5p-64_qwen2.5_7b.yaml qwen2.5-7b 95
