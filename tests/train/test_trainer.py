"""The training run end to end on tiny models: configs, resume, reward rising, bad input."""

import json
import os
import re
import signal
import time
from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx

from jaxrl_llm.config import ConfigError, load_config
from jaxrl_llm.data.tasks import load_items
from jaxrl_llm.data.types import DataError
from jaxrl_llm.train.checkpoint import CheckpointMismatchError
from jaxrl_llm.train.loop import Run
from jaxrl_llm.train.policy import encode_items
from tests.helpers import sigterm_after_row, spawn_train, tiny_cfg, train_rows, wait_for_row

ROOT = Path(__file__).resolve().parents[2]


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
    # values that would crash mid-run (an IndexError after the first rollouts, a division by zero) or
    # silently turn a term off are refused up front, naming the key
    for bad, key in (("algo.ppo_epochs=0", r"ppo_epochs \(0\)"), ("algo.minibatches=0", r"minibatches \(0\)"),
                     ("algo.micro_batch=0", r"micro_batch \(0\)"), ("algo.kl_coef=-0.1", r"algo.kl_coef=-0.1"),
                     ("eval.every=0", r"eval.every \(0\)"), ("eval.samples=0", r"eval.samples \(0\)")):
        with pytest.raises(ConfigError, match=key):
            load_config(None, [bad])


@pytest.fixture(scope="module")
def toy_run(tmp_path_factory):
    """One 12-step run shared by the tests of what a finished run holds: checkpoints every 2 steps, the final
    policy exported, and a maintenance URL nothing answers (port 9), which must not stop or slow it.
    Returns (its folder's parent, config, the Run after train(), its log lines)."""
    tmp = tmp_path_factory.mktemp("toy")
    cfg = tiny_cfg(tmp, "train.steps=12", "train.export_final=true",
                    "train.maintenance_url=http://127.0.0.1:9/nothing")
    logs = []
    run = Run(cfg, log=logs.append)
    run.train()
    return tmp, cfg, run, logs


@pytest.mark.slow
def test_reward_rises_on_a_toy_run(toy_run):
    _, cfg, _, _ = toy_run
    rows = train_rows(cfg.train.out_dir)
    first, last = rows[1]["reward_mean"], np.mean([rows[s]["reward_mean"] for s in (10, 11, 12)])
    assert first < 0.1 and last > 0.5, (first, last)


@pytest.mark.slow
def test_compilations_stay_flat_after_warmup_and_final_policy_exports(toy_run):
    _, cfg, run, _ = toy_run
    rows = [json.loads(ln) for ln in (Path(cfg.train.out_dir) / "metrics.jsonl").read_text().splitlines()]
    counts = [r["compilations"] for r in rows if r["kind"] == "train"]
    assert len(counts) == 12 and counts[1:] == [counts[1]] * (len(counts) - 1), counts
    from jaxrl_llm.model.hf_io import load_hf_folder
    from jaxrl_llm.model.tokenizer import load_tokenizer
    final = Path(cfg.train.out_dir) / "final"
    exported, _ = load_hf_folder(final)
    np.testing.assert_array_equal(np.asarray(exported.embed[...]),
                                  np.asarray(nnx.merge(run.policy.graphdef, run.state.params).embed[...]))
    assert load_tokenizer(final).eos_token == "<|im_end|>"


@pytest.mark.slow
def test_sigterm_during_rl_saves_a_checkpoint_and_exits_cleanly(tmp_path):
    cfg = tiny_cfg(tmp_path, "train.steps=400", "train.checkpoint_every=1000")
    metrics = Path(cfg.train.out_dir) / "metrics.jsonl"
    out = sigterm_after_row(tmp_path, cfg, '"kind": "train"')
    last = max(json.loads(ln)["step"] for ln in metrics.read_text().splitlines())
    assert 1 <= last < 400 and f"stopped by signal (SIGTERM); saved RL step {last} to " in out, out[-2000:]
    run = Run(cfg, log=lambda *a: None)
    assert run.try_resume() and run.state.step == last


