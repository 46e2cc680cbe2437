"""`jaxrl-llm ablate-ci`: for each method arm of a spec, its difference from a baseline arm on every held-out
figure, with a 95 % interval from a paired hierarchical bootstrap over seeds and held-out problems.

    jaxrl-llm ablate-ci configs/ablate/rrl_control.yaml --baseline grpo
    jaxrl-llm ablate-ci configs/ablate/e3_budget_control.yaml --arms budget --by-difficulty
    jaxrl-llm ablate-ci configs/ablate/e3_temperature_control.yaml \\
        --arms e3_collapse_400:grpo_collapse_400,e3_collapse_3e-4:grpo_collapse_3e-4   # arm:its own baseline

Per-problem outcomes: the trainer writes its evaluations' per-problem outcomes beside metrics.jsonl
(held_out/step<N>.jsonl, train/outcomes.py) and the archive keeps the final one, so a record alone gives them.
A run recorded before that is evaluated once more from its final checkpoint by `jaxrl-llm eval` (a subprocess
from the working directory, offline) into <out_dir>/eval/<arm>/seed<S> (completions.jsonl, summary.json,
eval.log); a summary.json of the run's final step there is reused. Either way the outcomes must reproduce the
run's own final evaluation row to 1e-6 (same problems, random keys and model): otherwise the command stops,
since those outcomes would not be the run's.

Bootstrap: each resample draws, for each arm, its seeds with replacement (as many as it has) and, once for
both arms, the held-out problems with replacement (paired: a problem's shared difficulty cancels); each figure
is recomputed as the mean over drawn seeds of the run's mean over drawn problems, and the interval is the
2.5 and 97.5 percentiles of arm - baseline. Figures: greedy accuracy; at T = 1 and at the run's rollout
temperature: sampled accuracy, pass@k (unbiased, from the eval's n samples) and the never-solved share; where the
rewards are partial credit (a rubric task: some reward is not the answer's correct flag), the greedy answer's
reward and the mean sampled reward at each temperature too.
With 3 seeds the seed part of the spread is under-estimated (a bootstrap of 3 values has 2/3 of their
variance and 10 distinct draws), so read an interval as the problems' uncertainty plus a rough seed term; the
table's Welch p (a t-test on the seeds' means, the problem set held fixed) checks the seed term on its own.

Written to the spec's archive (else out_dir) as intervals.md (<reports>.intervals.md where the spec names its reports)
and printed.
"""

from __future__ import annotations

import collections
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from jaxrl_llm.ablate.grid import eval_subprocess
from jaxrl_llm.ablate.records import (BUDGET_KEYS, EVAL_COLUMNS, EVAL_KS, REWARD_COLUMNS, Stat, aggregate, by_step,
                                      load_rows, run_steps, run_summary)
from jaxrl_llm.ablate.spec import Spec, SpecError
from jaxrl_llm.train import outcomes

FIGURE_TOL = 1e-6  # eval vs the run's own row: the same computation, so only float printing may differ
LEVEL = 0.95
EVAL_FOLDER = "eval"


class EvalMismatch(SpecError):
    """An eval whose figures are not the run's own: its per-problem outcomes would describe another model."""


@dataclass(frozen=True)
class RunOutcomes:
    arm: str
    seed: int
    problems: tuple[tuple[str, str], ...]  # (uid, question) in the eval's order
    values: dict[str, np.ndarray]  # figure -> per-problem value [P]; the run's figure is its mean
    rollout_t: float
    budget: dict  # sampled_tokens, wall_s, cpu_s of the run (records.run_summary; cpu_s None in older records)
    steps: int = 0  # the RL step of its final evaluation


