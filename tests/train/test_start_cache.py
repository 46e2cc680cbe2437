"""eval.start_cache (train/start_cache.py): a run that starts from the same weights with the same evaluation as an
earlier one takes that run's step-0 evaluation. The oracle is the evaluation such a run makes itself: the same
figures, the same per-problem outcomes, and the same training afterwards (skipping the evaluation moves no key)."""

import json
import os
from pathlib import Path

import ml_dtypes
import numpy as np

from jaxrl_llm.config import load_config
from jaxrl_llm.train import start_cache
from jaxrl_llm.train.loop import Run
from jaxrl_llm.train.run_dir import config_record
from tests.helpers import ROOT, tiny_cfg, train_rows

AFTER_START_ONLY = ("optim.lr=0.05", "algo.eps_high=0.4")
TOY = str(ROOT / "configs" / "toy.yaml")


def _eval0(out_dir) -> dict:
    rows = [json.loads(ln) for ln in (Path(out_dir) / "metrics.jsonl").read_text().splitlines()]
    return next(r for r in rows if r["kind"] == "eval" and r["step"] == 0)


def _figures(row: dict) -> dict:
    return {k: v for k, v in row.items() if k not in ("wall_time", "time_eval_s", "cpu_eval_s", "start_reused")}


def test_a_run_that_differs_only_after_step_0_takes_the_step_0_evaluation(tmp_path):
    cache, logs = tmp_path / "cache", {}

    def run(name, *extra):
        logs[name] = []
        cfg = tiny_cfg(tmp_path, "train.steps=2", f"train.out_dir={tmp_path / name}", *extra)  # the same data files
        Run(cfg, log=logs[name].append).train()
        return Path(cfg.train.out_dir)

    a = run("a", f"eval.start_cache={cache}")
    b = run("b", f"eval.start_cache={cache}", *AFTER_START_ONLY)
    c = run("c", *AFTER_START_ONLY)  # b without the cache: its own evaluation
    (entry,) = cache.glob("*.json")
    assert json.loads(entry.read_text())["source"] == str(a)
    assert "start_reused" not in _eval0(a) and "start_reused" not in _eval0(c) and _eval0(b)["start_reused"] == 1
    assert _figures(_eval0(b)) == _figures(_eval0(a)) == _figures(_eval0(c))
    for key in ("time_eval_s", "cpu_eval_s"):  # the evaluation's own time: wall and CPU times compare
        assert _eval0(b)[key] == _eval0(a)[key]
    rows = [json.loads(ln) for ln in (a / "metrics.jsonl").read_text().splitlines()]
    for r in rows:  # CPU seconds: the process's own, at most its wall time on every core
        wall, cpu = {"train": ("time_step_s", "cpu_step_s"),
                     "eval": ("time_eval_s", "cpu_eval_s")}.get(r["kind"], (None, None))
        assert not wall or 0 < r[cpu] <= r[wall] * os.cpu_count() + 0.01
    outcomes = [(d / "held_out" / "step0.jsonl").read_text() for d in (a, b, c)]
    assert outcomes[0] and outcomes[0] == outcomes[1] == outcomes[2]
    assert train_rows(b) == train_rows(c) and train_rows(b) != train_rows(a)  # training as if it had evaluated
    assert any(f"taken from {a}" in line for line in logs["b"])
    assert any(f"kept for runs that start like this one ({entry})" in line for line in logs["a"])
    # a cache that cannot be written (a file where the folder should be): the run goes on, and says so
    blocked = tmp_path / "blocked"
    blocked.write_text("")
    d = run("d", f"eval.start_cache={blocked}")
    assert _figures(_eval0(d)) == _figures(_eval0(a)) and (d / "metrics.jsonl").is_file()
    assert any(f"could not be kept in {blocked}" in line for line in logs["d"])


def test_the_key_holds_what_acts_before_step_1_and_the_weights():
    base = load_config(TOY, [])
    key = start_cache.entry_path("c", config_record(base), "w")
    for after in ("optim.lr=0.5", "algo.eps_high=0.4", "explore.herl.enabled=true", "explore.e3.enabled=true",
                  "train.steps=7", "eval.every=3", "train.out_dir=elsewhere", "eval.start_cache=other"):
        assert start_cache.entry_path("c", config_record(load_config(TOY, [after])), "w") == key, after
    for before in ("eval.samples=9", "eval.size=17", "rollout.temperature=0.9", "rollout.max_new_tokens=9",
                   "train.seed=3", "eval.revise_rounds=1", "sft.steps=3", "data.train_size=33", "mesh.fsdp=2"):
        assert start_cache.entry_path("c", config_record(load_config(TOY, [before])), "w") != key, before
    assert start_cache.entry_path("c", config_record(base), "w2") != key
    # HeRL's revise template acts after step 0, except where the evaluation's revise rounds fill it
    template = "explore.herl.revise_template=Again: {question} {draft} {met} {unmet}"
    for rounds, same in (("eval.revise_rounds=0", True), ("eval.revise_rounds=1", False)):
        a, b = (config_record(load_config(TOY, [rounds, *extra])) for extra in ([], [template]))
        assert (start_cache.entry_path("c", a, "w") == start_cache.entry_path("c", b, "w")) is same, rounds


def test_the_weights_digest_sees_one_ulp_a_dtype_and_a_name():
    w = {"layer": {"kernel": np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)}, "bias": np.zeros(4, np.float32)}
    d = start_cache.params_digest(w)
    assert start_cache.params_digest({k: (v.copy() if k == "bias" else v) for k, v in w.items()}) == d
    nudged = w["layer"]["kernel"].copy()
    nudged[2, 3] = np.nextafter(nudged[2, 3], np.float32(2))
    assert start_cache.params_digest({**w, "layer": {"kernel": nudged}}) != d
    assert start_cache.params_digest({**w, "bias": w["bias"].astype(ml_dtypes.bfloat16)}) != d
    assert start_cache.params_digest({**w, "layer": {"kernel2": w["layer"]["kernel"]}}) != d


def test_an_entry_that_cannot_be_used_is_said_and_the_run_evaluates(tmp_path):
    record = config_record(load_config(TOY, []))
    row = {"greedy_accuracy": 0.5, "time_eval_s": 1.0, "step": 0, "kind": "eval", "wall_time": 9.0}
    path = start_cache.store(tmp_path, record, "w", row, "{}\n", "runs/x")
    got = start_cache.load(tmp_path, record, "w")
    assert got["row"] == {"greedy_accuracy": 0.5, "time_eval_s": 1.0} and got["outcomes"] == "{}\n"
    logs = []
    assert start_cache.load(tmp_path, record, "other weights", logs.append) is None and not logs  # no entry
    entry = json.loads(path.read_text())
    path.write_text(json.dumps({**entry, "params": "other weights"}))  # an entry under a key it does not hold
    assert start_cache.load(tmp_path, record, "w", logs.append) is None
    path.write_text('{"row": ')  # cut short
    assert start_cache.load(tmp_path, record, "w", logs.append) is None
    assert len(logs) == 2 and all(str(path) in line and "evaluating" in line for line in logs)
