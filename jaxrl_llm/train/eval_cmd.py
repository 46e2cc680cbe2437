"""`jaxrl-llm eval`: any checkpoint of a run, or any model folder, on the config's task, with every completion
written out.

    jaxrl-llm eval --config X [--step N | --model PATH] [--out DIR] [--temperature 0 1.0 0.7]
                   [--samples K] [--pass-k 1 4] [--max-new-tokens M] [a.b=value ...]

The problems are the config's data section (eval.split: held-out or train; the first eval.size), prompted
and scored as in training (chat template, reward scorers in the sandboxed pool, rubric items and the judge).
Each temperature is one pass: greedy (T = 0) answers each problem once, any other T `--samples` times (default
eval.samples). The default temperatures are those of the in-training evaluation (train/evaluate.py): 0, 1 and
the run's rollout temperature, with the same random keys, so `summary.json` holds the figures the run logs for
that step (greedy_accuracy, sampled_accuracy, pass@k, rollout_t_..., revise rounds where configured) plus one
block per temperature under `by_temperature` (accuracy, reward_mean, never_solved_share, pass@k, tokens).
Keys: pass T draws with fold_in(key, p), p = 0 greedy, 1 T = 1, 2 the rollout T, 16 + 2i the i-th other T
(its revise rounds 17 + 2i), key = fold_in(fold_in(key(train.seed of the run), 2), RL step).

Written to `--out` (default `eval_out/<run>-step<N>`, `eval_out/<model folder>` in the current directory;
never inside the run's folder, which is only read; both files are replaced whole when they exist):
    completions.jsonl  one row per completion: uid, question, answer, temperature, sample, completion, reward,
                       correct (solved: the built-in scorer's full marks, or reward.correctness), tokens
                       (generated), met (rubric tasks: 0/1 per rubric item, in the task's order), components
                       (with reward functions: each one's unweighted value); first answers only, revise
                       rounds are counted in the summary
    summary.json       the figures above, with step, split, source, temperatures, samples, pass_k
The summary is printed on stdout as well.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm.config import Config
from jaxrl_llm.data.tasks import load_splits
from jaxrl_llm.model.tokenizer import pad_id, stop_ids
from jaxrl_llm.rewards.judge import Judge, judge_items, load_judge, sampler_generate
from jaxrl_llm.rewards.pool import RewardPool
from jaxrl_llm.rewards.rubrics import rubric_items
from jaxrl_llm.rewards.scoring import Scores
from jaxrl_llm.rl.forward import cast_floats
from jaxrl_llm.rl.spec import rows_per_step
from jaxrl_llm.sampling.sampler import Sampler
from jaxrl_llm.train.evaluate import EVAL_KS, Rounds, sample_graded
from jaxrl_llm.train.metrics import pass_at_k, replace_text
from jaxrl_llm.train.policy import encode_items
from jaxrl_llm.train.restore import Loaded
from jaxrl_llm.train.state import PHASE_EVAL

SAMPLED = ("accuracy", "reward_mean", "never_solved_share")


def problems(cfg: Config, tok) -> list:
    """(item, prompt ids) pairs the run's evaluation scores: eval.split's first eval.size (overlong prompts
    dropped or cut as data.overlong says)."""
    train, held = load_splits(cfg.data)
    items = encode_items(tok, cfg, held if cfg.eval.split == "heldout" else train)[0]
    return items[:cfg.eval.size]


def default_temperatures(cfg: Config) -> list[float]:
    return list(dict.fromkeys([0.0, 1.0, float(cfg.rollout.temperature)]))


def _phase(cfg: Config, temperature: float, index: int) -> int:
    if temperature == 0.0:
        return 0
    if temperature == 1.0:
        return 1
    return 2 if temperature == float(cfg.rollout.temperature) else 16 + 2 * index


def _judge(cfg: Config, items, sampler, params, tok, mesh, rows: int) -> Judge | None:
    judged = [it.uid for it, _ in items if it.rubric and judge_items(rubric_items(it.rubric))]
    if judged and not cfg.reward.judge:
        raise ValueError(f"{len(judged)} tasks have rubric items checked by 'judge' (first: {judged[0]}); set "
                         f"reward.judge=policy (or a local model folder) to have them judged, or remove those items")
    r = cfg.reward
    if r.judge == "policy":
        generate = sampler_generate(sampler, params, tok, r.judge_max_new_tokens, cfg.data.chat_template, min_rows=rows)
    elif r.judge:
        generate = load_judge(r.judge, r.judge_max_new_tokens, mesh, rows)
    else:
        return None
    return Judge(generate, max_retries=r.judge_retries, retry_temperature=r.judge_retry_temperature)


def _figures(scored: Scores, lengths: np.ndarray, n: int, k: int, pass_ks) -> dict:
    correct = scored.correct.reshape(n, k)
    count = correct.sum(axis=1)
    out = {"samples": k, "accuracy": float(correct.mean()), "reward_mean": float(np.mean(scored.rewards)),
           "never_solved_share": float(np.mean(count == 0)), **scored.metrics()}
    out.update({f"pass@{kk}": float(np.mean([pass_at_k(k, int(c), kk) for c in count])) for kk in pass_ks if kk <= k})
    out.update({"tokens": int(lengths.sum()), "response_len_mean": float(lengths.mean())})
    return out


def _legacy(cfg: Config, temperature: float, figures: dict, scored: Scores, rounds: dict) -> dict:
    """The in-training evaluation's names for a pass at T = 0, 1 or the rollout T."""
    out = {}
    if temperature == 0.0:
        out = {"greedy_accuracy": figures["accuracy"], "greedy_reward_mean": figures["reward_mean"],
               **scored.metrics("greedy_"), **{f"revise_{k}": v for k, v in rounds.items()}}
    for prefix, t in (("", 1.0), ("rollout_t_", float(cfg.rollout.temperature))):
        if temperature == t != 0.0:
            out.update({f"{prefix}sampled_{k}" if k != "never_solved_share" else f"{prefix}{k}": figures[k]
                        for k in SAMPLED})
            out.update({f"{prefix}{k}": v for k, v in scored.metrics("sampled_").items()})
            out.update({f"{prefix}{k}": v for k, v in figures.items() if k.startswith("pass@")})
            out.update({f"{prefix}revise_sampled_{k}": v for k, v in rounds.items()})
    return out


