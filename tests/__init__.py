"""The test suite (a package, so that tests import shared helpers as `tests.helpers`)."""

# How the tests' processes and the trainer processes they start compile (tests/conftest.py, tests/helpers.py
# subprocess_env): XLA:CPU's backend at -O0, and its older per-instruction emitters instead of the MLIR fusion
# emitters, which build an MLIR pipeline per fusion: an update program of the tiny model compiles in 1.2 s
# instead of 2.4, and the RL-core + sampler-decode tests take 71 s of CPU instead of 130 from a cold cache
# (docs/testing.md). Numbers move in their last bits, which no test compares but the GRPO reference test, which
# runs its trainer with XLA's defaults in its own process. What users run compiles with XLA's defaults.
FAST_COMPILE = "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false"
