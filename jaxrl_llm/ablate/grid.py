"""Running an ablation grid: each (arm, seed) is `python -m jaxrl_llm.cli train --config base *overrides *arm
train.seed=S train.out_dir=<out_dir>/<arm>/seed<S>` in a subprocess started from the harness's working
directory, offline, its output appended to <run_dir>/train.log. A run that exits with an eval row at
train.steps gets ablation_done.json and its record archived; rerunning resumes unfinished runs from their
checkpoints and skips finished ones. Ctrl-C / SIGTERM is forwarded to the running trainer, which checkpoints
and exits; then the harness stops.

With a deadline (`--stop-by`), a run whose estimated time would pass it is not started (a run cut off by the
end of a machine's lease loses what it computed since its last checkpoint): the estimate is the longest time a
finished run of the same arm took (its done marker's elapsed_s, else its steps' and evaluations' wall time),
else that of any arm; a grid with no finished run starts its runs, saying it cannot estimate.

Once a run is finished and archived, its checkpoints but the final step's are deleted (`--keep-checkpoints`
keeps them): the final one is what `jaxrl-llm eval` / `export` read, and a SmolLM2 run's three kept
checkpoints take 4.2 GB, so a grid would fill a disk with states nobody resumes.

A spec's `prepare` commands (e.g. one shared SFT warm start that every arm loads through model.name) run
each once, before the first run, only while the path each `creates` is missing; output goes to
<out_dir>/prepare.log and a signal reaches them like a run.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

from jaxrl_llm.ablate.records import archive_run, final_eval_problem, load_rows, run_steps, run_summary
from jaxrl_llm.ablate.spec import DONE, LOG, Spec, SpecError
from jaxrl_llm.train.metrics import replace_text

OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


def log_tail(path: Path, lines: int = 15) -> str:
    text = path.read_text(errors="replace") if path.is_file() else ""
    return "\n".join("    " + ln.split("\r")[-1] for ln in text.rstrip().splitlines()[-lines:])


def _start(cmd, log_path: Path, label: str = "") -> subprocess.Popen:
    """Start `cmd` offline with its output appended to `log_path` after a header naming it."""
    with log_path.open("a") as log:
        log.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} jaxrl-llm ablate{label}: {shlex.join(cmd)}\n")
        log.flush()
        return subprocess.Popen(list(cmd), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env={**os.environ, **OFFLINE_ENV})


@contextlib.contextmanager
def _forwarding(live):
    """While inside, SIGINT / SIGTERM are passed on as SIGTERM to the processes `live()` returns (a trainer
    checkpoints after its current step and exits); yields the list of signals received."""
    stopped: list[int] = []

    def forward(signum, frame):
        stopped.append(signum)
        for proc in live():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)

    old = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stopped
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


def launch(spec: Spec, arm: str, seed: int) -> subprocess.Popen:
    """Start one run's trainer (run_grid looks this name up at each start: a test stands in for the trainer here)."""
    run_dir = spec.run_dir(arm, seed)
    run_dir.mkdir(parents=True, exist_ok=True)
    return _start(spec.command(arm, seed), run_dir / LOG)


def run_prepare(spec: Spec) -> tuple[str | None, int | None]:
    """Run the spec's prepare commands whose path is missing, in order. Returns (what failed, signal)."""
    log_path = spec.out_dir / "prepare.log"
    for creates, argv in spec.prepare:
        if creates.exists():
            continue
        spec.out_dir.mkdir(parents=True, exist_ok=True)
        print(f"prepare: {shlex.join(argv)} (log: {log_path})", file=sys.stderr)
        proc = _start(argv, log_path, " prepare")
        with _forwarding(lambda: [proc]) as stopped:
            rc = proc.wait()
        if stopped:
            return None, stopped[0]
        if rc != 0 or not creates.exists():
            why = f"exit code {rc}" if rc != 0 else f"it exited 0 but did not create {creates}"
            return f"prepare command {shlex.join(argv)}: {why}; last lines of {log_path}:\n{log_tail(log_path)}", None
    return None, None


