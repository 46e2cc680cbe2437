"""The training run end to end on tiny models: configs, resume, reward rising, bad input."""

import json
from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx

from jaxrl_llm.config import ConfigError, load_config
from jaxrl_llm.data.tasks import DataError, load_items
from jaxrl_llm.train.checkpoint import CheckpointMismatchError
from jaxrl_llm.train.loop import Run
from jaxrl_llm.train.policy import encode_items

ROOT = Path(__file__).resolve().parents[1]
TIMING = ("time", "_per_s", "compilations")  # wall-clock figures differ between runs


def _tiny_cfg(tmp_path, *extra):
    tmp_path.mkdir(parents=True, exist_ok=True)
    data = tmp_path / "magic.jsonl"
    rows = [{"question": f"Question {i}: what is the magic word?", "answer": "7", "scorer": "exact"} for i in range(40)]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    held = tmp_path / "held.jsonl"
    held.write_text("".join(json.dumps({**r, "question": r["question"].replace("Question", "Held")}) + "\n"
                            for r in rows[:8]))
    return load_config(None, [
        "model.name=scratch", "model.scratch={hidden_size: 32, intermediate_size: 64, num_layers: 1, "
        "num_heads: 2, num_kv_heads: 1, head_dim: 16, max_position_embeddings: 96, tie_embeddings: true}",
        "data.source=jsonl", f"data.path={data}", f"data.eval_path={held}", "data.answer_format=raw",
        "data.max_prompt_len=64", "rollout.prompts_per_step=4", "rollout.group_size=16", "rollout.max_new_tokens=1",
        "algo.micro_batch=32", "optim.lr=0.02", "eval.every=100", "eval.size=8", "eval.samples=2",
        "reward.workers=1", f"train.out_dir={tmp_path / 'run'}", "train.checkpoint_every=2",
        "train.async_checkpoint=false", "train.tensorboard=false", "train.export_final=false", *extra])


def _train_rows(out_dir):
    rows = [json.loads(ln) for ln in (Path(out_dir) / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: {k: v for k, v in r.items() if not any(t in k for t in TIMING)}
            for r in rows if r["kind"] == "train"}


@pytest.mark.parametrize("path", sorted((ROOT / "configs").glob("*.yaml")), ids=lambda p: p.name)
def test_every_config_loads(path):
    cfg = load_config(path)
    assert cfg.train.steps > 0 and cfg.rollout.group_size >= 1


def test_config_errors_name_the_key():
    with pytest.raises(ConfigError, match=r"unknown key 'rollout.grop_size'; did you mean 'group_size'"):
        load_config(None, ["rollout.grop_size=4"])
    with pytest.raises(ConfigError, match=r"'algo.advantage' is 'ppo'; choose from"):
        load_config(None, ["algo.advantage=ppo"])
    with pytest.raises(ConfigError, match=r"'optim.lr' must be float, got 'fast'"):
        load_config(None, ["optim.lr=fast"])


def test_reward_rises_on_a_toy_run(tmp_path):
    cfg = _tiny_cfg(tmp_path, "train.steps=12")
    Run(cfg, log=lambda *a: None).train()
    rows = _train_rows(cfg.train.out_dir)
    first, last = rows[1]["reward_mean"], np.mean([rows[s]["reward_mean"] for s in (10, 11, 12)])
    assert first < 0.1 and last > 0.5, (first, last)


def test_compilations_stay_flat_after_warmup_and_final_policy_exports(tmp_path):
    cfg = _tiny_cfg(tmp_path, "train.steps=5", "train.export_final=true")
    run = Run(cfg, log=lambda *a: None)
    run.train()
    rows = [json.loads(ln) for ln in (Path(cfg.train.out_dir) / "metrics.jsonl").read_text().splitlines()]
    counts = [r["compilations"] for r in rows if r["kind"] == "train"]
    assert counts[1:] == [counts[1]] * (len(counts) - 1), counts
    from jaxrl_llm.model.hf_io import load_hf_folder
    from jaxrl_llm.model.tokenizer import load_tokenizer
    final = Path(cfg.train.out_dir) / "final"
    exported, _ = load_hf_folder(final)
    np.testing.assert_array_equal(np.asarray(exported.embed[...]),
                                  np.asarray(nnx.merge(run.policy.graphdef, run.params).embed[...]))
    assert load_tokenizer(final).eos_token == "<|im_end|>"


def test_sigterm_saves_a_checkpoint_and_exits_cleanly(tmp_path):
    import signal
    import subprocess
    import sys
    import time
    import yaml
    cfg = _tiny_cfg(tmp_path, "train.steps=400", "train.checkpoint_every=1000")
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(cfg.to_dict()))
    metrics = Path(cfg.train.out_dir) / "metrics.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "jaxrl_llm.cli", "train", "--config", str(config)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:
        if metrics.exists() and '"kind": "train"' in metrics.read_text():
            break
        time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out[-2000:]
    last = max(json.loads(ln)["step"] for ln in metrics.read_text().splitlines())
    assert 1 <= last < 400 and f"stopped by signal after step {last}" in out
    run = Run(cfg, log=lambda *a: None)
    assert run.try_resume() and run.step == last