def problem_values(rows: list[dict], rollout_t: float, ks) -> tuple[tuple[tuple[str, str], ...], dict]:
    """Per-problem values of each figure from completions.jsonl rows: greedy correct (0/1); at T = 1 and at the
    rollout T (prefix rollout_t_): solved share c/n, pass@k for 1 < k <= n, never solved (c == 0). Where the rows
    carry rewards: the greedy answer's reward and the mean sampled reward (a rubric task's partial credit)."""
    from jaxrl_llm.train.metrics import pass_at_k

    problems = tuple(dict.fromkeys((r["uid"], r["question"]) for r in rows))
    uids = [u for u, _ in problems]
    if len(set(uids)) != len(uids):
        raise EvalMismatch("completions.jsonl gives one uid two questions")
    out = {}
    greedy = {r["uid"]: r for r in rows if r["temperature"] == 0.0}
    if greedy:
        if set(greedy) != set(uids):
            raise EvalMismatch("completions.jsonl lacks a greedy answer for some problems")
        out["greedy_accuracy"] = np.array([float(greedy[u]["correct"]) for u in uids])
        if all("reward" in r for r in greedy.values()):
            out["greedy_reward_mean"] = np.array([float(greedy[u]["reward"]) for u in uids])
    for prefix, t in dict.fromkeys([("", 1.0), ("rollout_t_", float(rollout_t))]):
        count, n, reward = collections.Counter(), collections.Counter(), collections.defaultdict(float)
        rewarded = True
        for r in rows:
            if r["temperature"] == t:
                n[r["uid"]] += 1
                count[r["uid"]] += bool(r["correct"])
                rewarded = rewarded and "reward" in r
                reward[r["uid"]] += float(r.get("reward", 0.0))
        if not n:
            continue
        if set(n) != set(uids) or len(set(n.values())) != 1:
            raise EvalMismatch(f"completions.jsonl at T={t}: problems have different numbers of samples")
        samples = next(iter(n.values()))
        c = np.array([count[u] for u in uids])
        out[f"{prefix}sampled_accuracy"] = c / samples
        out.update({f"{prefix}pass@{k}": np.array([pass_at_k(samples, int(ci), k) for ci in c])
                    for k in ks if 1 < k <= samples})
        out[f"{prefix}never_solved_share"] = (c == 0).astype(float)
        if rewarded:
            out[f"{prefix}sampled_reward_mean"] = np.array([reward[u] for u in uids]) / samples
    return problems, out


def check_figures(mine: dict, theirs: dict, where: str, tol: float = FIGURE_TOL) -> int:
    """Raise EvalMismatch unless every held-out figure in both agrees to `tol` (`where` names them in the same
    order: mine vs theirs); the number of figures compared."""
    keys = [k for k, _ in EVAL_COLUMNS if k in mine and k in theirs]
    if "greedy_accuracy" not in keys and "sampled_accuracy" not in keys:
        raise EvalMismatch(f"{where}: no held-out figure in common to compare (neither greedy nor sampled accuracy)")
    bad = [f"{k}: {mine[k]!r} vs {theirs[k]!r}" for k in keys if not abs(float(mine[k]) - float(theirs[k])) <= tol]
    if bad:
        raise EvalMismatch(f"{where}: {len(bad)} of {len(keys)} figures differ by more than {tol:g}: " + "; ".join(bad))
    return len(keys)


def draw_counts(n: int, resamples: int, rng) -> np.ndarray:
    """[resamples, n]: how often each of n things is drawn in n draws with replacement (multinomial counts;
    bincount is several times faster than rng.multinomial here)."""
    drawn = rng.integers(0, n, (resamples, n)) + n * np.arange(resamples)[:, None]
    return np.bincount(drawn.ravel(), minlength=resamples * n).reshape(resamples, n)


def resample_differences(arm_SxPxF: np.ndarray, base_SxPxF: np.ndarray, resamples: int, rng) -> np.ndarray:
    """The bootstrap distribution of arm - baseline [resamples, F]: seeds drawn with replacement within each
    arm, problems drawn with replacement once per resample for both arms (paired)."""
    p = arm_SxPxF.shape[1]
    if base_SxPxF.shape[1:] != arm_SxPxF.shape[1:]:
        raise ValueError(f"arm {arm_SxPxF.shape} and baseline {base_SxPxF.shape}: not the same problems and figures")
    weights_BxP = draw_counts(p, resamples, rng) / p

    def arm_means(v_SxPxF):
        s, _, f = v_SxPxF.shape
        seeds_BxS = draw_counts(s, resamples, rng) / s
        per_seed_BxSxF = (weights_BxP @ v_SxPxF.transpose(1, 0, 2).reshape(p, s * f)).reshape(resamples, s, f)
        return np.einsum("bs,bsf->bf", seeds_BxS, per_seed_BxSxF)

    return arm_means(arm_SxPxF) - arm_means(base_SxPxF)


