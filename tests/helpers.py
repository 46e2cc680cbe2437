"""What several test files share: the tiny model config and tokenizers, a tiny end-to-end run config, trainer
subprocesses, metrics readers, a GGUF writer. Test files import it as `from tests.helpers import ...`
(tests/ is a package; pytest puts the repository root on sys.path for it), never from one another.
tests/conftest.py sets XLA_FLAGS before anything here imports jax; the trainer's modules are imported where used,
so that conftest (which imports this) loads while any part of the trainer is broken."""

import functools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import yaml
from flax import nnx

from jaxrl_llm.model.config import ModelConfig
from tests import FAST_COMPILE

ROOT = Path(__file__).resolve().parents[1]
# JAXRL_TEST_JAX_CACHE: another folder (an empty one measures the suite as CI's fresh checkout runs it)
CACHE_DIR = os.environ.get("JAXRL_TEST_JAX_CACHE", str(ROOT / ".cache" / "jax"))

TINY = ModelConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                   num_kv_heads=2, head_dim=16, rope_theta=500.0, max_position_embeddings=256)

CHAT = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TEXT = ["The quick brown fox jumps over the lazy dog.", "What is 12 + 35? The answer is 47.",
        "Reasoning step by step: first add the tens, then the ones."] * 20
TIMING = ("time", "cpu_", "_per_s", "compilations")  # wall-clock and CPU-time figures differ between runs


def byte_bpe_tokenizer():
    """A small byte-level BPE (`tokenizers.Tokenizer`) trained here, with chat special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(TEXT, trainer)
    return tok


def hf_tokenizer(tok):
    """The same tokenizer as a transformers fast tokenizer with a chat template."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", bos_token="<|im_start|>",
                                   pad_token="<|endoftext|>", chat_template=CHAT)


@functools.partial(jax.jit, static_argnums=0)
def forward_logits(graphdef, state, ids):
    """Logits [B, T, V] of a plain causal forward of our model, as one compiled program (an oracle run eagerly
    compiles each of its ops on its own: hundreds of small programs per test)."""
    model = nnx.merge(graphdef, state)
    hidden, _ = model(ids, jnp.arange(ids.shape[1])[None])
    return model.logits(hidden)


def torch_or_skip():
    return pytest.importorskip("torch", reason="torch is the test oracle; install the test extra (torch==2.13.0)")


def update_batch(vocab_size: int, rows: int = 16, length: int = 24, seed: int = 0):
    """A random rows-layout update batch: tokens, a response span per row, old log-probs, advantages and
    temperatures, the last row invalid (padding)."""
    from jaxrl_llm.rl.batch import RowBatch

    rng = np.random.RandomState(seed)
    tokens = rng.randint(1, vocab_size, size=(rows, length)).astype(np.int32)
    mask = np.zeros((rows, length), bool)
    for i in range(rows):
        start = rng.randint(4, 10)
        mask[i, start:start + rng.randint(3, length - start)] = True
    return RowBatch.make(tokens, mask, old_logp=np.where(mask, rng.uniform(-5.0, -3.0, size=(rows, length)), 0),
                         advantages=rng.randn(rows), temperature=rng.uniform(0.5, 1.5, rows),
                         valid=np.arange(rows) < rows - 1)


def with_random_adapters(model, rank: int = 4, alpha: float = 8.0, seed: int = 1, scale: float = 0.2, targets=None):
    """`model` with LoRA adapters (model/lora.py) on `targets` (default: every projection), in place, whose B is
    random too: fresh adapters have B = 0 and change nothing (and give A no gradient)."""
    from jaxrl_llm.model import lora

    lora.add_adapters(model, lora.LoraSpec(rank, alpha, tuple(targets or lora.TARGETS)), seed)
    for n, (_, _, module, name) in enumerate(lora.adapted(model)):
        b = getattr(module, f"{name}_lora_b")
        b[...] = jax.random.normal(jax.random.key(100 + n), b.shape) * scale
    return model


def tiny_cfg(tmp_path, *extra):
    """A tiny end-to-end run (scratch 1-layer model, 40 one-answer questions, 8 held out) in `tmp_path`."""
    from jaxrl_llm.config import load_config

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
        "train.async_checkpoint=false", "train.tensorboard=false", "train.export_final=false",
        # the memory plan compiles the update ahead of step 1; its own tests (test_memory_plan.py) turn it on
        "train.memory_check=false", *extra])


