"""`jaxrl-llm eval` on any checkpoint or model folder (train/eval_cmd.py, train/restore.py), `jaxrl-llm export`
(train/export.py) checked against transformers, and `prepare-model` on a local folder, a GGUF file and an
offline Hub id (model/registry.py). One tiny trained run (tests/test_trainer.py's config) serves every test."""

import json
import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import yaml
from flax import nnx

from tests.helpers import TINY, tiny_cfg, byte_bpe_tokenizer, forward_logits, torch_or_skip, write_gguf

from jaxrl_llm.cli import main
from jaxrl_llm.model.gguf_io import load_gguf
from jaxrl_llm.model.hf_io import load_hf_folder, weight_map
from jaxrl_llm.model.registry import HubUnavailableError, UnknownModelError, prepare, resolve
from jaxrl_llm.model.transformer import init_model
from jaxrl_llm.parallel.mesh import make_mesh
from jaxrl_llm.rewards.verifiers import score
from jaxrl_llm.train.loop import Run
from jaxrl_llm.train.restore import load_checkpoint

pytestmark = pytest.mark.slow  # integration runs: tools/test.sh runs them, `-m "not slow"` leaves them out


def _snapshot(folder: Path) -> dict:
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _rows(folder: Path) -> list[dict]:
    return [json.loads(ln) for ln in (folder / "completions.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A 2-step tiny run (checkpoints 0 and 2), its config file, and its files as training left them."""
    tmp = tmp_path_factory.mktemp("eval")
    cfg = tiny_cfg(tmp, "train.steps=2")
    Run(cfg, log=lambda *a: None).train()
    config = tmp / "run.yaml"
    config.write_text(yaml.safe_dump(cfg.to_dict()))
    out = Path(cfg.train.out_dir)
    return cfg, str(config), out, _snapshot(out), tmp


@pytest.fixture(scope="module")
def exported(run):
    """Checkpoint 2 exported twice: float32 and the default bfloat16."""
    _, config, _, _, tmp = run
    for dtype in ("float32", "bfloat16"):
        args = ["export", "--config", config, "--step", "2", "--out", str(tmp / f"export-{dtype}")]
        assert main(args + ([] if dtype == "bfloat16" else ["--dtype", dtype])) == 0
    return {d: tmp / f"export-{d}" for d in ("float32", "bfloat16")}


@pytest.fixture(scope="module")
def step2(run):
    """`jaxrl-llm eval --step 2` with the default temperatures: its summary, printed and written, and its rows."""
    _, config, _, _, tmp = run
    out = tmp / "eval-step2"
    with pytest.MonkeyPatch.context() as mp:
        printed = []
        mp.setattr("builtins.print", lambda *a, **kw: printed.append(a[0]) if "file" not in kw else None)
        assert main(["eval", "--config", config, "--step", "2", "--out", str(out)]) == 0
    return json.loads(printed[-1]), json.loads((out / "summary.json").read_text()), _rows(out)


def test_eval_of_a_step_writes_every_completion_and_matches_the_runs_own_evaluation(run, step2):
    cfg, config, out_dir, _, tmp = run
    printed, summary, rows = step2
    assert printed == summary
    n, k = 8, cfg.eval.samples  # eval.size held-out problems; default temperatures 0, 1 (= the rollout T)
    assert summary["step"] == 2 and summary["problems"] == n and summary["temperatures"] == [0.0, 1.0]
    assert len(rows) == n * (1 + k)
    assert [r["sample"] for r in rows if r["temperature"] == 1.0] == list(range(k)) * n
    # the oracle: each completion scored again by the verifier itself, outside the reward pool
    for r in rows:
        assert r["reward"] == score("exact", r["answer"], "", r["completion"], cfg.data.answer_format).reward, r
        assert r["correct"] == (r["reward"] == 1.0) and r["tokens"] == 1 and len(r["completion"]) <= 1
    assert 0 < sum(r["correct"] for r in rows) < len(rows)  # the figures below compare something
    greedy = [r["correct"] for r in rows if r["temperature"] == 0.0]
    assert summary["greedy_accuracy"] == pytest.approx(np.mean(greedy))

    # the run's own evaluation of the same checkpoint: every figure it reports is the same number
    reference = Run(cfg, log=lambda *a: None, read_only=True)
    assert reference.try_resume() and reference.state.step == 2
    with reference.reward_pool() as pool:
        figures = reference.evaluate(pool)
    reference.ckpt.close()
    shared = [key for key in figures if key not in ("time_eval_s", "cpu_eval_s")]
    assert {key: summary[key] for key in shared} == {key: figures[key] for key in shared}


def test_the_runs_own_per_problem_outcomes_are_what_eval_samples_again(run, step2):
    """The trainer writes each RL-stage evaluation's per-problem outcomes (train/outcomes.py) as it evaluates:
    step 2's are, completion for completion, what `jaxrl-llm eval --step 2` samples and scores from the
    checkpoint (another code path, the same keys)."""
    from jaxrl_llm.train import outcomes

    _, _, out_dir, _, _ = run
    _, _, rows = step2
    assert sorted(p.name for p in (out_dir / outcomes.FOLDER).iterdir()) == ["step0.jsonl", "step2.jsonl"]
    keys = ("uid", "question", "temperature", "sample", "reward", "correct")
    mine = outcomes.completion_rows(outcomes.path(out_dir, 2))
    assert len(mine) == len(rows)
    assert sorted(tuple(r[k] for k in keys) for r in mine) == sorted(tuple(r[k] for k in keys) for r in rows)
    assert 0 < sum(r["correct"] for r in mine) < len(mine)


def test_eval_of_an_older_step_and_of_an_exported_folder(run, step2, exported, monkeypatch):
    cfg, config, _, _, tmp = run
    monkeypatch.chdir(tmp)  # the default output folder is relative to the working directory
    assert main(["eval", "--config", config, "--step", "0", "--temperature", "0", "--", "eval.size=4"]) == 0
    default = tmp / "eval_out" / "run-step0"
    assert json.loads((default / "summary.json").read_text())["step"] == 0 and len(_rows(default)) == 4

    # the float32 export of step 2 answers greedily exactly as checkpoint 2 does (sampled rows draw with the
    # model's own key root, step 0)
    args = ["--temperature", "0", "0.7", "--samples", "3", "--pass-k", "1", "3"]
    assert main(["eval", "--config", config, "--model", str(exported["float32"]), "--out", str(tmp / "hf"), *args]) == 0
    theirs = _rows(tmp / "hf")
    assert len(theirs) == 8 * (1 + 3) and [r["temperature"] for r in theirs].count(0.7) == 24
    greedy = [(r["uid"], r["completion"], r["reward"]) for r in step2[2] if r["temperature"] == 0.0]
    assert greedy == [(r["uid"], r["completion"], r["reward"]) for r in theirs if r["temperature"] == 0.0]
    summary = json.loads((tmp / "hf" / "summary.json").read_text())
    assert summary["source"] == str(exported["float32"])
    assert set(summary["by_temperature"]["0.7"]) >= {"pass@1", "pass@3"} and "pass@2" not in summary["by_temperature"]["0.7"]
    correct = np.array([r["correct"] for r in theirs if r["temperature"] == 0.7]).reshape(8, 3)
    assert summary["by_temperature"]["0.7"]["pass@3"] == pytest.approx(correct.any(axis=1).mean())


def _our_logits(graphdef, params, ids):
    return np.asarray(forward_logits(graphdef, params, jnp.asarray([ids])))[0]


def test_export_loads_in_transformers_with_our_logits(run, exported):
    torch = torch_or_skip()
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    cfg, *_ = run
    loaded = load_checkpoint(cfg, make_mesh(), "2", log=lambda *a: None)
    tok = loaded.policy.tokenizer
    ids = tok("Held 3: what is the magic word?")["input_ids"]
    for dtype, folder in exported.items():
        assert AutoTokenizer.from_pretrained(str(folder))("Held 3: what is the magic word?")["input_ids"] == ids
        assert GenerationConfig.from_pretrained(str(folder)).eos_token_id == tok.eos_token_id
        hf = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
        with torch.no_grad():
            theirs = hf(torch.tensor([ids])).logits[0].numpy()
        # bfloat16: the same weights rounded to bfloat16, then both computed in float32
        params = loaded.params if dtype == "float32" else jax.tree.map(
            lambda x: x.astype(jnp.bfloat16).astype(jnp.float32), loaded.params)
        np.testing.assert_allclose(theirs, _our_logits(loaded.policy.graphdef, params, ids), atol=2e-4, rtol=2e-4)
    size = {d: (f / "model.safetensors").stat().st_size for d, f in exported.items()}
    assert size["bfloat16"] < 0.6 * size["float32"]


def test_prepare_model_checks_a_folder_converts_a_gguf_and_names_an_offline_hub_id(run, exported, tmp_path,
                                                                                    monkeypatch):
    monkeypatch.setenv("JAXRL_LLM_CACHE", str(tmp_path / "cache"))
    folder = exported["bfloat16"]
    assert prepare(str(folder)) == folder
    broken = tmp_path / "no-tokenizer"
    shutil.copytree(folder, broken, ignore=shutil.ignore_patterns("tokenizer*"))
    with pytest.raises(UnknownModelError, match=rf"{broken}: not a usable model folder: no tokenizer files"):
        prepare(str(broken))

    tok = byte_bpe_tokenizer()
    model_cfg = TINY.replace(vocab_size=tok.get_vocab_size(), tie_embeddings=False)
    model = init_model(model_cfg, seed=5)
    pure = nnx.to_pure_dict(nnx.state(model))
    arrays = {}
    for path, name, _, to_hf in weight_map(model_cfg):
        leaf = pure
        for key in path:
            leaf = leaf[key]
        arrays[name] = np.asarray(to_hf(np.asarray(leaf)), np.float32)
    gguf = tmp_path / "tiny.gguf"
    write_gguf(gguf, model_cfg, arrays, tok)
    converted = prepare(str(gguf), log=lambda *a: None)
    assert converted.parent == tmp_path / "cache" / "models" and resolve(str(gguf)) == converted
    ids = [[5, 17, 42, 7]]
    from_gguf, _ = load_gguf(gguf)
    from_folder, _ = load_hf_folder(converted)
    for a, b in ((from_gguf, from_folder), (model, from_folder)):
        np.testing.assert_allclose(np.asarray(forward_logits(*nnx.split(a), jnp.asarray(ids))),
                                   np.asarray(forward_logits(*nnx.split(b), jnp.asarray(ids))), atol=1e-5)

    with pytest.raises(HubUnavailableError, match=r"cannot download 'nobody/no-such-model' from the Hugging Face Hub: "
                                                  r"offline \(HF_HUB_OFFLINE=1\); on a machine with network run "
                                                  r"`hf download nobody/no-such-model --local-dir DIR`"):
        prepare("nobody/no-such-model")
    with pytest.raises(UnknownModelError, match=r"jaxrl-llm prepare-model nobody/no-such-model"):
        resolve("nobody/no-such-model")


def test_eval_and_export_refuse_to_write_inside_the_run_and_leave_it_as_training_left_it(run, capsys):
    _, config, out_dir, before, tmp = run
    capsys.readouterr()
    assert main(["eval", "--config", config, "--out", str(out_dir / "evals")]) == 2
    assert main(["export", "--config", config, "--out", str(out_dir / "hf")]) == 2
    err = capsys.readouterr().err
    assert err.count(f"is inside the run folder {out_dir}; `jaxrl-llm eval` and `export` never write into a "
                     f"training run") == 2
    assert main(["eval", "--config", config, "--step", "3"]) == 2
    assert f"{out_dir}/checkpoints/3: no such checkpoint (RL steps: [0, 2]" in capsys.readouterr().err
    # every eval and export of this module read the run; none wrote, moved or touched a file of it
    assert _snapshot(out_dir) == before
