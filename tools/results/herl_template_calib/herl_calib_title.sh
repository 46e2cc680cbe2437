#!/usr/bin/env bash
# issue 25 HeRL calibration: hidden title item + the "repeat" revise template, 4 steps of the herl arm
cd /work/frozen
T=$'{question}\n\nHere is a draft answer:\n{draft}\n\nIt already meets:\n{met}\nThe draft does not meet these requirements yet:\n{unmet}\n\nWrite the answer again so that it meets them. Make sure the new answer does this: {unmet}\nReply with the new answer only.'
nice -n 19 /work/main/.venv/bin/python -m jaxrl_llm.cli train --config configs/rubric_smollm2.yaml data.source=jsonl data.path=configs/data/hidden_title_train.jsonl data.eval_path=configs/data/hidden_title_eval.jsonl rollout.temperature=0.7 explore.herl.enabled=true train.steps=4 eval.every=100 eval.size=8 eval.samples=1 train.checkpoint_every=100 train.export_final=false train.out_dir=runs/measure/herl_calib_title "explore.herl.revise_template=$T" > /work/main/runs/measure/herl_calib_title.log 2>&1
