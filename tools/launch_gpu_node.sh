#!/usr/bin/env bash
# Train on one GPU node: one process drives every local GPU (JAX's single-controller mesh over them),
# restarted from its checkpoint whenever it stops for preemption (exit 75), until it finishes or fails.
# Ctrl-C / SIGTERM stop it cleanly: the trainer saves and the script exits (run it again to resume).
#
#   bash tools/launch_gpu_node.sh [--gpus 0,1,2,3] [--dry-run] -- CONFIG [a.b=value ...]
#   bash tools/launch_gpu_node.sh --dry-run -- configs/gpu_8x_qwen2.5_7b.yaml
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/launch_lib.sh
gpus=""
while [ $# -gt 0 ]; do
  case "$1" in
    --gpus) gpus=$2; shift 2 ;;
    --dry-run) DRY_RUN=1; shift ;;
    --) shift; break ;;
    *) echo "launch_gpu_node: unknown option $1 (see the header of $0)" >&2; exit 2 ;;
  esac
done
need_config "${1:-}"
export XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.92}  # the memory plan reads this limit
[ -n "$gpus" ] && export CUDA_VISIBLE_DEVICES=$gpus
run bash tools/setup.sh cuda
ARGS=("$@")
one() { run_child env HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 .venv/bin/jaxrl-llm train --config "${ARGS[@]}"; }
resume_loop one
