"""utils/cpu.py: the CPU's bf16 flags read from a cpuinfo file, and the warning a bf16 run gets on a CPU that
emulates bf16 (only there)."""

from jaxrl_llm.utils.cpu import bf16_advice, cpu_flags


def test_flags_are_read_from_cpuinfo(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu sse avx512f avx512_bf16 amx_tile\nbugs\t\t: spectre\n")
    assert cpu_flags(str(info)) == {"fpu", "sse", "avx512f", "avx512_bf16", "amx_tile"}
    assert cpu_flags(str(tmp_path / "missing")) == set()


def test_a_bf16_run_is_warned_only_on_a_cpu_that_emulates_bf16():
    plain = {"fpu", "avx2", "avx512f"}
    warning = bf16_advice("cpu", "bfloat16", plain)
    assert warning and "model.compute_dtype=float32" in warning
    assert bf16_advice("cpu", "bfloat16", plain | {"avx512_bf16"}) is None
    assert bf16_advice("cpu", "bfloat16", plain | {"amx_bf16"}) is None
    assert bf16_advice("cpu", "float32", plain) is None
    assert bf16_advice("gpu", "bfloat16", plain) is None
    assert bf16_advice("cpu", "bfloat16", set()) is None  # flags unknown: nothing to say