def run_eval(cfg: Config, loaded: Loaded, mesh, out: Path, temperatures=None, pass_ks=None, log=print) -> dict:
    """Evaluate `loaded` on the config's problems; write completions.jsonl and summary.json into `out`."""
    t0 = time.perf_counter()
    temperatures = default_temperatures(cfg) if temperatures is None else list(dict.fromkeys(map(float, temperatures)))
    if any(t < 0 for t in temperatures):
        raise ValueError(f"--temperature {temperatures}: temperatures must be >= 0 (0: greedy)")
    samples = cfg.eval.samples
    pass_ks = [kk for kk in EVAL_KS if kk <= samples] if pass_ks is None else sorted(set(pass_ks))
    if any(kk < 1 or kk > samples for kk in pass_ks):
        raise ValueError(f"--pass-k {pass_ks}: each k must be between 1 and --samples ({samples})")
    policy, tok = loaded.policy, loaded.policy.tokenizer
    items = problems(cfg, tok)
    if not items:
        raise ValueError(f"no problems to evaluate: eval.size={cfg.eval.size} and the {cfg.eval.split} split of the "
                         f"data section gave none (all dropped as longer than data.max_prompt_len?)")
    model_cfg = policy.model_cfg
    sampler = Sampler(policy.graphdef, pad_id=pad_id(tok), stop_ids=stop_ids(tok, model_cfg.eos_token_ids),
                      max_cache_len=model_cfg.max_position_embeddings, mesh=mesh,
                      share_prefill=cfg.rollout.shared_prefix, decode_slots=cfg.rollout.decode_slots)
    dtype = jnp.dtype(cfg.model.compute_dtype)  # as the run samples: in the update's compute dtype
    params = loaded.params if dtype == jnp.float32 else jax.jit(lambda p: cast_floats(p, dtype))(loaded.params)
    rows = rows_per_step(cfg)
    judge = _judge(cfg, items, sampler, params, tok, mesh, rows)
    key = jax.random.fold_in(jax.random.fold_in(jax.random.key(loaded.seed), PHASE_EVAL), loaded.step)
    n, lines, all_lengths, by_t, summary = len(items), [], [], {}, {}
    r = cfg.reward
    with RewardPool(r.workers, r.timeout_s, scorers={it.scorer for it, _ in items}, memory_mb=r.memory_mb,
                    file_mb=r.file_mb, start_retries=r.start_retries, functions=r.functions) as pool:
        rounds = Rounds.of(sampler, params, pool, tok, cfg, items, judge)
        for i, t in enumerate(temperatures):
            k, phase = (1 if t == 0.0 else samples), _phase(cfg, t, i)
            row_item = np.repeat(np.arange(n), k)
            parts: list = []
            rewards, met, lengths, texts = sample_graded(sampler, params, pool, tok, cfg, items, row_item, t,
                                                         jax.random.fold_in(key, phase), judge, scores=parts)
            scored = Scores.concat(parts)
            figures = _figures(scored, lengths, n, k, [kk for kk in pass_ks if t != 0.0])
            revised = {} if rounds is None else rounds(row_item, rewards, met, texts, t,
                                                       jax.random.fold_in(key, 3 + phase if phase < 3 else phase + 1),
                                                       correct=scored.correct)
            figures.update({f"revise_{name}": v for name, v in revised.items()})
            by_t[str(t)] = figures
            all_lengths.append(lengths)
            summary.update(_legacy(cfg, t, figures, scored, revised))
            for j, (row, text) in enumerate(zip(row_item, texts)):
                item = items[row][0]
                line = {"uid": item.uid, "question": item.question, "answer": item.answer, "temperature": t,
                        "sample": j % k, "completion": text, "reward": float(rewards[j]),
                        "correct": bool(scored.correct[j]), "tokens": int(lengths[j])}
                if scored.components:
                    line["components"] = {name: float(v[j]) for name, v in scored.components.items()}
                if met is not None and item.rubric:
                    line["met"] = [int(m) for m in met[j, :len(rubric_items(item.rubric))]]
                lines.append(json.dumps(line, ensure_ascii=False) + "\n")
    tokens = sum(f["tokens"] + sum(v for k, v in f.items() if k.startswith("revise_") and k.endswith("_tokens"))
                 for f in by_t.values())  # first answers and any revise rounds, as evaluate.py counts them
    summary = {"step": loaded.step, "split": cfg.eval.split, "source": loaded.source, "problems": n, **summary,
               "rollout_t": float(cfg.rollout.temperature),
               "response_len_mean": float(np.concatenate(all_lengths).mean()),
               "sampled_tokens": tokens, "temperatures": temperatures, "samples": samples, "pass_k": pass_ks,
               "max_new_tokens": cfg.eval.max_new_tokens or cfg.rollout.max_new_tokens, "by_temperature": by_t,
               "time_eval_s": time.perf_counter() - t0}
    out.mkdir(parents=True, exist_ok=True)
    replace_text(out / "completions.jsonl", "".join(lines))
    replace_text(out / "summary.json", json.dumps(summary, indent=2) + "\n")
    log(f"wrote {len(lines)} completions of {n} problems to {out / 'completions.jsonl'} and the figures to "
        f"{out / 'summary.json'}")
    return summary