def e3_cfg(tmp_path, *extra):
    """8 prompts with a data-set difficulty, 4 a step: an epoch is 2 steps, so the bounds widen to
    (4, 12) by step 4 and the allocation follows the seeded ranks from then on."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    data = tmp_path / "ranked.jsonl"
    data.write_text("".join(json.dumps({"question": f"Question {i}: what is the magic word?", "answer": "7",
                                        "scorer": "exact", "difficulty": i / 7}) + "\n" for i in range(8)))
    return tiny_cfg(tmp_path, f"data.path={data}", "rollout.group_size=8", "rollout.max_new_tokens=2",
                     "algo.micro_batch=8", "explore.e3.enabled=true", "explore.e3.rank_every=100", *extra)


def rrl_cfg(tmp_path, *extra):
    """E3 + RRL + HeRL on e3_cfg's 8 ranked prompts, 4 a step (an epoch is 2 steps: E3's bounds widen
    to (4, 12) by step 4, ranks re-ranked every 2 steps), after 8 SFT steps; RRL cuts every token of the
    4-token responses and replays up to 4 states x 4 continuations from step 2 on; HeRL revises up to 4
    candidates of the failed fresh groups a step (no rubric: the revise prompt has the draft only), keeping
    ties at the group's best (keep=at_least) so that every failed group swaps one in."""
    return e3_cfg(tmp_path, "rollout.max_new_tokens=4", "algo.micro_batch=32", "explore.e3.rank_every=2",
                   "sft.steps=8", "sft.batch_size=8", "sft.lr=0.01", "explore.rrl.enabled=true",
                   "explore.rrl.boundary=tokens", "explore.rrl.every_tokens=1", "explore.rrl.warmup_steps=1",
                   "explore.rrl.replay_ratio=0.5", "explore.rrl.capacity=64", "explore.rrl.priority_temperature=0.5",
                   "train.steps=7", "train.checkpoint_every=100", "eval.every=100",
                   "explore.herl.enabled=true", "explore.herl.candidate_limit=4", "explore.herl.keep=at_least",
                   "explore.herl.revise_template='{question} D {draft} M {met} U {unmet}'",
                   "model.scratch={hidden_size: 32, intermediate_size: 64, num_layers: 1, num_heads: 2, "
                   "num_kv_heads: 1, head_dim: 16, max_position_embeddings: 256, tie_embeddings: true}", *extra)


# The E3 + RRL + HeRL reference run (tests/conftest.py `rrl_reference`): five steps, a checkpoint every step,
# evaluation at steps 0 and 5. The bounds reach (4, 12) at step 5, replay runs from step 2, E3 re-ranks at step 4.
RRL_STEPS = 5
RRL_REFERENCE = (f"train.steps={RRL_STEPS}", "train.checkpoint_every=1", "eval.every=5", "eval.size=8")