def percentile_interval(diffs_BxF: np.ndarray, level: float = LEVEL) -> tuple[np.ndarray, np.ndarray]:
    lo, hi = np.percentile(diffs_BxF, [50 * (1 - level), 50 * (1 + level)], axis=0)
    return lo, hi


def compare(arm: list[RunOutcomes], base: list[RunOutcomes], figures: list[str], problems, resamples: int,
            rng) -> list[dict]:
    """One line per figure: arm and baseline mean and sample std over seeds, difference, 95 % interval, over the
    problem indices `problems`."""
    stack = [np.stack([[r.values[f][problems] for f in figures] for r in runs]).transpose(0, 2, 1)
             for runs in (arm, base)]
    diffs = resample_differences(stack[0], stack[1], resamples, rng)
    lo, hi = percentile_interval(diffs)
    lines = []
    for i, f in enumerate(figures):
        seed_means = [v[:, :, i].mean(axis=1) for v in stack]
        lines.append({"figure": f, "arm": aggregate(seed_means[0].tolist()), "base": aggregate(seed_means[1].tolist()),
                      "diff": float(seed_means[0].mean() - seed_means[1].mean()),
                      "lo": float(lo[i]), "hi": float(hi[i]), "welch_p": welch_p(*seed_means)})
    return lines


def welch_p(a: np.ndarray, b: np.ndarray) -> float:
    """Two-sided p of Welch's t-test on the seeds' means (the problem set held fixed): a check on the seed term
    that a bootstrap over 3 seeds under-states; nan with fewer than 2 seeds a side or no spread at all."""
    from scipy.stats import t as t_dist

    if min(len(a), len(b)) < 2:
        return math.nan
    va, vb = np.var(a, ddof=1) / len(a), np.var(b, ddof=1) / len(b)
    if va + vb == 0:
        return math.nan
    df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))  # Welch-Satterthwaite
    return float(2 * t_dist.sf(abs(a.mean() - b.mean()) / math.sqrt(va + vb), df))


def difficulty_key(item) -> tuple | None:
    """A task item's difficulty group: its `difficulty` by fifths of [0, 1], else the reasoning-gym parameters
    that vary across the data set (metadata.difficulty ranges, e.g. num_terms 2..5) at the item's values."""
    if not math.isnan(item.difficulty):
        fifth = min(int(item.difficulty * 5), 4)
        return (("difficulty", f"{fifth / 5:.1f}-{(fifth + 1) / 5:.1f}"),)
    try:
        entry = json.loads(item.entry_json) if item.entry_json else {}
    except ValueError:
        return None
    meta = entry.get("metadata", {}) if isinstance(entry, dict) else {}
    ranges = meta.get("difficulty", {}) if isinstance(meta.get("difficulty"), dict) else {}
    varying = sorted(k for k, r in ranges.items() if k in meta and isinstance(r, list) and len(set(map(str, r))) > 1)
    return tuple((k, meta[k]) for k in varying) or None


def difficulty_groups(config_path: Path, problems) -> dict[str, np.ndarray]:
    """Problem indices per difficulty group (groups in order of difficulty); {} when the items carry none."""
    from jaxrl_llm.config import load_config
    from jaxrl_llm.data.tasks import load_splits

    cfg = load_config(config_path, [])
    train, held = load_splits(cfg.data)
    items = {it.uid: it for it in (held if cfg.eval.split == "heldout" else train)}
    keys = [difficulty_key(items[u]) if u in items and items[u].question == q else None for u, q in problems]
    if any(k is None for k in keys) or len(set(keys)) < 2:
        return {}
    return {", ".join(f"{k}={v}" for k, v in key): np.flatnonzero([k == key for k in keys])
            for key in sorted(set(keys))}


def eval_dir(spec: Spec, arm: str, seed: int) -> Path:
    return spec.out_dir / EVAL_FOLDER / arm / f"seed{seed}"