def command(args, log=print) -> dict:
    """`jaxrl-llm eval`: load, check the output folder, evaluate, write; the summary."""
    from jaxrl_llm.config import load_config
    from jaxrl_llm.parallel.mesh import make_mesh
    from jaxrl_llm.train.restore import load_checkpoint, load_model, refuse_inside_run

    extra = ["train.tensorboard=false"] + ([f"eval.samples={args.samples}"] if args.samples is not None else []) \
        + ([f"eval.max_new_tokens={args.max_new_tokens}"] if args.max_new_tokens is not None else [])
    cfg = load_config(args.config, list(args.overrides) + extra)
    if args.model and args.step is not None:
        raise ValueError("--model and --step: give one (--step picks a checkpoint of the config's run)")
    if args.out:  # before anything is loaded
        refuse_inside_run(Path(args.out), cfg, "--out")
    mesh = make_mesh({"data": cfg.mesh.data, "fsdp": cfg.mesh.fsdp, "tensor": cfg.mesh.tensor})
    loaded = load_model(args.model, cfg, mesh) if args.model else load_checkpoint(cfg, mesh, args.step, log)
    out = Path(args.out) if args.out else Path("eval_out") / loaded.name
    refuse_inside_run(out, cfg, "the output folder")
    return run_eval(cfg, loaded, mesh, out, args.temperature, args.pass_k, log)
