"""The reward workers' sandbox: a job that allocates 100 GB, forks, writes files, loops forever or prints scores 0,
is counted by kind, leaves no process of its worker's group behind, and the pool keeps scoring."""

import os
import time

import pytest

from tests.hostile_scorer import environment, run
from jaxrl_llm.rewards.pool import RewardPool
from jaxrl_llm.rewards.types import FAILED, Score


def _group_gone(pgid: int) -> bool:
    for _ in range(50):  # the kill is asynchronous: the group may take a moment to go
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


@pytest.fixture(scope="module")
def pool():
    with RewardPool(workers=1, timeout_s=2.0, fn=run, memory_mb=256) as p:
        assert p.map([("x = 1",)]) == [Score(1.0)]
        yield p


def _one(pool, code):
    """Score one job on the pool's single worker: (score, the worker's process group id)."""
    pgid = pool.workers[0].proc.pid
    return pool.map([(code,)])[0], pgid


def test_a_100_gb_allocation_scores_0(pool):
    before = pool.stats.memory
    assert _one(pool, "b = bytearray(100 * 2**30)")[0] == FAILED
    assert pool.stats.memory == before + 1 and "reward.memory_mb" in pool.stats.last_error
    assert pool.map([("x = 2",)] * 2) == [Score(1.0)] * 2


def test_a_fork_is_killed_with_its_group(pool):
    before = pool.stats.killed
    value, pgid = _one(pool, "import os, time\nif os.fork() == 0:\n    time.sleep(1000)")
    assert value == FAILED and pool.stats.killed == before + 1 and "left 1 processes running" in pool.stats.last_error
    assert _group_gone(pgid) and pool.workers[0].proc.pid != pgid
    assert pool.map([("x = 3",)]) == [Score(1.0)]


def test_an_endless_loop_times_out_and_its_group_dies(pool):
    before = pool.stats.timeouts
    t0 = time.monotonic()
    value, pgid = _one(pool, "import os, time\nif os.fork() == 0:\n    time.sleep(1000)\nwhile True:\n    pass")
    assert value == FAILED and pool.stats.timeouts == before + 1 and time.monotonic() - t0 < 10
    assert _group_gone(pgid)  # the forked child too: a plain kill of the worker once left it running
    assert pool.map([("x = 4",)]) == [Score(1.0)]


def test_file_writes_fail_and_the_private_folder_goes(pool):
    name = f"/tmp/jaxrl-sandbox-test-{os.getpid()}"
    before = pool.stats.errors
    folder = pool.workers[0].folder
    for path in ("in_cwd.txt", name):
        assert _one(pool, f"with open({path!r}, 'w') as f:\n    f.write('x' * 100)")[0] == FAILED
    assert pool.stats.errors == before + 2 and "File too large" in pool.stats.last_error
    assert os.path.getsize(os.path.join(folder, "in_cwd.txt")) == 0  # relative paths land in the private folder
    assert os.path.getsize(name) == 0
    os.remove(name)
    pool._replace(0)  # a worker's end removes its folder
    assert not os.path.exists(folder)


def test_output_is_captured_not_printed(pool, capfd):
    before = pool.stats.output_bytes
    capfd.readouterr()
    assert _one(pool, "print('SHOUT' * 10)\nimport os\nos.write(2, b'RAW')")[0] == Score(1.0)
    assert _one(pool, "print('LAST WORDS')\nraise ValueError('boom')")[0] == FAILED
    out, err = capfd.readouterr()
    assert "SHOUT" not in out + err and "RAW" not in out + err and "LAST WORDS" not in out + err
    assert pool.stats.output_bytes == before + len("SHOUT" * 10 + "\n") + 3 + len("LAST WORDS\n")
    assert "ValueError: boom" in pool.stats.last_error and "LAST WORDS" in pool.stats.last_error


def test_credentials_are_not_in_the_workers_environment(monkeypatch):
    secrets = ["HF_TOKEN", "AWS_SECRET_ACCESS_KEY", "GOOGLE_APPLICATION_CREDENTIALS", "SSH_AUTH_SOCK",
               "WANDB_API_KEY", "GITHUB_TOKEN"]
    for name in secrets:
        monkeypatch.setenv(name, "secret-value")
    with RewardPool(workers=1, timeout_s=5.0, fn=environment) as pool:
        assert pool.map([(secrets,), (["PATH"],)]) == [Score(1.0), Score(0.0)]  # PATH stays: only credentials go


def test_a_worker_that_dies_while_starting_is_started_again(tmp_path, monkeypatch):
    monkeypatch.setenv("JAXRL_TEST_DIE_ON_START", str(tmp_path / "starts"))
    monkeypatch.setenv("JAXRL_TEST_DEATHS", "2")
    with RewardPool(workers=1, timeout_s=5.0, fn=run, start_retries=2) as pool:
        assert pool.map([("x = 1",)]) == [Score(1.0)]
    assert (tmp_path / "starts").read_text() == "xxx"
    (tmp_path / "starts").unlink()
    monkeypatch.setenv("JAXRL_TEST_DEATHS", "3")
    with RewardPool(workers=1, timeout_s=5.0, fn=run, start_retries=2) as pool:
        with pytest.raises(RuntimeError, match=r"died while starting, 3 times in a row \(exit code 3\)"):
            pool.map([("x = 1",)])


def test_a_pool_killed_outright_leaves_no_private_folder():
    """A trainer killed with SIGKILL (or by the OOM killer) never closes its pool: its workers see the pipe close,
    end, and remove their private folders themselves (they used to stay in the temporary folder, one per worker
    per run)."""
    import json
    import subprocess
    import sys

    code = ("import json, os, signal\n"
            "from jaxrl_llm.rewards.pool import RewardPool\n"
            "from tests.hostile_scorer import run\n"
            "pool = RewardPool(workers=2, timeout_s=5.0, fn=run)\n"
            "assert pool.map([('x = 1',), ('open(\"left.txt\", \"w\").write(\"x\")',)])\n"
            "print(json.dumps([w.folder for w in pool.workers]), flush=True)\n"
            "os.kill(os.getpid(), signal.SIGKILL)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    assert proc.returncode == -9, proc.stderr[-2000:]
    folders = json.loads(proc.stdout)
    assert len(folders) == 2 and all(os.path.basename(f).startswith("jaxrl-reward-") for f in folders)
    for _ in range(100):  # the workers notice the closed pipe and clean up asynchronously
        if not any(os.path.exists(f) for f in folders):
            break
        time.sleep(0.05)
    assert not any(os.path.exists(f) for f in folders), [os.listdir(f) for f in folders if os.path.exists(f)]