def evaluate_run(spec: Spec, arm: str, seed: int, record: Path, log=print) -> RunOutcomes:
    """The run's per-problem outcomes at its final step (`jaxrl-llm eval` once), checked against its own row."""
    steps = run_steps(record)
    rows = load_rows(record / "metrics.jsonl")
    final = by_step(rows, "eval")[steps]
    budget = {k: run_summary(rows, steps)["final"].get(k) for k in BUDGET_KEYS}
    written = outcomes.path(record, steps)
    if written.is_file():  # the trainer's own per-problem outcomes (train/outcomes.py): nothing to sample again
        try:
            completions = outcomes.completion_rows(written)
        except ValueError as e:
            raise EvalMismatch(str(e)) from e
        problems, values = problem_values(completions, final["rollout_t"], EVAL_KS)
        if len(problems) != final.get("problems", len(problems)):
            raise EvalMismatch(f"{arm} seed {seed}: {written} holds {len(problems)} problems, the run's evaluation "
                               f"{final.get('problems')}")
        check_figures({k: float(v.mean()) for k, v in values.items()}, final,
                      f"{arm} seed {seed}: {written} vs the run's own evaluation at step {steps}")
        return RunOutcomes(arm, seed, problems, values, float(final["rollout_t"]), budget, steps)
    out = eval_dir(spec, arm, seed)
    summary_path = out / "summary.json"
    if not (summary_path.is_file() and json.loads(summary_path.read_text()).get("step") == steps):
        run_dir = spec.run_dir(arm, seed)
        if not (run_dir / "checkpoints" / str(steps)).is_dir():
            raise SpecError(f"{arm} seed {seed}: no checkpoint of step {steps} in {run_dir / 'checkpoints'} to "
                            f"evaluate (and no eval of it in {out}, no per-problem outcomes in its record); "
                            f"--seeds-only compares the runs' final evaluation rows over seeds without them")
        log(f"evaluating {arm} seed {seed} at step {steps} -> {out}")
        eval_subprocess(["--config", str(run_dir / "config.yaml"), "--step", str(steps)], out, "summary.json",
                        f"{arm} seed {seed}: ")
    summary = json.loads(summary_path.read_text())
    where = f"{arm} seed {seed}: the eval in {out} vs the run's own evaluation at step {steps}"
    if summary.get("problems") != final.get("problems", summary.get("problems")):
        raise EvalMismatch(f"{where}: {summary.get('problems')} problems vs {final.get('problems')}")
    check_figures(summary, final, where)
    completions = load_rows(out / "completions.jsonl")
    problems, values = problem_values(completions, summary["rollout_t"], summary.get("pass_k", ()))
    check_figures({k: float(v.mean()) for k, v in values.items()}, summary,
                  f"{arm} seed {seed}: {out / 'completions.jsonl'} vs its summary.json", tol=1e-9)
    return RunOutcomes(arm, seed, problems, values, float(summary["rollout_t"]), budget, steps)


NAMES = {"greedy_accuracy": "greedy", "sampled_accuracy": "sampled", "never_solved_share": "never solved",
         "greedy_reward_mean": "greedy reward", "sampled_reward_mean": "sampled reward"}


def figure_label(figure: str) -> str:
    """"pass@8 T=run" for rollout_t_pass@8: the temperature of every sampled figure said in its label."""
    base = figure.removeprefix("rollout_t_")
    name = NAMES.get(base, base)
    return name if base.startswith("greedy_") else f"{name} T={'run' if base != figure else '1'}"


def shared_figures(arm: list[RunOutcomes], base: list[RunOutcomes]) -> list[str]:
    """Figures every run of both arms has, in the table's order; T=run ones only where some run's T is not 1;
    reward figures only where some run's rewards are not its correct flags (partial credit)."""
    runs = arm + base
    partial = {k for k, acc in REWARD_COLUMNS.items()
               if any(k in r.values and not np.array_equal(r.values[k], r.values.get(acc)) for r in runs)}
    order = [k for k, _ in EVAL_COLUMNS if "reward" not in k or k in partial]
    figures = [k for k in order if all(k in r.values for r in runs)]
    if all(r.rollout_t == 1.0 for r in runs):  # T=run is the T = 1 pass: its rows would repeat the T=1 ones
        figures = [k for k in figures if not k.startswith("rollout_t_")]
    return figures


