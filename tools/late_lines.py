"""The line-level outcome of a step-by-step ablation (issue 25's RRL control): each arm's late-line success and
its pass@k on the training prompts the starting policy never solved, against GRPO, with bootstrap intervals
(jaxrl_llm/ablate/lines.py says what each figure is).

    .venv/bin/python tools/late_lines.py configs/ablate/rrl_control.yaml --arms grpo,rrl,rrl_reference

Every finished run of the spec (its record, usually archived) needs its final checkpoint once: the run's own
folder if the grid ran on this machine (the harness keeps the final step's), else the tool trains the same
command again (the harness's, with only train.out_dir and the start cache moved to <root>/<spec>/), keeps that
run's record in <archive>/late_lines/runs/ and says whether its evaluations (step 0: the starting policy, and the
final step) equal the archived record's: on another machine a warm start made again by `prepare` may differ.
Then `jaxrl-llm eval` samples each final policy on the training problems (eval.split=train, T = 1, --samples per
problem) and the starting policy with --start-samples; the per-problem counts are kept in <archive>/late_lines/
(start.json, <arm>/seed<S>.json), and the table goes to <archive>/late_lines.md. Resumable: finished trainings,
evaluations and counts are reused; --report-only makes the table from the kept counts alone.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from jaxrl_llm.ablate import lines  # noqa: E402
from jaxrl_llm.ablate.grid import eval_subprocess, folder_digest, run_grid, run_prepare  # noqa: E402
from jaxrl_llm.ablate.records import (aggregate, archive_run, by_step, is_timing, load_rows, run_steps,  # noqa: E402
                                      run_summary)
from jaxrl_llm.ablate.spec import DONE, Spec, SpecError, load_spec  # noqa: E402

def spec_config(spec: Spec):
    """The config every arm shares (the spec's base and common overrides), checked to have one warm start and a
    step-by-step task."""
    from jaxrl_llm.config import load_config

    cfg = load_config(spec.base, list(spec.overrides))
    if cfg.data.worked != "steps":
        raise SpecError(f"{spec.path}: data.worked is {cfg.data.worked!r}; late lines need data.worked: steps")
    if cfg.model.name == "scratch" or cfg.sft.steps > 0:
        # "unsolved at start" needs one starting policy for every arm and seed: a model folder, no SFT in the run
        raise SpecError(f"{spec.path}: the runs start from model.name={cfg.model.name!r} with sft.steps="
                        f"{cfg.sft.steps}; late lines need one warm start shared by every run (a model folder, "
                        f"e.g. made by the spec's `prepare`, and sft.steps=0)")
    return cfg


def expressions(cfg) -> dict[str, str]:
    """Each training problem's uid -> its arithmetic expression (the data every arm loads)."""
    from jaxrl_llm.data.tasks import load_splits

    train, _ = load_splits(cfg.data)
    return {it.uid: json.loads(it.entry_json)["metadata"]["expression"] for it in train}


def weights_digest(model_dir: str) -> str:
    """folder_digest of the model folder's weight files: which warm start a run started from."""
    digest = folder_digest(Path(model_dir), "*.safetensors")
    if digest is None:
        raise SpecError(f"{model_dir}: no *.safetensors to fingerprint the warm start by")
    return digest


def stale(c: lines.LineCounts, want: dict) -> str | None:
    """Why kept counts are not those of `want` (their source: run, step, samples, warm start), else None."""
    bad = [f"{k} {c.source.get(k)!r} (now {v!r})" for k, v in want.items() if c.source.get(k) != v]
    return "; ".join(bad) or None


def kept_counts(path: Path, source: dict, log) -> lines.LineCounts | None:
    """The counts kept in `path` if they are of `source`; None (said when they are of another: another run,
    step, sample count or warm start) when they must be made again."""
    if not path.is_file():
        return None
    c = lines.LineCounts.from_json(path.read_text(), str(path))
    why = stale(c, source)
    if why is not None:
        log(f"{path}: counted from another source ({why}); counting again")
    return c if why is None else None


def eval_counts(argv: list[str], out: Path, exprs: dict[str, str], counts_path: Path, source: dict,
                log) -> lines.LineCounts:
    """Counts of `jaxrl-llm eval argv --out out` (sampled once: its completions are reused while they are of the
    same checkpoint step and sample count), kept in counts_path with `source`."""
    summary, sampled_from = out / "summary.json", out / "source.json"
    # reused only when sampled from this source (step, samples and warm start: a warm start made again since
    # has the same step and samples, and its completions were counted under the new digest)
    done = summary.is_file() and (out / "completions.jsonl").is_file() and sampled_from.is_file() and \
        json.loads(sampled_from.read_text()) == source
    if not done:
        log(f"sampling: jaxrl-llm eval {' '.join(argv)} --out {out}")
        eval_subprocess(argv, out, "completions.jsonl", "")
        sampled_from.write_text(json.dumps(source, sort_keys=True) + "\n")
    c = lines.count_lines(load_rows(out / "completions.jsonl"), exprs, 1.0, str(out / "completions.jsonl"), source)
    counts_path.parent.mkdir(parents=True, exist_ok=True)
    counts_path.write_text(c.to_json() + "\n")
    return c


def eval_rows(record: Path) -> dict[int, dict]:
    return by_step(load_rows(record / "metrics.jsonl"), "eval")


def final_summary(record: Path) -> dict:
    """The run's final evaluation figures and its budget (training sampled tokens, wall time)."""
    return run_summary(load_rows(record / "metrics.jsonl"), run_steps(record))["final"]


def differences(mine: dict, theirs: dict) -> dict[str, float]:
    """|mine - theirs| of every number both evaluation rows hold but wall and CPU times."""
    keys = [k for k in mine if k in theirs and not is_timing(k) and k != "start_reused"
            and isinstance(mine[k], (int, float)) and isinstance(theirs[k], (int, float))]
    return {k: abs(float(mine[k]) - float(theirs[k])) for k in keys}


def reproduces(again: Path, record: Path) -> str:
    """Whether a run trained again (folder `again`) is the recorded one: its step-0 evaluation (the starting
    policy) and its final one compared with the record's, figure by figure."""
    mine, theirs = eval_rows(again), eval_rows(record)
    final = run_steps(record)
    said = []
    for step, what in ((0, "step 0 (the starting policy)"), (final, f"step {final}")):
        if step not in mine or step not in theirs:
            said.append(f"{what}: not in both records")
            continue
        d = differences(mine[step], theirs[step])
        worst = max(d, key=d.get, default=None)
        said.append(f"{what}: " + ("equal" if worst is None or d[worst] == 0 else
                                   f"{sum(v > 0 for v in d.values())} of {len(d)} figures differ, greedy accuracy "
                                   f"{mine[step].get('greedy_accuracy')} vs {theirs[step].get('greedy_accuracy')}"))
    return "; ".join(said)


def fmt(x: float) -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.3f}"