def run_seconds(spec: Spec, arm: str) -> float | None:
    """How long a run of `arm` is expected to take: the longest finished run of the arm, else of any arm scaled by
    the two arms' RL steps (arms of one spec may train 30 or 400 steps) (done marker's elapsed_s, or the run's
    steps' and evaluations' wall time where it is larger); None without one."""
    def took(arm_, seed):
        record = spec.record(arm_, seed)
        if record is None:
            return None
        elapsed = json.loads((record / DONE).read_text()).get("elapsed_s")
        steps = run_steps(record)
        summary = run_summary(load_rows(record / "metrics.jsonl"), steps) if steps else None
        wall = summary["final"].get("wall_s") if summary else None
        known = [float(t) for t in (elapsed, wall) if isinstance(t, (int, float))]
        return (max(known), steps) if known else None

    own = [t for s in spec.seeds if (t := took(arm, s)) is not None]
    if own:
        return max(t for t, _ in own)
    others = [t for a in spec.arms for s in spec.seeds if (t := took(a, s)) is not None]
    if not others:
        return None
    want = arm_steps(spec, arm)
    return max(t * want / steps if want and steps else t for t, steps in others)


def arm_steps(spec: Spec, arm: str) -> int | None:
    """The RL steps a run of `arm` trains (its config as the spec gives it); None where it cannot be read."""
    from jaxrl_llm.config import ConfigError, load_config

    try:
        return load_config(spec.base, [*spec.overrides, *spec.arms[arm]]).train.steps
    except (ConfigError, OSError, ValueError):
        return None


def folder_digest(folder: Path, pattern: str = "*") -> str | None:
    """sha256 (16 hex digits) over the names and bytes of the files in `folder` matching `pattern` (not its
    subfolders); None when there is none."""
    files = sorted(p for p in Path(folder).glob(pattern) if p.is_file())
    if not files:
        return None
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode() + b"\0")
        with f.open("rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()[:16]


def prepared_digests(spec: Spec) -> dict[str, str]:
    """folder_digest of what each `prepare` step made: the folder holding its `creates` path (a warm start's model
    folder), for each step whose output exists. A finished run's record keeps them: made again on another machine,
    a warm start is often another policy (SFT on another CPU), and one grid must not mix them."""
    return {str(creates): folder_digest(creates.parent) for creates, _ in spec.prepare if creates.exists()}


START = "ablation_start.json"  # in a run folder: the prepare outputs its first attempt started from


def started_from(run_dir: Path, prepared: dict[str, str]) -> str | None:
    """Keep in `run_dir` the prepare outputs a run starts from (its first attempt's); on a later attempt, why it
    may not resume (its warm start was made again since: the trainer sees a model folder of the same names and
    sizes), else None."""
    if not prepared:
        return None
    path = run_dir / START
    if path.is_file():
        first = json.loads(path.read_text()).get("prepared", {})
        changed = [f"{k} was {v}, now {prepared[k]}" for k, v in first.items() if k in prepared and prepared[k] != v]
        return (f"its warm start changed since the run started ({'; '.join(changed)}); delete {run_dir} to train it "
                f"again from this one") if changed else None
    run_dir.mkdir(parents=True, exist_ok=True)
    replace_text(path, json.dumps({"prepared": prepared}) + "\n")
    return None


def other_preparation(here: dict[str, str], records: dict) -> list[str]:
    """The finished records trained from another `prepare` output than `here` (this machine's prepared_digests;
    older records that did not keep their digests are not checked), each said with both digests."""
    bad = []
    for (arm, seed), d in sorted(records.items()):
        if d is None:
            continue
        theirs = json.loads((d / DONE).read_text()).get("prepared", {})
        for path, digest in theirs.items():
            if path in here and here[path] != digest:
                bad.append(f"{arm} seed {seed} ({d}): {path} was {digest}, here {here[path]}")
    return bad


def eval_subprocess(argv: list[str], out: Path, expect: str, what: str) -> None:
    """`jaxrl-llm eval argv --out out` in a subprocess from the working directory, offline, its output in
    out/eval.log; SpecError (`what` first) unless it exits 0 and writes out/`expect`."""
    cmd = [sys.executable, "-m", "jaxrl_llm.cli", "eval", *argv, "--out", str(out)]
    out.mkdir(parents=True, exist_ok=True)
    with (out / "eval.log").open("w") as f:
        rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            env={**os.environ, **OFFLINE_ENV}).returncode
    if rc != 0 or not (out / expect).is_file():
        raise SpecError(f"{what}`{' '.join(cmd)}` failed (exit code {rc}); last lines of {out / 'eval.log'}:\n"
                        f"{log_tail(out / 'eval.log')}")