def comparison(arm: list[RunOutcomes], base: list[RunOutcomes], resamples: int, rng,
               groups: dict[str, np.ndarray] | None = None) -> dict:
    """The table over all problems, then (with `groups`) one per difficulty group."""
    problems = {r.problems for r in arm + base}
    if len(problems) != 1:
        raise EvalMismatch(f"{arm[0].arm} and {base[0].arm}: the runs' evals did not score the same problems "
                           f"(uid and question), so they cannot be paired")
    figures = shared_figures(arm, base)
    every = np.arange(len(next(iter(problems))))
    tables = {f"all {len(every)} held-out problems": compare(arm, base, figures, every, resamples, rng)}
    for name, idx in (groups or {}).items():
        tables[f"{name} ({len(idx)} problems)"] = compare(arm, base, figures, idx, resamples, rng)
    return tables


def _signed(x: float) -> str:
    return f"{x:+.3f}"


def _stat(stat: Stat) -> str:
    return f"{stat.mean:.3f}" + ("" if stat.n < 2 else f" ± {stat.std:.3f}")


def budget_sentence(arm: list[dict], base: list[dict]) -> str:
    """"Budget per run (mean): sampled tokens A vs B, wall s C vs D[, CPU s E vs F]." from each side's runs'
    budget dicts (CPU s where every run of both sides logged it)."""
    def mean(budgets, key, fmt):
        values = [b.get(key) for b in budgets]
        return "not recorded" if None in values else fmt.format(sum(values) / len(values))

    cpu = all(b.get("cpu_s") is not None for b in arm + base)
    return (f"Budget per run (mean): sampled tokens {mean(arm, 'sampled_tokens', '{:,.0f}')} vs "
            f"{mean(base, 'sampled_tokens', '{:,.0f}')}, wall s {mean(arm, 'wall_s', '{:.1f}')} vs "
            f"{mean(base, 'wall_s', '{:.1f}')}"
            + (f", CPU s {mean(arm, 'cpu_s', '{:.1f}')} vs {mean(base, 'cpu_s', '{:.1f}')}." if cpu else "."))


def _table(a: str, b: str, lines: list[dict]) -> list[str]:
    out = [f"| figure | {a} | {b} | difference | {LEVEL:.0%} interval | excludes 0 | Welch p (seeds) |",
           "|---|---|---|---|---|---|---|"]
    for ln in lines:
        excludes = "yes" if ln["lo"] > 0 or ln["hi"] < 0 else "no"
        p = "" if math.isnan(ln["welch_p"]) else f"{ln['welch_p']:.3f}"
        out.append(f"| {figure_label(ln['figure'])} | {_stat(ln['arm'])} | {_stat(ln['base'])} | {_signed(ln['diff'])} "
                   f"| [{_signed(ln['lo'])}, {_signed(ln['hi'])}] | {excludes} | {p} |")
    return out


def format_markdown(spec: Spec, command_line: str, results: list, missing: list, resamples: int, seed: int) -> str:
    out = [f"# Differences from the baseline: {spec.path}", "",
           f"Produced by `{command_line}`.", "",
           "Per-problem outcomes: each run's own final evaluation (`held_out/step<N>.jsonl` in its record) where "
           "the trainer wrote it, else its final checkpoint evaluated by `jaxrl-llm eval` "
           f"(`{spec.out_dir / EVAL_FOLDER}/<arm>/seed<S>`); either way they reproduce the run's own final "
           f"evaluation to {FIGURE_TOL:g}. Arm columns: mean ± sample std over seeds. Interval: "
           f"{LEVEL:.0%} percentile interval of a paired hierarchical bootstrap ({resamples} resamples, numpy seed "
           f"{seed}): seeds drawn with replacement within each arm, held-out problems with replacement, the same "
           "problem draw for both arms. pass@k is the unbiased estimator from the eval's samples; T=run is the run's "
           "rollout temperature (omitted where it is 1). With 3 seeds the bootstrap under-states the seed part of the "
           "spread: Welch p is a t-test on the seeds' means alone (the problem set held fixed); a difference whose "
           "interval excludes 0 but whose Welch p is large rests on few seeds."]
    for arm_runs, base_runs, tables in results:
        a, b = arm_runs[0].arm, base_runs[0].arm
        temps = sorted({r.rollout_t for r in arm_runs + base_runs})
        out += ["", f"## {a} vs {b}", "",
                f"Seeds {', '.join(str(r.seed) for r in arm_runs)} vs {', '.join(str(r.seed) for r in base_runs)}; "
                f"rollout T {', '.join(f'{t:g}' for t in temps)}. "
                + budget_sentence([r.budget for r in arm_runs], [r.budget for r in base_runs])]
        for title, lines in tables.items():
            out += ["", f"### {title}" if len(tables) > 1 else f"{title[0].upper()}{title[1:]}:", "",
                    *_table(a, b, lines)]
    if missing:
        out += ["", f"## Not in the tables: {len(missing)} runs", ""]
        out += [f"- {a} seed {s}: {why}" for a, s, why in missing]
    return "\n".join(out) + "\n"


