"""Fixtures shared by the whole suite (a tiny model built here, no hub), 8 fake CPU devices, a persistent compile
cache, and the `slow` tier. Helpers that tests import live in tests/helpers.py."""

import os

from tests import FAST_COMPILE

# 8 fake CPU devices for the mesh tests, and XLA:CPU compiling fast (tests/__init__.py FAST_COMPILE): more than half
# of the suite's time is XLA compiling.
os.environ.setdefault("XLA_FLAGS", f"--xla_force_host_platform_device_count=8 {FAST_COMPILE}")
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import jax  # noqa: E402
import pytest  # noqa: E402
from flax import nnx  # noqa: E402

from tests.helpers import CACHE_DIR, RRL_REFERENCE, TINY, rrl_cfg  # noqa: E402

jax.config.update("jax_compilation_cache_dir", CACHE_DIR)
# every program, however quick to compile: the tests' trainer subprocesses and xdist workers build the same small
# programs again (the two silent-process tests: 58 -> 45 s of CPU from a cold cache with 0 instead of 0.5)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)

from jaxrl_llm.model.transformer import init_model  # noqa: E402
from jaxrl_llm.sampling.sampler import Sampler  # noqa: E402


@pytest.fixture(scope="session")
def tiny_model():
    """Random tiny Llama-style model whose logits are sharp enough to make sampling tests informative."""
    model = init_model(TINY, seed=3)
    state = nnx.state(model)
    nnx.update(model, jax.tree.map(lambda x: x * 8.0 if x.ndim > 1 else x, state))
    return model


@pytest.fixture(scope="session")
def tiny_sampler(tiny_model):
    return Sampler.for_model(tiny_model, pad_id=0, stop_ids=())


@pytest.fixture(scope="session")
def rrl_reference(tmp_path_factory):
    """(config, finished Run): E3, RRL and HeRL composed, trained uninterrupted in this process (RRL_REFERENCE).
    The oracle of the resumed single-process run (tests/explore/test_rrl.py) and of the two-host pair
    (tests/parallel/test_multihost.py); both tests carry xdist_group("rrl_reference"), so it is trained once."""
    from jaxrl_llm.train.loop import Run

    cfg = rrl_cfg(tmp_path_factory.mktemp("rrl_reference"), *RRL_REFERENCE)
    run = Run(cfg, log=lambda *a: None)
    run.train()
    return cfg, run


# Modules whose tests share an expensive module-scoped run: with `pytest -n N --dist loadgroup` (tools/test.sh)
# each goes to one worker whole, so the run is built once, not once per worker that gets some of its tests.
SHARED_RUN_MODULES = {"test_trainer.py", "test_run_dir.py", "test_eval_export.py", "test_tracking.py",
                      "test_memory_bench.py", "test_real_model.py", "test_explore_correctness.py",
                      "test_memory_plan.py"}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    for item in items:
        if item.path.name in SHARED_RUN_MODULES:
            item.add_marker(pytest.mark.xdist_group(item.path.stem))
    # the long runs first (a stable sort keeps each tier in collection order): xdist hands work out in this
    # order, so no long run starts last and runs alone while the other worker idles
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session):
    """Under `--dist loadgroup`, pytest-xdist marks a grouped test by suffixing its node id with '@group'; where
    a pytest release changes how node ids are stored the suffix is silently lost and each worker builds the
    shared runs again (pytest 9.2 with xdist 3.8). Refuse to run rather than run slowly."""
    if getattr(session.config.option, "loadgroup", False):
        lost = [i.nodeid for i in session.items if i.get_closest_marker("xdist_group") and "@" not in i.nodeid]
        if lost:
            raise pytest.UsageError(f"--dist loadgroup lost the xdist_group of {len(lost)} tests ({lost[0]}): this "
                                    "pytest / pytest-xdist pair does not group; see pyproject.toml's test extras")


# JAXRL_TEST_CPU_LOG=FILE: each test's CPU seconds (this process's threads and the subprocesses it waited for,
# setup and teardown included) appended to FILE as "seconds<TAB>node id": where the suite's 2 cores go, unaffected
# by what else runs beside it (wall-clock durations are)
_CPU_LOG = os.environ.get("JAXRL_TEST_CPU_LOG")
if _CPU_LOG:
    import resource

    def _cpu() -> float:
        return sum(r.ru_utime + r.ru_stime for r in (resource.getrusage(resource.RUSAGE_SELF),
                                                      resource.getrusage(resource.RUSAGE_CHILDREN)))

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(item, nextitem):
        start = _cpu()
        yield
        with open(_CPU_LOG, "a") as f:
            f.write(f"{_cpu() - start:.1f}\t{item.nodeid}\n")
