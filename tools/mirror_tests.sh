#!/usr/bin/env bash
# Moves each tests/test_*.py into tests/<package>/ after the package it tests (git mv), so that "where are X's
# tests" is answered by the folder names. Run once, from a clean tree, when nobody else is editing tests/:
#   bash tools/mirror_tests.sh            # move, fix paths, rename the shared helpers, collect
#   bash tools/mirror_tests.sh --dry-run  # print the moves only
# What it changes besides the moves:
#   - tests/<package>/__init__.py for each folder (tests/ is a package: test modules are tests.<package>.test_x,
#     two files may share a name in different folders, and `from tests.helpers import ...` works everywhere);
#   - in moved files, paths taken from __file__ gain one level (parents[1] -> parents[2], parent -> parents[1]);
#   - the shared helpers lose their leading underscore (tests/helpers.py and every test: _tiny_cfg -> tiny_cfg, ...);
#   - the GRPO reference's record command in its docstring (it is now a module under tests/train/).
# Nothing else needs to change: pyproject's testpaths stays ["tests"], conftest.py stays in tests/ (its hooks
# see every subfolder; SHARED_RUN_MODULES matches file names), tools/test.sh runs pytest on the whole tree.
set -euo pipefail
cd "$(dirname "$0")/.."

DRY=0
[[ "${1:-}" == "--dry-run" ]] && DRY=1

# package: its test files (tests of the repository itself stay in tests/: test_architecture, test_docs, test_launch)
declare -A MAP=(
  [model]="test_model_oracle test_model_loading test_gguf test_real_model test_bad_input"
  [sampling]="test_sampler_decode test_sampling_stats test_sharded_sampling test_shared_prefill test_processors"
  [rl]="test_rl_core test_shared_update"
  [rewards]="test_rewards test_reward_functions test_reward_sandbox test_rubric_rewards test_rubrics"
  [data]="test_datasets test_rubric_tasks"
  [explore]="test_e3 test_e3_core test_rrl test_rrl_core test_herl test_replay test_explore_correctness test_rows"
  [parallel]="test_multihost"
  [plan]="test_memory_plan"
  [train]="test_trainer test_grpo_reference test_checkpoint test_run_dir test_stop test_tracking test_eval_export
           test_evaluate test_revise_eval test_train_state"
  [bench]="test_step_bench test_memory_bench test_device_check"
  [ablate]="test_ablate test_controls test_intervals"
  [cli]="test_cli"
)
HELPERS="_tiny_cfg _train_rows _spawn_train _wait_for_row _sigterm_after_row _compilations _e3_cfg _rrl_cfg _truncate_data"

moved=()
for pkg in "${!MAP[@]}"; do
  for name in ${MAP[$pkg]}; do
    src="tests/$name.py"
    if [[ ! -f "$src" ]]; then
      echo "skip $src (not there)"
      continue
    fi
    echo "git mv $src tests/$pkg/$name.py"
    if (( ! DRY )); then
      mkdir -p "tests/$pkg"
      if [[ ! -f "tests/$pkg/__init__.py" ]]; then
        echo "\"\"\"Tests of jaxrl_llm.$pkg.\"\"\"" > "tests/$pkg/__init__.py"
        git add "tests/$pkg/__init__.py"
      fi
      git mv "$src" "tests/$pkg/$name.py"
      moved+=("tests/$pkg/$name.py")
    fi
  done
done
mapped=" ${MAP[*]} test_architecture test_docs test_launch "
for path in tests/test_*.py; do
  name=$(basename "$path" .py)
  [[ "$mapped" == *[[:space:]]"$name"[[:space:]]* ]] || echo "not mapped (stays in tests/; add it to MAP): $path"
done
(( DRY )) && exit 0

python3 - "$HELPERS" "${moved[@]}" <<'EOF'
import re
import sys
from pathlib import Path

helpers, moved = sys.argv[1].split(), [Path(p) for p in sys.argv[2:]]
for path in moved:  # one folder deeper: paths from __file__ gain one level
    text = path.read_text()
    text = re.sub(r"(Path\(__file__\)(?:\.resolve\(\))?)\.parents\[(\d)\]", lambda m: f"{m[1]}.parents[{int(m[2]) + 1}]", text)
    text = re.sub(r"(Path\(__file__\)(?:\.resolve\(\))?)\.parent\b(?!s)", r"\1.parents[1]", text)
    text = text.replace("`python tests/test_grpo_reference.py --record`",
                        "`python -m tests.train.test_grpo_reference --record`")
    path.write_text(text)
for path in sorted(Path("tests").rglob("*.py")):  # the shared helpers are public names of tests/helpers.py
    text = path.read_text()
    new = text
    for name in helpers:
        new = re.sub(rf"\b{name}\b", name[1:], new)
    if new != text:
        path.write_text(new)
EOF

.venv/bin/python -m pytest --collect-only -q -p no:cacheprovider tests | tail -3