def parse_pairs(text: str | None, baseline: str, spec: Spec) -> list[tuple[str, str]]:
    """(arm, baseline) pairs from `a,b` or `a:base_a,b:base_b`; default: every other arm against `baseline`."""
    items = [t.strip() for t in text.split(",") if t.strip()] if text else [a for a in spec.arms if a != baseline]
    pairs = [tuple(t.split(":", 1)) if ":" in t else (t, baseline) for t in items]
    unknown = sorted({name for pair in pairs for name in pair if name not in spec.arms})
    if unknown or not pairs:
        raise SpecError(f"{spec.path}: {unknown or 'no arm to compare'} not among the spec's arms "
                        f"({', '.join(spec.arms)})")
    if any(a == b for a, b in pairs):
        raise SpecError(f"an arm compared with itself: {[a for a, b in pairs if a == b]}")
    if EVAL_FOLDER in spec.arms:
        raise SpecError(f"{spec.path}: an arm named '{EVAL_FOLDER}' would share its folder with the evals")
    return pairs


def unequal_steps(a: str, b: str, steps_a, steps_b) -> tuple | None:
    """A `missing` entry for a pair whose runs end at different RL steps (an interval between them would
    measure training length, not the arm), else None."""
    if len(set(steps_a) | set(steps_b)) <= 1:
        return None
    return (a, "all", f"{a} vs {b} left out: the runs end at different steps ({a}: {sorted(set(steps_a))}, "
                      f"{b}: {sorted(set(steps_b))})")


def read_finished(spec: Spec, pairs, read) -> tuple[dict[str, list], list]:
    """{arm: [read(arm, seed, record) for each finished seed]} over the arms of `pairs`, and the unfinished runs
    as (arm, seed, why)."""
    out, missing = {}, []
    for arm in dict.fromkeys(name for pair in pairs for name in pair):
        out[arm] = []
        for s in spec.seeds:
            record = spec.record(arm, s)
            if record is None:
                missing.append((arm, s, "not finished (no ablation_done.json)"))
            else:
                out[arm].append(read(arm, s, record))
    return out, missing


def run(spec: Spec, pairs, resamples: int, seed: int, by_difficulty: bool, command_line: str,
        log=print) -> tuple[str, Path]:
    """Evaluate what is needed, bootstrap every pair, write intervals.md; (its text, its path)."""
    outcomes, missing = read_finished(spec, pairs, lambda arm, s, record: evaluate_run(spec, arm, s, record, log))
    rng = np.random.default_rng(seed)
    results, groups = [], {}
    for a, b in pairs:
        if not outcomes[a] or not outcomes[b]:
            missing.append((a if not outcomes[a] else b, "all", f"no finished run: {a} vs {b} left out"))
            continue
        unequal = unequal_steps(a, b, [o.steps for o in outcomes[a]], [o.steps for o in outcomes[b]])
        if unequal:
            missing.append(unequal)
            continue
        if by_difficulty and b not in groups:
            first = outcomes[b][0]
            groups[b] = difficulty_groups(spec.record(b, first.seed) / "config.yaml", first.problems)
            if not groups[b]:
                log(f"--by-difficulty: the task items of {b} carry no difficulty spread; one table over all problems")
        results.append((outcomes[a], outcomes[b], comparison(outcomes[a], outcomes[b], resamples, rng, groups.get(b))))
    if not results:
        raise SpecError(f"{spec.path}: no pair with finished runs on both sides")
    text = format_markdown(spec, command_line, results, missing, resamples, seed)
    return text, spec.write_table("intervals.md", text)
