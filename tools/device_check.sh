#!/usr/bin/env bash
# Accelerator check in a few minutes, nothing downloaded (the device machine has no network): sampler
# decode tokens/s and its fraction of the HBM-bandwidth roofline, the RL update's MFU in bf16, and a
# short toy run's time (jaxrl_llm/bench/device_check.py). Uses the .venv already set up on the machine
# (or the python on PATH); writes the figures to $OUT/device_check.json when OUT is set.
#   bash tools/device_check.sh [--quick]
set -euo pipefail
cd "$(dirname "$0")/.."
py=.venv/bin/python
[ -x "$py" ] || py=python3
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1
exec timeout 360 "$py" -m jaxrl_llm.bench.device_check ${OUT:+--json "$OUT/device_check.json"} "$@"