def train_rows(out_dir):
    """metrics.jsonl's train rows by step, without the wall-clock figures."""
    rows = [json.loads(ln) for ln in (Path(out_dir) / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: {k: v for k, v in r.items() if not any(t in k for t in TIMING)}
            for r in rows if r["kind"] == "train"}


def compilations(out_dir) -> list[int]:
    from jaxrl_llm.train.metrics import read_rows

    return [r["compilations"] for r in read_rows(Path(out_dir) / "metrics.jsonl") if r["kind"] == "train"]


def spawn_train(tmp_path, cfg):
    config = tmp_path / f"run-{time.monotonic_ns()}.yaml"
    config.write_text(yaml.safe_dump(cfg.to_dict()))
    return subprocess.Popen([sys.executable, "-m", "jaxrl_llm.cli", "train", "--config", str(config)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=subprocess_env())


def subprocess_env(fast_compile: bool = True, **extra) -> dict:
    """This environment plus the tests' compile cache (tests/conftest.py) at its threshold: a program another
    test or process compiled is read back, not compiled again. XLA_FLAGS given here keep FAST_COMPILE unless
    `fast_compile` is False."""
    env = {**os.environ, "JAX_COMPILATION_CACHE_DIR": CACHE_DIR, "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS":
           str(jax.config.jax_persistent_cache_min_compile_time_secs), **extra}
    if fast_compile and "XLA_FLAGS" in extra and FAST_COMPILE in os.environ.get("XLA_FLAGS", ""):
        env["XLA_FLAGS"] = f"{extra['XLA_FLAGS']} {FAST_COMPILE}"
    return env


def wait_for_row(proc, metrics: Path, pattern: str, timeout: float = 240):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if metrics.exists() and pattern in metrics.read_text():
            return
        time.sleep(0.02)
    raise AssertionError(f"no {pattern!r} row in {metrics} (process exit {proc.poll()})")


def sigterm_after_row(tmp_path, cfg, pattern: str) -> str:
    """Train `cfg` in a subprocess, SIGTERM it once metrics.jsonl has a row matching `pattern`; the
    process must save and exit with RESUME_EXIT_CODE (what launch scripts rerun on). Returns its output."""
    from jaxrl_llm.train.stop import RESUME_EXIT_CODE

    proc = spawn_train(tmp_path, cfg)
    wait_for_row(proc, Path(cfg.train.out_dir) / "metrics.jsonl", pattern)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == RESUME_EXIT_CODE, out[-2000:]
    return out


def truncate_data(step_dir: Path) -> None:
    """Damage a saved checkpoint step: every array data file cut to half its size."""
    files = [f for f in (step_dir / "arrays").rglob("d/*") if f.is_file() and f.stat().st_size > 64]
    assert files
    for f in files:
        os.truncate(f, f.stat().st_size // 2)


def _gguf_name(hf):
    from jaxrl_llm.model.gguf_io import hf_name
    return {hf_name(g): g for g in
            ["token_embd.weight", "output_norm.weight", "output.weight"] +
            [f"blk.{i}.{n}.weight" for i in range(TINY.num_layers) for n in
             ["attn_norm", "ffn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up",
              "ffn_down"]]}[hf]


def write_gguf(path, cfg, arrays, tok, *, arch="llama", quantized=(), raw_override=None, extra=None):
    """A GGUF file of `arrays` (HF tensor names) and the byte-level BPE `tok`, written with the `gguf` package."""
    from gguf import GGMLQuantizationType, GGUFWriter
    from gguf.quants import quantize

    from jaxrl_llm.model.gguf_io import permute_qk

    w = GGUFWriter(str(path), arch)
    w.add_block_count(cfg.num_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_heads)
    w.add_head_count_kv(cfg.num_kv_heads)
    w.add_rope_freq_base(cfg.rope_theta)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_dimension_count(cfg.head_dim)
    vocab = tok.get_vocab()
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([3 if t in SPECIAL else 1 for t in tokens])
    w.add_token_merges([" ".join(m) if isinstance(m, (list, tuple)) else m
                        for m in json.loads(tok.to_str())["model"]["merges"]])
    w.add_bos_token_id(vocab["<|im_start|>"])
    w.add_eos_token_id(vocab["<|im_end|>"])
    w.add_chat_template(CHAT)
    for hf, arr in arrays.items():
        name = _gguf_name(hf)
        if hf.endswith("q_proj.weight"):
            arr = permute_qk(arr, cfg.num_heads)
        elif hf.endswith("k_proj.weight"):
            arr = permute_qk(arr, cfg.num_kv_heads)
        if raw_override and name in raw_override:
            w.add_tensor(name, raw_override[name][0], raw_dtype=raw_override[name][1])
        elif name in quantized:
            w.add_tensor(name, quantize(arr, GGMLQuantizationType.Q8_0), raw_dtype=GGMLQuantizationType.Q8_0)
        else:
            w.add_tensor(name, arr)
    for name, arr in (extra or {}).items():
        w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def done_marker(spec, arm: str, seed: int) -> str:
    """ablation_done.json's text as the harness writes it when (arm, seed) of `spec` (a Spec or a spec file's path)
    finishes: the record counts only for the command it was trained by (jaxrl_llm/ablate/spec.py `record`)."""
    from jaxrl_llm.ablate.spec import load_spec

    spec = load_spec(spec) if isinstance(spec, (str, Path)) else spec
    return spec.done_text(arm, seed, exit_code=0)
