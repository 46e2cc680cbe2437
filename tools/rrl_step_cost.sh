#!/usr/bin/env bash
# RRL's cost per step on a quiet machine (issue 25's RRL control; its grid's wall times shared the CPU):
# GRPO and GRPO + RRL, 30 steps each from the control's warm start, the control's settings otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
TASK='data.task_args={min_terms: 7, max_terms: 7, min_digits: 1, max_digits: 1, operators: ["+", "-"], allow_parentheses: false, allow_negation: false}'
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1
mkdir -p runs/measure
[ -f runs/measure/toy_steps7_sft/final/config.json ] || $PY -m jaxrl_llm.cli sft --config configs/toy_steps.yaml \
  train.out_dir=runs/measure/toy_steps7_sft rollout.max_new_tokens=64 train.export_final=true "$TASK" > runs/measure/toy_steps7_sft.log 2>&1
for arm in grpo rrl; do
  extra=(); [ $arm = rrl ] && extra=(explore.rrl.enabled=true)
  rm -rf runs/measure/rrl_timing/$arm
  $PY -m jaxrl_llm.cli train --config configs/toy_steps.yaml model.name=runs/measure/toy_steps7_sft/final sft.steps=0 "$TASK" \
    rollout.max_new_tokens=64 explore.rrl.max_prefix_tokens=56 explore.rrl.prior=steps train.export_final=false \
    train.checkpoint_every=1000 train.steps=30 eval.every=1000 train.seed=0 train.out_dir=runs/measure/rrl_timing/$arm "${extra[@]}" \
    > runs/measure/rrl_timing_$arm.log 2>&1
done
$PY - <<'PY'
import json, statistics as st
for arm in ("grpo", "rrl"):
    rows = [json.loads(l) for l in open(f"runs/measure/rrl_timing/{arm}/metrics.jsonl")]
    tr = [r for r in rows if r["kind"] == "train" and r["step"] > 5]
    keys = ["time_step_s", "time_sample_s", "time_reward_s", "time_update_s", "time_other_s", "sampled_tokens"]
    print(arm, len(tr), {k: round(st.median(r[k] for r in tr), 3) for k in keys if k in tr[0]},
          "sum step s", round(sum(r["time_step_s"] for r in tr), 1), "tokens", sum(r["sampled_tokens"] for r in tr))
PY