def test_resume_matches_an_uninterrupted_run(tmp_path):
    whole = _tiny_cfg(tmp_path / "a", "train.steps=4")
    run = Run(whole, log=lambda *a: None)
    run.train()
    ref_params = jax.device_get(nnx.to_pure_dict(run.params))

    first = _tiny_cfg(tmp_path / "b", "train.steps=2")
    Run(first, log=lambda *a: None).train()
    resumed = Run(_tiny_cfg(tmp_path / "b", "train.steps=4"), log=lambda *a: None)
    resumed.train()
    assert resumed.step == 4
    a, b = _train_rows(whole.train.out_dir), _train_rows(first.train.out_dir)
    assert sorted(b) == [1, 2, 3, 4]
    for step in (3, 4):
        assert a[step].keys() == b[step].keys()
        for k, v in a[step].items():
            want = pytest.approx(v, rel=1e-5, abs=1e-6) if isinstance(v, float) else v
            assert b[step][k] == want, (step, k)
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, atol=1e-6), ref_params,
                 jax.device_get(nnx.to_pure_dict(resumed.params)))


def test_checkpoint_of_another_model_shape_is_refused(tmp_path):
    cfg = _tiny_cfg(tmp_path, "train.steps=2")
    Run(cfg, log=lambda *a: None).train()
    other = _tiny_cfg(tmp_path, "train.steps=4", "model.scratch.num_layers=2")
    with pytest.raises(CheckpointMismatchError, match=r"written for model .*'num_layers': 1.*'num_layers': 2"):
        Run(other, log=lambda *a: None).train()


def test_data_row_without_answer_names_file_and_row(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"question": "a", "answer": "1"}\n{"question": "b", "answer": ""}\n')
    cfg = load_config(None, ["data.source=jsonl", f"data.path={path}"])
    with pytest.raises(DataError, match=r"bad\.jsonl: row 1 has no 'answer'"):
        load_items(cfg.data, "train")


@pytest.mark.parametrize("mode", ["drop", "truncate"])
def test_overlong_prompts_are_dropped_or_truncated(tmp_path, mode):
    cfg = _tiny_cfg(tmp_path, "data.max_prompt_len=60", f"data.overlong={mode}")
    from jaxrl_llm.model.char_tokenizer import char_tokenizer
    from jaxrl_llm.data.tasks import TaskItem
    items = [TaskItem("a", "short?", "1", "exact"), TaskItem("b", "x" * 100, "1", "exact")]
    kept, dropped = encode_items(char_tokenizer(), cfg, items)
    if mode == "drop":
        assert dropped == 1 and [it.uid for it, _ in kept] == ["a"]
    else:
        assert dropped == 0 and len(kept[1][1]) == 60


def test_held_out_items_never_repeat_a_training_question():
    from jaxrl_llm.data.tasks import load_splits
    cfg = load_config(ROOT / "configs" / "toy.yaml")
    train, held = load_splits(cfg.data)
    assert len(train) == cfg.data.train_size and 0 < len(held) <= cfg.data.eval_size
    assert not {it.question for it in train} & {it.question for it in held}


def test_parquet_source_reads_the_documented_schema(tmp_path):
    import datasets
    path = tmp_path / "tasks.parquet"
    datasets.Dataset.from_list([{"question": "What is 1/2 as a decimal?", "answer": "0.5", "scorer": "math",
                                 "reference": "<answer>0.5</answer>"},
                                {"question": "Capital of France?", "answer": "Paris", "scorer": "exact",
                                 "reference": None}]).to_parquet(str(path))
    cfg = load_config(None, ["data.source=parquet", f"data.path={path}"])
    items = load_items(cfg.data, "train")
    assert [(it.answer, it.scorer, it.reference) for it in items] == [
        ("0.5", "math", "<answer>0.5</answer>"), ("Paris", "exact", "")]
    assert items[1].uid.endswith("tasks.parquet:1")