def _metadata_server(value: list, seen: list):
    """A stand-in for the GCE metadata server's maintenance-event: answers value[0] to every GET and records
    the request (path, Metadata-Flavor header)."""
    from tests.stand_in_http import serve

    def respond(handler):
        seen.append((handler.path, handler.headers.get("Metadata-Flavor")))
        return 200, value[0].encode()

    return serve(respond)


@pytest.mark.slow
def test_a_maintenance_event_saves_and_stops_like_sigterm(tmp_path, toy_run):
    """train.maintenance_url: NONE lets the run go on; once the server announces host maintenance, the run
    saves after its current step and stops (exit 75 from the CLI), saying why; resume continues from there.
    An unreachable URL is reported and never stops a run; "auto" watches GCE's metadata server on TPU only."""
    import threading

    from jaxrl_llm.train.stop import GCE_MAINTENANCE_URL, maintenance_url

    assert maintenance_url("auto", "tpu") == GCE_MAINTENANCE_URL and maintenance_url("auto", "cpu") == ""
    value, seen = ["NONE"], []
    server = _metadata_server(value, seen)
    url = f"http://127.0.0.1:{server.server_address[1]}/computeMetadata/v1/instance/maintenance-event"
    cfg = tiny_cfg(tmp_path, "train.steps=400", "train.checkpoint_every=1000", f"train.maintenance_url={url}")
    metrics = Path(cfg.train.out_dir) / "metrics.jsonl"

    def announce():
        while not (metrics.exists() and '"step": 2, "kind": "train"' in metrics.read_text()):
            time.sleep(0.02)
        value[0] = "TERMINATE_ON_HOST_MAINTENANCE"

    threading.Thread(target=announce, daemon=True).start()
    logs = []
    run = Run(cfg, log=logs.append)
    run.train()
    server.shutdown()
    last = max(json.loads(ln)["step"] for ln in metrics.read_text().splitlines())
    assert run.stopped and 2 <= last < 400, logs[-3:]
    assert f"stopped by maintenance event TERMINATE_ON_HOST_MAINTENANCE; saved RL step {last} to " in logs[-1]
    assert seen and all(p.startswith("/computeMetadata/v1/instance/maintenance-event?wait_for_change=true")
                        and flavor == "Google" for p, flavor in seen), seen[:3]
    again = Run(cfg, log=lambda *a: None)
    assert again.try_resume() and again.state.step == last

    # the shared toy run watched a URL nothing answers: said so, and ran to its last step
    _, toy, _, logs = toy_run
    assert any("maintenance events: cannot read http://127.0.0.1:9/nothing" in ln for ln in logs), logs
    assert json.loads((Path(toy.train.out_dir) / "metrics.jsonl").read_text().splitlines()[-1])["step"] == 12


@pytest.fixture(scope="module")
def sft_stopped(tmp_path_factory):
    """SFT warm start (kl_coef > 0) in a subprocess, SIGTERM-ed once it wrote an SFT row, then resumed here for 10
    more SFT steps and 2 RL steps. Returns (folder's parent, the SFT step it saved, the resumed Run, its log
    lines, its parameters before train(): the scratch model's random initialisation)."""
    tmp = tmp_path_factory.mktemp("sft")
    extras = ("sft.batch_size=16", "algo.kl_coef=0.1", "train.steps=2")
    out = sigterm_after_row(tmp, tiny_cfg(tmp, "sft.steps=100000", *extras), '"kind": "sft"')
    found = re.search(r"stopped by signal \(SIGTERM\); saved SFT step (\d+)/100000 \(policy and SFT optimizer state\)", out)
    assert found, out[-2000:]
    reached = int(found.group(1))
    logs = []
    run = Run(tiny_cfg(tmp, f"sft.steps={reached + 10}", *extras), log=logs.append)
    initial = jax.device_get(nnx.to_pure_dict(run.state.params))
    run.train()
    return tmp, reached, run, logs, initial


