"""`jaxrl-llm ablate`: train every arm of a spec on the same seeds, one run per (arm, seed), then report each
arm's held-out results (mean, sample std and n over seeds), its sampled-token budget and wall time, and
curves. `jaxrl-llm ablate-check`: the positive controls' predictions checked from the finished runs' records.
`jaxrl-llm ablate-ci`: each arm's difference from a baseline arm with a bootstrap interval (intervals.py).

    jaxrl-llm ablate configs/ablate/example.yaml               # run what is unfinished, report
    jaxrl-llm ablate configs/ablate/example.yaml --dry-run     # print the commands only
    jaxrl-llm ablate configs/ablate/example.yaml --report-only # table from the finished runs
    jaxrl-llm ablate-check configs/ablate/rrl_control.yaml     # the control's predictions, per run
    jaxrl-llm ablate-ci configs/ablate/rrl_control.yaml        # each arm - grpo, 95 % bootstrap interval (intervals.py)

(`python tools/ablate.py ...` and `python tools/controls.py ...` are the same commands.)
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from jaxrl_llm.ablate import grid, intervals as ci, records, spec as spec_module
from jaxrl_llm.ablate.grid import OFFLINE_ENV, other_preparation, run_grid, run_prepare
from jaxrl_llm.ablate.report import write_report
from jaxrl_llm.ablate.spec import DONE, LOG, SpecError, check_configs, load_spec

# --help: the usage above, then the spec's format, the grid's behaviour and the archive's, from their modules
DESCRIPTION = "\n".join((__doc__, spec_module.__doc__, grid.__doc__, records.__doc__))
CHECK_TEXT = "the positive controls' predictions, checked from each finished run's record (never edited)"
CI_TEXT = "each arm's difference from a baseline arm, with a 95 %% bootstrap interval over seeds and held-out problems"


def add_ablate_arguments(p) -> None:
    p.add_argument("spec", type=Path, help="ablation spec (YAML), e.g. configs/ablate/example.yaml")
    p.add_argument("--arms", help="comma-separated arms to run (default: all); the report covers the whole spec")
    p.add_argument("--seeds", help="comma-separated seeds to run (default: all in the spec)")
    p.add_argument("--report-only", action="store_true", help="no runs: write the report from what finished")
    p.add_argument("--dry-run", action="store_true", help="print the commands of the unfinished runs, run nothing")
    p.add_argument("--parallel", type=int, default=1, help="runs at a time (each trainer uses every core)")
    p.add_argument("--keep-checkpoints", action="store_true",
                   help="keep every checkpoint of a finished run (default: only the final step's)")
    p.add_argument("--stop-by", metavar="WHEN",
                   help="start no run expected to end after WHEN: a duration from now (90m, 2h30m) or a local time "
                        "(2026-12-07T06:50, or 06:50 today); the estimate is the arm's longest finished run")
    p.add_argument("--run-minutes", type=float, metavar="M",
                   help="with --stop-by: expect every run to take M minutes instead of the arm's longest finished "
                        "run (which runs that shared the machine, or were paused, make too long)")


def add_check_arguments(p) -> None:
    p.add_argument("spec", help="a positive control's spec, e.g. configs/ablate/e3_temperature_control.yaml")
    p.add_argument("--out", help="also write the report to this file")


def add_commands(sub) -> None:
    """`ablate` and `ablate-check` as subcommands of the `jaxrl-llm` parser (`sub`: its subparsers)."""
    p = sub.add_parser("ablate", help="train every arm of an ablation spec on the same seeds, then report",
                       description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_ablate_arguments(p)
    # no Hub probe (cli.main) for any of the three: ablate-check reads records only, and every process the other
    # two start (prepare, runs, evaluations) runs offline (grid.py OFFLINE_ENV), so a probe could only cost time
    p.set_defaults(fn=ablate, hub=False)
    p = sub.add_parser("ablate-check", help=CHECK_TEXT, description=CHECK_TEXT)
    add_check_arguments(p)
    p.set_defaults(fn=check, hub=False)
    p = sub.add_parser("ablate-ci", help=CI_TEXT, description=ci.__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_ci_arguments(p)
    p.set_defaults(fn=intervals, hub=False)


def add_ci_arguments(p) -> None:
    p.add_argument("spec", type=Path, help="ablation spec (YAML) whose finished runs are compared")
    p.add_argument("--baseline", default="grpo", help="the arm every other one is compared with")
    p.add_argument("--arms", help="comma-separated arms, each against --baseline, or arm:baseline pairs "
                                  "(default: every other arm against --baseline)")
    p.add_argument("--resamples", type=int, default=10000, help="bootstrap resamples")
    p.add_argument("--seed", type=int, default=0, help="the bootstrap's random seed")
    p.add_argument("--by-difficulty", action="store_true",
                   help="also one table per difficulty group of the held-out problems (where the items carry one)")
    p.add_argument("--seeds-only", action="store_true",
                   help="Welch t intervals over seeds from the runs' final evaluation rows, for records without "
                        "per-problem outcomes (seed_intervals.py); written to intervals_seeds.md "
                        "(<reports>.intervals_seeds.md where the spec names its reports)")


def parse_deadline(text: str, now: float | None = None) -> float:
    """--stop-by: `90m`, `2h30m`, `45s` from now, or a local time `YYYY-MM-DDTHH:MM[:SS]` / `HH:MM` (today); as a
    time.time() value. A time of day already past is refused rather than read as tomorrow."""
    import re
    import time
    from datetime import datetime

    now = time.time() if now is None else now
    m = re.fullmatch(r"(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?", text.strip())
    if m and any(m.groups()):
        h, mi, s = (int(g or 0) for g in m.groups())
        return now + 3600 * h + 60 * mi + s
    clock = re.fullmatch(r"\d{1,2}:\d{2}", text.strip())  # a time of day: today's
    try:
        if clock:
            hh, mm = map(int, text.strip().split(":"))
            when = datetime.fromtimestamp(now).replace(hour=hh, minute=mm, second=0, microsecond=0)
        else:
            when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise SpecError(f"--stop-by {text!r}: give a duration (90m, 2h30m, 45s) or a local time "
                        f"(2026-12-07T06:50, 06:50)") from None
    if when.timestamp() <= now:
        from datetime import timedelta

        hint = (f" (tomorrow's: --stop-by {(when + timedelta(days=1)).isoformat(timespec='minutes')})"
                if clock else "")
        raise SpecError(f"--stop-by {text!r}: {when.isoformat(timespec='minutes')} has passed{hint}")
    return when.timestamp()


def _pick(text: str | None, known, what: str, parse=str) -> list:
    if text is None:
        return list(known)
    picked = list(dict.fromkeys(parse(t.strip()) for t in text.split(",") if t.strip()))  # `a,a`: one run each
    unknown = [p for p in picked if p not in known]
    if unknown or not picked:
        raise SpecError(f"--{what} {text!r}: {unknown or 'nothing'} not in the spec's {what} "
                        f"({', '.join(map(str, known))})")
    return picked


def ablate(args) -> int:
    try:
        spec = load_spec(args.spec)
        if args.report_only and (args.arms or args.seeds or args.dry_run):
            raise SpecError("--report-only reports the whole spec; it takes no --arms, --seeds or --dry-run")
        if args.report_only:
            for path in write_report(spec):
                print(path)
            return 0
        if args.parallel < 1:
            raise SpecError(f"--parallel must be >= 1, got {args.parallel}")
        arms = _pick(args.arms, list(spec.arms), "arms")
        seeds = _pick(args.seeds, spec.seeds, "seeds", int)
        check_configs(spec, arms)
        deadline = parse_deadline(args.stop_by) if args.stop_by else None
        if args.run_minutes is not None and (deadline is None or not args.run_minutes > 0):
            raise SpecError(f"--run-minutes {args.run_minutes:g}: give a positive number of minutes, with --stop-by")
        # seed-major order: after each pass over the arms the table compares them on equal seeds
        cells = [(arm, seed) for seed in seeds for arm in arms]
        # every record the report will read, not only the runs picked: a stale one is refused now, not after
        records = {(a, s): spec.record(a, s) for a in spec.arms for s in spec.seeds}
        todo = [cell for cell in cells if records[cell] is None]
    except (SpecError, ValueError) as e:
        print(f"ablate: error: {e}", file=sys.stderr)
        return 2
    if args.dry_run:
        env = " ".join(f"{k}={v}" for k, v in OFFLINE_ENV.items())
        for creates, argv in spec.prepare if todo else ():
            print(f"# prepare ({'exists' if creates.exists() else 'missing'}: {creates}): {shlex.join(argv)}")
        for arm, seed in cells:
            d = spec.run_dir(arm, seed)
            if (arm, seed) in todo:
                print(f"{env} {shlex.join(spec.command(arm, seed))} >> {shlex.quote(str(d / LOG))} 2>&1")
            else:
                print(f"# done: {arm} seed {seed} ({records[arm, seed] / DONE})")
        return 0
    print(f"{len(cells) - len(todo)} of {len(cells)} runs already finished; {len(todo)} to run", file=sys.stderr)
    problem, stopped = run_prepare(spec) if todo else (None, None)
    if problem is not None:
        print(f"ablate: error: {problem}", file=sys.stderr)
        return 1
    prepared = grid.prepared_digests(spec) if todo and stopped is None else {}
    other = other_preparation(prepared, records)
    if other:
        print(f"ablate: error: {args.spec}: finished runs started from another `prepare` output than this machine's "
              f"(made again here, it is another warm start), so new runs would not be comparable with them: "
              f"{'; '.join(other)}. Bring that output here (the folder of its `creates` path), or give the spec a new "
              f"out_dir and archive and run the grid over from one warm start.", file=sys.stderr)
        return 2
    if stopped is not None:
        print(f"stopped by signal {stopped} while preparing; run the same command to resume.", file=sys.stderr)
        return 128 + stopped
    failed, stopped, left = run_grid(spec, todo, args.parallel, already=len(cells) - len(todo), deadline=deadline,
                                     keep_checkpoints=args.keep_checkpoints,
                                     run_s=None if args.run_minutes is None else args.run_minutes * 60,
                                     prepared=prepared)
    if stopped is not None:
        print(f"stopped by signal {stopped}; the running trainer checkpointed. Run the same command to resume.",
              file=sys.stderr)
        return 128 + stopped
    for path in write_report(spec):
        print(path)
    for arm, seed, why in failed:
        print(f"failed: {arm} seed {seed}: {why} ({spec.run_dir(arm, seed) / LOG})", file=sys.stderr)
    for arm, seed, need in left:
        print(f"not started: {arm} seed {seed} (expected {need / 60:.0f} min, past --stop-by {args.stop_by})",
              file=sys.stderr)
    return 1 if failed else 0


def check(args) -> int:
    from jaxrl_llm.ablate.controls import report

    try:
        text = report(args.spec)
    except SpecError as e:
        print(f"ablate-check: error: {e}", file=sys.stderr)
        return 2
    if args.out:  # before the print: a reader that stops early (`| head`) must not cost the file
        Path(args.out).write_text(text)
    print(text)
    return 0


def intervals(args) -> int:
    from jaxrl_llm.ablate import seed_intervals

    how = ["--seeds-only"] if args.seeds_only else ["--resamples", str(args.resamples), "--seed", str(args.seed),
                                                    *(["--by-difficulty"] if args.by_difficulty else [])]
    line = shlex.join(["jaxrl-llm", "ablate-ci", str(args.spec), "--baseline", args.baseline,
                       *(["--arms", args.arms] if args.arms else []), *how])
    try:
        spec = load_spec(args.spec)
        pairs = ci.parse_pairs(args.arms, args.baseline, spec)
        if args.seeds_only:
            if args.by_difficulty:
                raise SpecError("--seeds-only compares the runs' whole-eval figures; --by-difficulty needs "
                                "per-problem outcomes")
            text, path = seed_intervals.run(spec, pairs, line)
        else:
            if args.resamples < 1000:
                raise SpecError(f"--resamples {args.resamples}: a 95 % percentile interval needs 1000 at least")
            text, path = ci.run(spec, pairs, args.resamples, args.seed, args.by_difficulty, line,
                                log=lambda m: print(m, file=sys.stderr))
    except ci.EvalMismatch as e:
        print(f"ablate-ci: error: THE EVAL IS NOT THE RUN'S: {e}", file=sys.stderr)
        return 1
    except SpecError as e:
        print(f"ablate-ci: error: {e}", file=sys.stderr)
        return 2
    print(text)
    print(path, file=sys.stderr)
    return 0


def main(argv=None) -> int:
    """`jaxrl-llm ablate` on its own (tools/ablate.py)."""
    p = argparse.ArgumentParser(description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_ablate_arguments(p)
    return ablate(p.parse_args(argv))


def check_main(argv=None) -> int:
    """`jaxrl-llm ablate-check` on its own (tools/controls.py)."""
    p = argparse.ArgumentParser(description=CHECK_TEXT)
    add_check_arguments(p)
    return check(p.parse_args(argv))
