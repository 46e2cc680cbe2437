#!/usr/bin/env bash
# Idempotent set-up: a project-local virtual environment in .venv with the package installed editable.
# Installs again only when pyproject.toml changed, or when extras are asked for that the last install
# lacked (`tools/test.sh` installs the test extras; `tools/run.sh` afterwards installs nothing).
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
py="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$py" -m venv .venv
stamp=".venv/.jaxrl-llm-installed"
want="$(sha256sum pyproject.toml | cut -d' ' -f1)"
[ -f "$stamp" ] && read -r have_sha have_extras < "$stamp"
if [ "${have_sha:-}" != "$want" ] || { [ -n "$extras" ] && [ "${have_extras:-}" != "$extras" ]; }; then
  echo "setting up .venv${extras:+ with the $extras extras} (pip) ..."
  .venv/bin/python -m pip install -q --upgrade pip
  # setuptools warns on every editable install that a folder named like the package may shadow it: it is the package
  PYTHONWARNINGS=ignore .venv/bin/python -m pip install -q -e ".${extras:+[$extras]}"
  echo "$want $extras" > "$stamp"
fi