@pytest.mark.slow
def test_sigterm_during_sft_saves_sft_progress_and_resume_does_not_redo_it(sft_stopped):
    """A signal in the SFT warm start leaves a checkpoint of the SFT step reached; the resumed run
    continues from that step (no second pre-SFT evaluation, no SFT step repeated) and goes on to RL."""
    tmp, reached, run, logs, _ = sft_stopped
    assert reached >= 10 and (tmp / "run" / "sft_checkpoints" / str(reached)).is_dir()
    assert any(f"resumed from {tmp / 'run' / 'sft_checkpoints'}/{reached} (SFT step {reached}/" in ln
               for ln in logs), logs
    rows = [json.loads(ln) for ln in (tmp / "run" / "metrics.jsonl").read_text().splitlines()]
    kinds = [r["kind"] for r in rows]
    assert kinds.count("eval_before_sft") == 1 and kinds.count("train") == 2
    sft_steps = [r["step"] for r in rows if r["kind"] == "sft"]
    end = reached + 10
    assert sft_steps == [s for s in range(1, end + 1) if s % 10 == 0 or s == end], sft_steps  # each once
    assert run.state.sft_step == reached + 10 and run.state.stage == "rl" and run.state.step == 2


@pytest.mark.slow
def test_kl_reference_is_the_policy_at_the_start_of_rl(sft_stopped):
    """With an SFT warm start and kl_coef > 0, the first update's KL is that of the policy to itself:
    the reference is taken after SFT, not at build time (a random model for `scratch`)."""
    tmp, _, run, _, initial = sft_stopped
    moved = max(float(np.abs(a - b).max()) for a, b in
                zip(jax.tree.leaves(initial), jax.tree.leaves(jax.device_get(nnx.to_pure_dict(run.state.ref_params)))))
    assert moved > 1e-2  # the reference is the SFT-ed policy, not the random initialisation
    assert train_rows(tmp / "run")[1]["kl"] < 1e-6


def _compare_runs(whole_dir, other_dir, steps, ref_params, params, *, stopped_by_config=False):
    a, b = train_rows(whole_dir), train_rows(other_dir)
    assert sorted(b) == list(range(1, steps + 1))
    for step in range(1, steps + 1):
        assert a[step].keys() == b[step].keys()
        for k, v in a[step].items():
            want = pytest.approx(v, rel=1e-5, abs=1e-6) if isinstance(v, float) else v
            assert b[step][k] == want, (step, k)

    def kinds(d):
        rows = [(r["kind"], r["step"]) for r in map(json.loads, (Path(d) / "metrics.jsonl").read_text().splitlines())]
        # a run ended by train.steps=2 evaluates at its last step, which the longer run does not
        return [r for r in rows if r != ("eval", 2)] if stopped_by_config else rows

    assert kinds(whole_dir) == kinds(other_dir)  # SFT and evaluation rows kept, none repeated
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, atol=1e-6), ref_params,
                 jax.device_get(nnx.to_pure_dict(params)))


# a reward function that fails on every training row (weight 0: the rewards are the built-in scorer's): the run's
# reward_errors grow every step, and a resumed run must count on from its checkpoint's (it restarted at 0)
_FAILING = json.dumps([{"name": f"{Path(__file__).resolve().parents[1] / 'reward_fns.py'}:raises_in_training",
                        "weight": 0}])
RESUME_EXTRAS = ("sft.steps=20", "sft.batch_size=16", "algo.kl_coef=0.05", "algo.minibatches=2",
                 "algo.micro_batch=16", "train.async_checkpoint=true", "eval.every=3", f"reward.functions={_FAILING}")