def prune_checkpoints(run_dir: Path, final_step: int) -> list[Path]:
    """Delete a finished run's checkpoints (RL's and SFT's) except RL's at `final_step`; nothing unless that one
    is there. Only step folders (integer names) are touched. Returns what was deleted."""
    import shutil

    final = run_dir / "checkpoints" / str(final_step)
    if not final.is_dir():
        return []
    gone = []
    for folder in (run_dir / "checkpoints", run_dir / "sft_checkpoints"):
        for d in sorted(folder.iterdir()) if folder.is_dir() else ():
            if d.is_dir() and d.name.isdigit() and d != final:
                shutil.rmtree(d)
                gone.append(d)
    return gone


def run_grid(spec: Spec, todo: list[tuple[str, int]], parallel: int = 1, already: int = 0,
             deadline: float | None = None, keep_checkpoints: bool = False,
             run_s: float | None = None, prepared: dict[str, str] | None = None) -> tuple[list, int | None, list]:
    """Train the (arm, seed) runs of `todo`, `parallel` at a time; the progress bar also counts the
    `already` finished runs of the grid. With `deadline` (a time.time() value) a run expected to end after it
    is not started; a run is expected to take `run_s` seconds if given, else run_seconds(spec, arm). Returns the
    failures as (arm, seed, why), the signal that stopped the grid (None if it ran through) and the runs left for
    the deadline as (arm, seed, estimated seconds). `prepared`: prepared_digests(spec) if the caller has them (each
    finished run's record keeps them)."""
    from tqdm import tqdm

    pending, running, failed, started, left = list(todo), {}, [], {}, []
    prepared = prepared_digests(spec) if prepared is None else prepared  # what every run of this call starts from
    bar = tqdm(total=len(todo) + already, initial=already, desc="ablation", unit="run")
    with _forwarding(lambda: list(running.values())) as stopped:
        try:
            while running or (pending and not stopped):
                while pending and not stopped and len(running) < parallel:
                    arm, seed = pending.pop(0)
                    if deadline is not None:
                        need = run_s if run_s is not None else run_seconds(spec, arm)
                        if need is None:
                            tqdm.write(f"--stop-by: no finished run to estimate {arm} seed {seed} from; starting it",
                                       file=sys.stderr)
                        elif time.time() + need > deadline:
                            left.append((arm, seed, need))
                            continue
                    changed = started_from(spec.run_dir(arm, seed), prepared)
                    if changed:  # an unfinished run resumed on another warm start would finish as neither's
                        failed.append((arm, seed, changed))
                        tqdm.write(f"FAILED: arm {arm}, seed {seed}: {changed}", file=sys.stderr)
                        continue
                    started[arm, seed] = time.time()
                    running[arm, seed] = proc = launch(spec, arm, seed)
                    if stopped and proc.poll() is None:  # a signal between the start and the line above
                        proc.send_signal(signal.SIGTERM)  # missed this run: it is told now
                    bar.set_description(", ".join(f"{a}/seed{s}" for a, s in running))
                time.sleep(0.2)
                for (arm, seed), proc in list(running.items()):
                    rc = proc.poll()
                    if rc is None:
                        continue
                    del running[arm, seed]
                    run_dir = spec.run_dir(arm, seed)
                    why = f"exit code {rc}" if rc != 0 else final_eval_problem(run_dir)
                    if why is None:
                        steps = run_steps(run_dir)
                        # elapsed_s: this attempt's start to exit (a resumed run's earlier attempts are not in it);
                        # prepared: what the run started from (its first attempt's), and it is the same as now
                        replace_text(run_dir / DONE, spec.done_text(
                            arm, seed, steps=steps, exit_code=rc, finished=time.strftime("%Y-%m-%d %H:%M:%S"),
                            elapsed_s=round(time.time() - started[arm, seed], 1),
                            **({"prepared": prepared} if prepared else {})))
                        archive_run(spec, arm, seed)
                        if not keep_checkpoints:
                            prune_checkpoints(run_dir, steps)
                    elif not stopped:
                        failed.append((arm, seed, why))
                        tqdm.write(f"FAILED: arm {arm}, seed {seed}: {why}; last lines of {run_dir / LOG}:\n"
                                   f"{log_tail(run_dir / LOG)}", file=sys.stderr)
                    if why is None or not stopped:
                        bar.update(1)
                        bar.set_postfix(failed=len(failed))
        finally:
            bar.close()
    return failed, (stopped[0] if stopped else None), left
