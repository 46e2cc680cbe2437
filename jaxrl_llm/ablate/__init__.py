"""The ablation harness behind `jaxrl-llm ablate` and `jaxrl-llm ablate-check`: spec.py (the spec), grid.py (the
arms x seeds runs), records.py (finished runs, their summaries, the archive), report.py (results.md / .csv,
curves.png), controls.py (the positive controls' predictions), command.py (the two commands)."""