@pytest.mark.slow
def test_resume_matches_an_uninterrupted_run(tmp_path):
    """SFT -> RL with a KL reference, two minibatches per step and asynchronous checkpoints: stopped
    cleanly after step 2, or killed with SIGKILL in the middle of the run, the resumed run equals the
    uninterrupted one (every metric, every row of metrics.jsonl of every kind, every parameter)."""
    steps = 6
    whole = tiny_cfg(tmp_path / "a", f"train.steps={steps}", *RESUME_EXTRAS)
    run = Run(whole, log=lambda *a: None)
    run.train()
    ref_params = jax.device_get(nnx.to_pure_dict(run.state.params))

    Run(tiny_cfg(tmp_path / "b", "train.steps=2", *RESUME_EXTRAS), log=lambda *a: None).train()
    resumed = Run(tiny_cfg(tmp_path / "b", f"train.steps={steps}", *RESUME_EXTRAS), log=lambda *a: None)
    resumed.train()
    assert resumed.state.step == steps
    assert train_rows(tmp_path / "b" / "run")[steps]["reward_errors"] == 64 * steps  # every training row's call
    _compare_runs(whole.train.out_dir, tmp_path / "b" / "run", steps, ref_params, resumed.state.params,
                  stopped_by_config=True)

    killed = tiny_cfg(tmp_path / "c", f"train.steps={steps}", *RESUME_EXTRAS)
    proc = spawn_train(tmp_path, killed)
    wait_for_row(proc, Path(killed.train.out_dir) / "metrics.jsonl", '"step": 3, "kind": "train"')
    proc.kill()
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    logs = []
    again = Run(killed, log=logs.append)
    again.train()
    assert any("resumed from" in ln for ln in logs) and again.state.step == steps
    _compare_runs(whole.train.out_dir, killed.train.out_dir, steps, ref_params, again.state.params)


