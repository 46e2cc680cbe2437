"""Multi-controller start-up: which processes make up the run, from the environment the launch scripts set.

    JAXRL_COORDINATOR_ADDRESS=host:port JAXRL_NUM_PROCESSES=N JAXRL_PROCESS_ID=i
        GPU clusters (tools/launch_gpu_multinode.sh): jax.distributed.initialize with these values
    JAXRL_DISTRIBUTED=auto
        TPU slices (tools/launch_tpu_pod.sh) and clusters JAX detects itself (SLURM, Open MPI):
        jax.distributed.initialize() with no arguments
    neither: one process, every local device (nothing to initialize)

Each process then runs the same step on the same global view and handles its share of the rows
(parallel/hosts.py). On CPU (tests, development) processes talk through gloo collectives.
"""

from __future__ import annotations

import os

# jax.distributed ends every process (with a status no launch script resumes on) once one has missed its
# heartbeats this long; parallel/watchdog.py names a silent process and exits with the resume status before that
JAX_HEARTBEAT_TIMEOUT_S = 100


class DistributedError(RuntimeError):
    pass


def initialize_from_env(environ=None) -> int:
    """Initialize jax.distributed as the environment asks; returns the number of processes (1 when alone)."""
    import jax

    env = os.environ if environ is None else environ
    address = env.get("JAXRL_COORDINATOR_ADDRESS", "")
    if address:
        missing = [k for k in ("JAXRL_NUM_PROCESSES", "JAXRL_PROCESS_ID") if not env.get(k, "").strip()]
        if missing:
            raise DistributedError(f"JAXRL_COORDINATOR_ADDRESS={address} is set but {', '.join(missing)} is not")
        try:
            n, i = int(env["JAXRL_NUM_PROCESSES"]), int(env["JAXRL_PROCESS_ID"])
        except ValueError:
            raise DistributedError("JAXRL_NUM_PROCESSES and JAXRL_PROCESS_ID must be integers, got "
                                   f"{env['JAXRL_NUM_PROCESSES']!r} and {env['JAXRL_PROCESS_ID']!r}") from None
        if not 0 <= i < n:
            raise DistributedError(f"JAXRL_PROCESS_ID={i} is not in [0, JAXRL_NUM_PROCESSES={n})")
        _cpu_collectives()
        jax.distributed.initialize(coordinator_address=address, num_processes=n, process_id=i,
                                   heartbeat_timeout_seconds=JAX_HEARTBEAT_TIMEOUT_S)
    elif env.get("JAXRL_DISTRIBUTED", "") == "auto":
        _cpu_collectives()
        jax.distributed.initialize(heartbeat_timeout_seconds=JAX_HEARTBEAT_TIMEOUT_S)
    elif env.get("JAXRL_DISTRIBUTED", ""):
        raise DistributedError(f"JAXRL_DISTRIBUTED={env['JAXRL_DISTRIBUTED']!r}: the only value is 'auto'")
    else:
        return 1
    return jax.process_count()


def _cpu_collectives() -> None:
    """Processes of a CPU run (tests, development) exchange arrays through gloo; accelerators use their own
    (NCCL, ICI) whatever this says."""
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
