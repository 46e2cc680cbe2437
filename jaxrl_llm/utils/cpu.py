"""What this host's CPU offers bf16 work: XLA:CPU runs bf16 matmuls natively (oneDNN / YNNPACK, with a float32
result) where the CPU has avx512_bf16 or AMX; elsewhere it emulates them, and float32 is the faster sampling dtype
(docs/benchmarks.md, "Where a decode step's time goes on CPU")."""

from __future__ import annotations

BF16_FLAGS = ("avx512_bf16", "amx_bf16")


def cpu_flags(path: str = "/proc/cpuinfo") -> set[str]:
    """The CPU's feature flags as /proc/cpuinfo lists them (empty where it cannot be read: not Linux)."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def bf16_advice(platform: str, dtype: str, flags: set[str] | None = None) -> str | None:
    """A warning for a bf16 run on a CPU that emulates bf16 (None where there is nothing to say). `flags`: the
    CPU's (default: read from /proc/cpuinfo, only for a bf16 run on CPU). Unknown flags (an empty set) say
    nothing: the CPU may well have them."""
    if platform != "cpu" or dtype != "bfloat16":
        return None
    flags = cpu_flags() if flags is None else flags
    if not flags or any(f in flags for f in BF16_FLAGS):
        return None
    return ("model.compute_dtype is bfloat16 on a CPU without avx512_bf16 or AMX: XLA emulates bf16 matmuls here, "
            "so sampling and the update are likely faster with model.compute_dtype=float32")
