"""Multi-controller start-up: which processes make up the run, from the environment the launch scripts set.

    JAXRL_COORDINATOR_ADDRESS=host:port JAXRL_NUM_PROCESSES=N JAXRL_PROCESS_ID=i
        GPU clusters (tools/launch_gpu_multinode.sh): jax.distributed.initialize with these values
    JAXRL_DISTRIBUTED=auto
        TPU slices (tools/launch_tpu_pod.sh) and clusters JAX detects itself (SLURM, Open MPI):
        jax.distributed.initialize() with no arguments
    neither: one process, every local device (nothing to initialize)

The trainer's data path is single-process today: the sampler and the update take host-global arrays, and
explorer state and the judge live in one process. `initialize_from_env` therefore refuses a run of more
than one process with a message that says so, instead of letting each host train on its own
(README, "Scale-out").
"""

from __future__ import annotations

import os


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
        jax.distributed.initialize(coordinator_address=address, num_processes=n, process_id=i)
    elif env.get("JAXRL_DISTRIBUTED", "") == "auto":
        jax.distributed.initialize()
    elif env.get("JAXRL_DISTRIBUTED", ""):
        raise DistributedError(f"JAXRL_DISTRIBUTED={env['JAXRL_DISTRIBUTED']!r}: the only value is 'auto'")
    else:
        return 1
    count = jax.process_count()
    if count > 1:
        raise DistributedError(
            f"this run has {count} processes (hosts); the trainer's data path is single-process so far (each host "
            f"would need its own slice of the batch fed with make_array_from_process_local_data, metrics reduced "
            f"across hosts, explorer state kept identical): multi-host training is not implemented yet. Run on one "
            f"host (a single-host TPU slice such as v5litepod-8, or one GPU node: tools/launch_gpu_node.sh)")
    return count
