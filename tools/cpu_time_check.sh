#!/usr/bin/env bash
# Is a run's CPU time (metrics.jsonl's cpu_step_s / cpu_eval_s, the ablation report's "CPU s") steadier than its
# wall time when other jobs share the machine? The same toy run (SFT 100 steps, 60 RL steps, seed 0) twice:
# first as it is, then beside two busy loops at normal priority. Prints both runs' sums (docs/ablations.md).
#   bash tools/cpu_time_check.sh [out_dir]      (about 4 min on a 2-core CPU)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-runs/measure/cpu_time}
PY=${PY:-.venv/bin/python}
common=(--config configs/toy.yaml sft.steps=100 train.steps=60 eval.every=60 train.checkpoint_every=60
        train.export_final=false)
rm -rf "$out/alone" "$out/busy" && mkdir -p "$out"
$PY -m jaxrl_llm.cli train "${common[@]}" "train.out_dir=$out/alone" > "$out/alone.log" 2>&1
pids=()
for _ in 1 2; do $PY -c "while True: pass" & pids+=($!); done
trap 'kill "${pids[@]}" 2>/dev/null || true' EXIT
$PY -m jaxrl_llm.cli train "${common[@]}" "train.out_dir=$out/busy" > "$out/busy.log" 2>&1
kill "${pids[@]}"
$PY - "$out" <<'PYEOF'
import json, sys
from pathlib import Path
for name in ("alone", "busy"):
    rows = [json.loads(ln) for ln in (Path(sys.argv[1]) / name / "metrics.jsonl").read_text().splitlines()]
    tr = [r for r in rows if r["kind"] == "train"]
    ev = [r for r in rows if r["kind"] == "eval"]
    print(f"{name:5s} {len(tr)} RL steps: wall {sum(r['time_step_s'] for r in tr):6.1f} s, "
          f"CPU {sum(r['cpu_step_s'] for r in tr):6.1f} s; "
          f"evaluations: wall {sum(r['time_eval_s'] for r in ev):5.1f} s, "
          f"CPU {sum(r['cpu_eval_s'] for r in ev):5.1f} s; last reward_mean {tr[-1]['reward_mean']:.4f}")
PYEOF