def stat(s) -> str:
    return "—" if s is None else (f"{s.mean:.3f}" if s.n < 2 else f"{s.mean:.3f} ± {s.std:.3f}")


def table(spec: Spec, arms: list[str], baseline: str, start: lines.LineCounts, counts: dict, retrained: dict,
          resamples: int) -> str:
    # every run's problems in the starting policy's order: "unsolved at start" indexes them
    counts = {arm: dict(zip(by_seed, lines.aligned(list(by_seed.values()), start.uids, f"{spec.path}: arm {arm}")))
              for arm, by_seed in counts.items()}
    other = [f"{arm} seed {seed} ({c.source.get('warm_start')})" for arm, by_seed in counts.items()
             for seed, c in by_seed.items() if c.source.get("warm_start") != start.source.get("warm_start")]
    if other:  # "unsolved at start" and every difference assume one starting policy
        raise SpecError(f"{spec.path}: runs counted from another warm start than the starting policy's "
                        f"({start.source.get('warm_start')}): {', '.join(other)}; count them again on one machine")
    samples = sorted({int(n) for by_seed in counts.values() for c in by_seed.values() for n in set(c.samples)})
    start_samples = int(start.samples.max())
    hard = lines.unsolved(start)
    start_late = lines.value(*start.late())
    n_lines = int(start.lines.max())
    out = [f"# Late lines: {spec.path}", "",
           f"Produced by `python tools/late_lines.py {spec.path} --arms {','.join(arms)}"
           f"{'' if baseline == 'grpo' else f' --baseline {baseline}'}` (`--report-only` redoes this table from the "
           f"counts in late_lines/). Training problems ({len(start.uids)}), sampled at T = 1: "
           f"{'/'.join(map(str, samples))} samples per problem from each run's final checkpoint, {start_samples} from "
           f"the starting policy. Late lines: of the samples whose first n // 2 lines are right (n = {n_lines} "
           f"here), the share whose remaining lines are all right (a line is right when it is the reference's "
           f"line); late_lines_scored counts only those the scorer also calls correct (text after the last line "
           f"can make a sample wrong). Warm start {start.source.get('warm_start')} (sha256 of its weights). "
           f"Unsolved at start: the {len(hard)} problems "
           f"none of the starting policy's {start_samples} samples solved. Intervals: paired bootstrap over seeds "
           f"and problems ({resamples} draws), Welch p over the seeds' figures (jaxrl_llm/ablate/lines.py).", "",
           f"Starting policy: accuracy {lines.value(*lines.figures(start, hard)['accuracy']):.3f}, late lines "
           f"{start_late:.3f}, per line " + ", ".join(f"{k}: {fmt(start.cond(k))}" for k in range(1, n_lines + 1)),
           ""]
    figs = {arm: [lines.figures(c, hard) for _, c in sorted(counts[arm].items())] for arm in arms if counts.get(arm)}
    names = list(next(iter(figs.values()))[0]) if figs else []
    out += ["| arm | seeds | " + " | ".join(names) + " | " + " | ".join(f"line {k}" for k in range(1, n_lines + 1))
            + " |", "|---|---|" + "---|" * (len(names) + n_lines)]
    for arm, runs in figs.items():
        vals = [aggregate([lines.value(*r[f]) for r in runs]) for f in names]
        per_line = [aggregate([c.cond(k) for _, c in sorted(counts[arm].items())]) for k in range(1, n_lines + 1)]
        out.append(f"| {arm} | {len(runs)} | " + " | ".join(stat(v) for v in vals) + " | "
                   + " | ".join(stat(v) for v in per_line) + " |")
    if baseline in figs:
        out += ["", f"Each arm against {baseline} (difference [95 % interval], Welch p):", "",
                "| arm | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
        for arm in figs:
            if arm == baseline:
                continue
            cmp = {line["figure"]: line for line in lines.compare(figs[arm], figs[baseline], resamples)}
            out.append(f"| {arm} | " + " | ".join(
                f"{cmp[f]['diff']:+.3f} [{cmp[f]['lo']:+.3f}, {cmp[f]['hi']:+.3f}]"
                + ("" if math.isnan(cmp[f]["welch_p"]) else f" (p {cmp[f]['welch_p']:.2g})")
                + (f" ({cmp[f]['dropped']} draws without a figure)" if cmp[f]["dropped"] else "") for f in names)
                + " |")
    if retrained:
        out += ["", "Runs trained again for their final checkpoints (the record's command, another folder; records in "
                "late_lines/runs/). Against the archived record of the same arm and seed:", ""]
        out += [f"- {arm} seed {seed}: {reproduces(folder, spec.record(arm, seed))}"
                for (arm, seed), folder in sorted(retrained.items())]
        cols = ("greedy_accuracy", "sampled_accuracy", "pass@8", "sampled_tokens")
        out += ["", "Held-out evaluation at the final step (mean ± std over seeds; sampled tokens: the training "
                "rollouts'), the runs trained again beside the archived ones:", "",
                "| arm | runs | " + " | ".join(cols) + " |", "|---|---|" + "---|" * len(cols)]
        for arm in arms:
            for label, folders in (("trained again", [f for (a, _), f in sorted(retrained.items()) if a == arm]),
                                   ("archived", [spec.record(arm, s) for (a, s) in sorted(retrained) if a == arm])):
                finals = [final_summary(f) for f in folders if f is not None]
                if finals:
                    out.append(f"| {arm} | {label} ({len(finals)}) | " + " | ".join(
                        (stat(aggregate([r[c] for r in finals if r.get(c) is not None])) if c != "sampled_tokens"
                         else f"{aggregate([r[c] for r in finals]).mean:,.0f}") for c in cols) + " |")
        if len(retrained) != sum(len(v) for v in counts.values()):
            out += ["", "**Mixed sources**: some runs were sampled from their own checkpoints and some trained "
                    "again; a run trained again on another machine may start from another warm start (see step 0 "
                    "above), so compare only runs of one source."]
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("spec", type=Path)
    ap.add_argument("--arms", help="comma-separated arms (default: all of the spec)")
    ap.add_argument("--baseline", default="grpo")
    ap.add_argument("--samples", type=int, default=8, help="samples per training problem from each final policy")
    ap.add_argument("--start-samples", type=int, default=16, help="samples per problem from the starting policy")
    ap.add_argument("--root", type=Path, default=Path("runs/measure/late_lines"),
                    help="where runs trained again and the evaluations go")
    ap.add_argument("--resamples", type=int, default=10000)
    ap.add_argument("--report-only", action="store_true", help="the table from the kept counts; nothing sampled")
    args = ap.parse_args(argv)
    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    spec = load_spec(args.spec)
    arms = args.arms.split(",") if args.arms else list(spec.arms)
    unknown = [a for a in arms if a not in spec.arms]
    if unknown:
        raise SystemExit(f"{args.spec}: no arm {unknown} (arms: {', '.join(spec.arms)})")
    keep = (spec.archive or spec.out_dir) / "late_lines"
    root = args.root / spec.path.stem
    # the same commands in other folders; their records are kept beside the counts (late_lines/runs/)
    again = dataclasses.replace(spec, out_dir=root, archive=keep)
    cfg = spec_config(spec)
    exprs = expressions(cfg)
    # overrides (a.b=value) first: argparse takes the positional ones only before the options
    split = ["eval.split=train", f"eval.size={cfg.data.train_size}"]
    warm = None
    if args.report_only:
        start = lines.LineCounts.from_json((keep / "start.json").read_text(), str(keep / "start.json"))
    else:
        problem, stopped = run_prepare(spec)
        if problem or stopped:
            raise SystemExit(problem or f"stopped by signal {stopped}")
        warm = weights_digest(cfg.model.name)
        source = {"run": "start", "step": 0, "samples": args.start_samples, "warm_start": warm}
        start = kept_counts(keep / "start.json", source, log) or eval_counts(
            ["--config", spec.base, *spec.overrides, f"train.out_dir={root / 'start_policy'}", *split, "--samples",
             str(args.start_samples), "--temperature", "1"], root / "eval" / "start", exprs, keep / "start.json",
            source, log)
    counts = {}
    for arm in arms:
        for seed in spec.seeds:
            record = spec.record(arm, seed)  # refuses a record the spec's command no longer trains
            path = keep / arm / f"seed{seed}.json"
            if (again.run_dir(arm, seed) / DONE).is_file() and not (again.archived(arm, seed) / DONE).is_file():
                archive_run(again, arm, seed)  # trained again by an earlier call that stopped before keeping it
            if record is None:
                if path.is_file():
                    log(f"{path}: left out, the spec has no finished run {arm} seed {seed}")
                continue
            if args.report_only:
                if path.is_file():
                    counts.setdefault(arm, {})[seed] = lines.LineCounts.from_json(path.read_text(), str(path))
                continue
            steps = run_steps(record)
            source = {"run": f"{arm}/seed{seed}", "step": steps, "samples": args.samples, "warm_start": warm}
            kept = kept_counts(path, source, log)
            if kept is not None:
                counts.setdefault(arm, {})[seed] = kept
                continue
            run_dir = spec.run_dir(arm, seed)
            if not (run_dir / "checkpoints" / str(steps)).is_dir():
                run_dir = again.run_dir(arm, seed)
                if not (run_dir / "checkpoints" / str(steps)).is_dir():
                    log(f"{arm} seed {seed}: no final checkpoint here; training its command again in {run_dir}")
                    failed, stopped, _ = run_grid(again, [(arm, seed)])
                    if failed or stopped:
                        raise SystemExit(f"{arm} seed {seed}: training again failed ({failed or stopped})")
                archive_run(again, arm, seed)  # the run trained again keeps its own record beside its counts
                log(f"{arm} seed {seed} trained again vs its record: {reproduces(run_dir, record)}")
            counts.setdefault(arm, {})[seed] = eval_counts(
                ["--config", str(run_dir / "config.yaml"), *split, "--step", str(steps), "--samples",
                 str(args.samples), "--temperature", "1"], root / "eval" / arm / f"seed{seed}", exprs, path, source,
                log)
    retrained = {(arm, seed): again.archived(arm, seed) for arm in arms for seed in spec.seeds
                 if (again.archived(arm, seed) / DONE).is_file()}
    text = table(spec, arms, args.baseline, start, counts, retrained, args.resamples)
    keep.mkdir(parents=True, exist_ok=True)
    (keep.parent / "late_lines.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