@pytest.mark.slow
def test_damaged_newest_checkpoint_falls_back_to_an_intact_one(tmp_path):
    cfg = tiny_cfg(tmp_path, "train.steps=4")
    Run(cfg, log=lambda *a: None).train()
    ckpts = Path(cfg.train.out_dir) / "checkpoints"
    assert sorted(int(p.name) for p in ckpts.iterdir() if p.name.isdigit()) == [0, 2, 4]

    def damage(step):
        files = [f for f in (ckpts / str(step) / "arrays").rglob("*") if f.is_file() and f.stat().st_size > 64]
        assert files
        for f in files:
            os.truncate(f, f.stat().st_size // 2)

    damage(4)
    logs = []
    run = Run(tiny_cfg(tmp_path, "train.steps=6"), log=logs.append)
    assert run.try_resume() and run.state.step == 2
    assert any(f"checkpoint {ckpts}/4 is damaged" in ln for ln in logs), logs
    assert (ckpts.parent / "checkpoints.damaged" / "4").is_dir() and not (ckpts / "4").exists()
    run.train()  # goes on from step 2 and saves new checkpoints 4 and 6
    assert run.state.step == 6 and (ckpts / "6").is_dir()
    assert sorted(train_rows(cfg.train.out_dir)) == list(range(1, 7))

    for step in (2, 4, 6):
        damage(step)
    from jaxrl_llm.train.checkpoint import CheckpointDamagedError
    with pytest.raises(CheckpointDamagedError, match=r"no intact checkpoint \(damaged: 6, 4, 2"):
        Run(tiny_cfg(tmp_path, "train.steps=8"), log=lambda *a: None).try_resume()


@pytest.mark.slow
def test_sampler_uses_the_models_context_length(toy_run):
    from jaxrl_llm.sampling.sampler import PromptTooLongError
    run = toy_run[2]
    assert run.sampler.max_cache_len == 96  # model.scratch.max_position_embeddings
    with pytest.raises(PromptTooLongError, match="cache of 96"):
        run.sampler(run.state.params, [[5] * 96], max_new_tokens=4)


@pytest.mark.slow
def test_bf16_sampling_follows_the_trainers_numbers(tmp_path):
    """bf16 compute: the sampler samples with the weights in the compute dtype, so the first update's
    ratio is ~1; with recompute_old_logp the old log-probs are the trainer's own. One run with
    recompute_old_logp measures both gaps: sampler -> recomputed (the trainer's forward outside the update)
    and recomputed -> the update's own forward, whose sum bounds the sampler -> update gap."""
    cfg = tiny_cfg(tmp_path, "train.steps=1", "model.compute_dtype=bfloat16", "algo.micro_batch=64",
                    "algo.recompute_old_logp=true")
    Run(cfg, log=lambda *a: None).train()
    row = train_rows(cfg.train.out_dir)[1]
    assert row["logp_gap_sampler_trainer"] < 1e-6
    assert row["logp_gap_sampler_recomputed"] < 2e-5
    # sampling with the float32 master weights instead gives 2.5e-4 here (sampler -> update, without recompute)
    assert row["logp_gap_sampler_recomputed"] + row["logp_gap_sampler_trainer"] < 2e-5, row
    assert row["clip_low"] == 0 and row["clip_high"] == 0


@pytest.mark.slow
def test_eval_leaves_the_recorded_config_and_a_finished_run_says_so(toy_run, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # eval writes eval_out/ in the working directory
    import yaml
    from jaxrl_llm.cli import main
    _, cfg, _, _ = toy_run
    recorded = (Path(cfg.train.out_dir) / "config.yaml").read_text()
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(cfg.to_dict()))
    capsys.readouterr()
    # an override the recorded config does not have (one that keeps the run's shapes: nothing new to compile)
    assert main(["eval", "--config", str(config), "eval.every=7"]) == 0
    assert (Path(cfg.train.out_dir) / "config.yaml").read_text() == recorded
    assert '"step": 12' in capsys.readouterr().out
    final = Path(cfg.train.out_dir) / "final" / "model.safetensors"
    stamp = final.stat().st_mtime_ns
    logs = []
    Run(cfg, log=logs.append).train()
    assert any("is complete: 12 of train.steps=12 RL steps done; final policy in" in ln for ln in logs), logs
    assert final.stat().st_mtime_ns == stamp  # not exported again
    # an export over it killed half-way (weights written, then the process dies: train.steps raised and the run
    # continued) leaves the old final/ whole; before, its old config.json beside torn weights read as complete
    from jaxrl_llm.train import report

    def dies(model, folder, tok, dtype=None):
        (Path(folder) / "model.safetensors").write_bytes(b"torn")
        raise KeyboardInterrupt

    monkeypatch.setattr(report, "export_policy", dies)
    with pytest.raises(KeyboardInterrupt):
        report.export_final(Run(cfg, log=logs.append), final.parent)
    assert final.stat().st_mtime_ns == stamp and (final.parent / "config.json").is_file()
    assert [p.name for p in final.parent.parent.iterdir() if p.name.startswith(".final")] == []


@pytest.mark.slow
def test_a_sigterm_while_the_run_closes_lets_its_last_save_and_export_finish(toy_run, tmp_path, monkeypatch):
    """The signal handlers were gone once the RL loop ended, while the last (async) checkpoint could still be
    committing and before the export: a SIGTERM then killed the process at once. Now the run finishes both and
    says so. (A handler of the test's own stands for the default action, which would end pytest.)"""
    import shutil

    from jaxrl_llm.train import report

    tmp, cfg, _, _ = toy_run
    copy = tmp_path / "run"
    shutil.copytree(cfg.train.out_dir, copy, ignore=shutil.ignore_patterns("run.lock"))
    more = tiny_cfg(tmp, "train.steps=13", "train.export_final=true", f"train.out_dir={copy}")
    export, killed = report.export_final, []

    def signalled_export(run, final):
        os.kill(os.getpid(), signal.SIGTERM)
        export(run, final)

    monkeypatch.setattr(report, "export_final", signalled_export)
    outer = signal.signal(signal.SIGTERM, lambda *a: killed.append(a))
    try:
        logs = []
        Run(more, log=logs.append).train()
    finally:
        signal.signal(signal.SIGTERM, outer)
    assert killed == [] and any("signal (SIGTERM) arrived while the run closed" in ln for ln in logs), logs[-5:]
    assert (copy / "final" / "config.json").is_file() and train_rows(copy).keys() == set(range(1, 14))


@pytest.mark.slow
def test_checkpoint_of_another_model_shape_is_refused(toy_run):
    tmp, *_ = toy_run
    other = tiny_cfg(tmp, "train.steps=14", "model.scratch.num_layers=2")
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
    cfg = tiny_cfg(tmp_path, "data.max_prompt_len=60", f"data.overlong={mode}")
    from jaxrl_llm.model.char_tokenizer import char_tokenizer
    from jaxrl_llm.data.types import TaskItem
    items = [TaskItem("a", "short?", "1", "exact"), TaskItem("b", "x" * 100, "1", "exact")]
    kept, dropped, cut = encode_items(char_tokenizer(), cfg, items)
    if mode == "drop":
        assert (dropped, cut) == (1, 0) and [it.uid for it, _ in kept] == ["a"]
    else:
        assert (dropped, cut) == (0, 1) and len(kept[1][1]) == 60


def test_held_out_items_never_repeat_a_training_question():
    from jaxrl_llm.data.tasks import load_splits
    cfg = load_config(ROOT / "configs" / "toy.yaml")
    train, held = load_splits(cfg.data)
    assert len(train) == cfg.data.train_size and 0 < len(held) <= cfg.data.eval_size
    assert not {it.question for it in train} & {it.question for it in held}


def test_held_out_items_left_out_for_repeating_training_are_counted_and_said(tmp_path):
    """Held-out items that repeat a training question were dropped without a word; with data.eval_path the
    training file itself, none was left and only the summary at the end said so."""
    from jaxrl_llm.train.build import load_data

    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"question": f"q{i}", "answer": "1"}) + "\n" for i in range(6)))
    held = tmp_path / "h.jsonl"
    held.write_text("".join(json.dumps({"question": f"q{i}", "answer": "1"}) + "\n" for i in range(4, 9)))
    logs = []
    raw = load_data(load_config(None, ["data.source=jsonl", f"data.path={data}", f"data.eval_path={held}"]),
                    logs.append)
    assert [it.question for it in raw.eval] == ["q6", "q7", "q8"] and raw.repeated == 2
    assert logs == ["2 held-out items repeat a training question: left out of the evaluation (3 kept)"]
    logs = []
    raw = load_data(load_config(None, ["data.source=jsonl", f"data.path={data}", f"data.eval_path={data}"]),
                    logs.append)
    assert raw.eval == [] and len(logs) == 1 and logs[0].startswith(
        "every one of the 6 held-out items repeats a training question, so the run evaluates on none")


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


def test_separate_sft_items_never_repeat_an_rl_or_held_out_question():
    from jaxrl_llm.data.tasks import load_sft_items, load_splits

    cfg = load_config("configs/toy.yaml", ["data.train_size=200", "data.eval_size=200", "data.sft_size=300"])
    train, held = load_splits(cfg.data)
    sft = load_sft_items(cfg.data)
    assert len(sft) > 250 and len(held) > 50
    questions = lambda items: {it.question for it in items}  # noqa: E731
    assert not questions(sft) & questions(train) and not questions(held) & (questions(train) | questions(sft))
    assert load_sft_items(load_config("configs/toy.yaml", ["data.train_size=200"]).data) == []


def test_difficulty_column_is_checked_per_row(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"question": "a", "answer": "1", "difficulty": 0.5}) + "\n"
                    + json.dumps({"question": "b", "answer": "2", "difficulty": 3}) + "\n")
    with pytest.raises(DataError, match=r"d.jsonl: row 1 has difficulty 3(\.0)?; give a number in \[0, 1\]"):
        load_items(load_config(None, ["data.source=jsonl", f"data.path={data}"]).data, "train")
