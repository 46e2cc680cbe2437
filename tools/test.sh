#!/usr/bin/env bash
# Sets up .venv with the test extras (torch CPU oracle included) and runs the suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh test
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1
exec .venv/bin/python -m pytest -n "${PYTEST_WORKERS:-2}" "$@"
