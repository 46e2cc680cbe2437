"""What a run reports beyond metrics.jsonl and TensorBoard (train/metrics.py): completion samples, Weights &
Biases, and the closing summary. Process 0 writes everything; the other processes count rows only.

- Samples (logging.samples_every, logging.samples_per_step): every samples_every RL steps, samples_per_step of the
  step's rows as trained on (spread evenly over them, so over its groups) go to `<out_dir>/samples.jsonl`, one JSON
  object a row: step, row, group, kind (fresh | replayed | hindsight), prompt (the task's question), answer (its
  reference), completion (any given prefix and the generated text), reward (as scored, before explorer bonuses),
  correct (as the step's accuracy counts it), advantage, temperature; with reward.functions, components ({name:
  unweighted value}); for rubric tasks, rubric (each item: description, weight, met). They go to TensorBoard as a
  text table (`samples`, RL stage) and to W&B as a table (`samples`; components and rubric as JSON text).
- W&B (logging.wandb): one W&B run per run folder. Its id is kept in `<out_dir>/wandb.json`, so every resume
  continues it (resume="allow"). Each metrics.jsonl row is one W&B step (1, 2, ...: SFT, evaluation and RL rows
  alike), its numbers logged as `<kind>/<metric>` beside the row's own step as `sft_step` or `rl_step`, the x-axis
  W&B plots them against. A resume from a checkpoint redoes the steps after it and writes their rows again; rows
  W&B already holds (wandb.json records how far it got) are not sent again. W&B so shows each step once, with the
  values it got first: for a deterministic run the same numbers but timings (and an evaluation a resume with a
  new train.steps no longer makes, e.g. the old final one, stays in W&B while metrics.jsonl drops it). W&B turned
  on for a run under way gets the rows metrics.jsonl kept first (samples from then on). W&B (0.31) holds back
  part of what it writes, offline too, until the process exits: a run killed outright (SIGKILL) can lose its last
  rows from W&B, and its resume does not send them again; SIGTERM and Ctrl-C stop cleanly and lose nothing.
- On a resume samples.jsonl keeps the rows of the RL steps up to the checkpoint's (those metrics.jsonl keeps),
  replaced atomically like metrics.jsonl.
- Without the `wandb` package the trainer runs as before; logging.wandb=true then stops the run at its start
  with an error naming the extra to install. Online mode without credentials is refused, never prompted for.
"""

from __future__ import annotations

import json
import secrets
from pathlib import Path
from typing import Sequence

import numpy as np

from jaxrl_llm.config import Config
from jaxrl_llm.explore.rows import Rollouts
from jaxrl_llm.rewards.rubrics import rubric_items
from jaxrl_llm.train.metrics import MetricsWriter, read_rows, replace_text, scalars, stage_of

SAMPLES_NAME = "samples.jsonl"
WANDB_STATE_NAME = "wandb.json"
STAGES = ("sft", "rl")  # in the order a run goes through them
SAMPLE_COLUMNS = ("step", "row", "group", "kind", "prompt", "answer", "completion", "reward", "correct", "advantage",
                  "temperature", "components", "rubric")


class Tracker(MetricsWriter):
    """The run's writer: metrics.jsonl and TensorBoard (MetricsWriter), W&B, and completion samples."""

    def __init__(self, cfg: Config, keep_rows: int = 0):
        lg = cfg.logging
        # every process checks, so a missing package stops them all before any writes
        wandb = import_wandb(lg.wandb_mode) if lg.wandb and lg.wandb_mode != "disabled" else None
        super().__init__(Path(cfg.train.out_dir), tensorboard=cfg.train.tensorboard, keep_rows=keep_rows)
        self.samples_every, self.samples_per_step = lg.samples_every, lg.samples_per_step
        self.samples_path = self.path.parent / SAMPLES_NAME
        self.wandb = None
        if not self.enabled:
            return
        if self.samples_path.exists():  # the steps metrics.jsonl kept (none when it was absent)
            again = self.purge["rl"] if self.purge else 1
            kept = [r for r in read_rows(self.samples_path) if r["step"] < again]
            replace_text(self.samples_path, "".join(json.dumps(r) + "\n" for r in kept))
        if wandb is not None:
            self.wandb = WandbRun(wandb, cfg, self.path.parent)
            if self.wandb.at is None and self.path.exists():  # W&B turned on for a run under way: its rows so far
                for row in read_rows(self.path):
                    self.wandb.log(row["kind"], row)

    def write(self, step: int, metrics: dict, kind: str = "train") -> dict | None:
        row = super().write(step, metrics, kind)
        if self.wandb is not None and row is not None:
            self.wandb.log(kind, row)
        return row

    def samples(self, step: int, rollouts: Rollouts, items: Sequence) -> list[dict]:
        """Sample RL step `step`'s rows (items: the training TaskItems its plan indexes), before its metrics row
        is written; returns the rows written ([] on steps without samples and on processes other than 0)."""
        if not self.enabled or not self.samples_every or step % self.samples_every:
            return []
        rows = sample_rows(step, rollouts, items, self.samples_per_step)
        with self.samples_path.open("a") as f:
            f.write("".join(json.dumps(r) + "\n" for r in rows))
        if self.tb_dir is not None:
            tb = self._tb("rl")
            tb.add_text("samples", _markdown(rows), step)
            tb.flush()
        if self.wandb is not None:
            self.wandb.table(step, rows)
        return rows

    def close(self) -> None:
        super().close()
        if self.wandb is not None:
            self.wandb.finish()


def sample_rows(step: int, rollouts: Rollouts, items: Sequence, count: int) -> list[dict]:
    """`count` of the step's rows, evenly spaced over them, as samples.jsonl rows. What is correct and the reward
    functions' components come from the rows' scoring (train/rollout.py Scores), as for the step's accuracy;
    rows an explorer rebuilt carry their own `correct` (explore/rows.py)."""
    plan, n = rollouts.plan, rollouts.rows
    scores = getattr(rollouts, "scores", None)
    correct = rollouts.correct if scores is None else scores.correct
    components = {} if scores is None else scores.components
    out = []
    for i in np.unique(np.linspace(0, n - 1, min(count, n)).round().astype(int)):
        item = items[plan.prompt[i]]
        row = {"step": step, "row": int(i), "group": int(plan.group[i]),
               "kind": "replayed" if plan.replayed[i] else "hindsight" if plan.hindsight[i] else "fresh",
               "prompt": item.question, "answer": item.answer, "completion": rollouts.texts[i],
               "reward": float(rollouts.scored[i]), "correct": bool(correct[i]),
               "advantage": float(rollouts.advantages[i]), "temperature": float(plan.temperature[i])}
        if components:
            row["components"] = {name: float(v[i]) for name, v in components.items()}
        if item.rubric and rollouts.met is not None:
            row["rubric"] = [{"item": it.description, "weight": it.weight, "met": bool(met)}
                             for it, met in zip(rubric_items(item.rubric), rollouts.met[i])]
        out.append(row)
    return out


def import_wandb(mode: str):
    """The wandb module, or an error saying how to get it; for online mode, only with credentials configured."""
    try:
        import wandb
    except ImportError as e:
        raise ImportError(f"logging.wandb=true needs the wandb package, which is not installed ({e}): install the "
                          f"extra with `pip install 'jaxrl-llm[wandb]'`, or set logging.wandb=false") from None
    # online without a key would ask for one on the terminal (or fail on the network later): refuse it now
    if mode == "online" and not wandb.login(prompt=False, verify=False):
        raise ValueError("logging.wandb_mode=online needs W&B credentials: set WANDB_API_KEY or run `wandb login` "
                         "first, or log offline (logging.wandb_mode=offline) and upload later with `wandb sync`")
    return wandb


class WandbRun:
    """The run folder's W&B run: created on the first start, continued by every resume (train.overwrite moves
    wandb.json aside with the old run, so the new one starts a W&B run of its own)."""

    def __init__(self, wandb, cfg: Config, out_dir: Path):
        lg = cfg.logging
        self.wandb, self.state_path = wandb, out_dir / WANDB_STATE_NAME
        # logged: W&B steps used; at: the (stage, step) of the last row sent, kinds: the kinds sent at it
        self.id, self.logged, self.at, self.kinds = secrets.token_hex(6), 0, None, []
        if self.state_path.exists():
            try:
                state = json.loads(self.state_path.read_text())
                self.id, self.logged, self.kinds = str(state["id"]), int(state["logged"]), list(state["kinds"])
                self.at = None if state["at"] is None else (STAGES.index(state["at"][0]), int(state["at"][1]))
            except (ValueError, KeyError, TypeError, IndexError) as e:
                raise ValueError(f"{self.state_path}: not the W&B record this run writes ({type(e).__name__}: {e}); "
                                 f"move it away to start a new W&B run") from None
        self.axes: set[str] = set()  # the kinds whose keys W&B has been told to plot against their stage's step
        where = Path(lg.wandb_dir) if lg.wandb_dir else out_dir
        where.mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(project=lg.wandb_project, entity=lg.wandb_entity or None, name=out_dir.name,
                              id=self.id, resume="allow", mode=lg.wandb_mode, dir=str(where), config=cfg.to_dict(),
                              # the run prints its own progress; W&B capturing stdout would wrap tqdm's
                              settings=wandb.Settings(console="off"))
        self._save()

    def sent(self, kind: str, step: int) -> bool:
        """Whether W&B already holds the row of `kind` at `step` (or rows past it): sent before a resume."""
        here = (STAGES.index(stage_of(kind)), step)
        return self.at is not None and (here < self.at or (here == self.at and kind in self.kinds))

    def log(self, kind: str, row: dict) -> None:
        """A metrics.jsonl row, at the next W&B step, unless W&B holds it already."""
        step, stage = row["step"], stage_of(kind)
        if self.sent(kind, step):
            return
        axis = f"{stage}_step"
        if kind not in self.axes:
            self.run.define_metric(axis)
            self.run.define_metric(f"{kind}/*", step_metric=axis)
            self.axes.add(kind)
        self.logged += 1
        self.run.log({axis: step, **{f"{kind}/{k}": v for k, v in scalars(row).items()}}, step=self.logged)
        here = (STAGES.index(stage), step)
        self.at, self.kinds = here, (self.kinds if here == self.at else []) + [kind]
        self._save()

    def table(self, step: int, rows: list[dict]) -> None:
        """RL step `step`'s samples, at the W&B step its train row is about to take."""
        if self.sent("train", step):
            return
        data = [[json.dumps(r[c]) if c in ("components", "rubric") and c in r else r.get(c) for c in SAMPLE_COLUMNS]
                for r in rows]
        self.run.log({"samples": self.wandb.Table(columns=list(SAMPLE_COLUMNS), data=data)}, step=self.logged + 1)

    def finish(self) -> None:
        self.run.finish()

    def _save(self) -> None:
        at = None if self.at is None else [STAGES[self.at[0]], self.at[1]]
        replace_text(self.state_path, json.dumps({"id": self.id, "logged": self.logged, "at": at,
                                                  "kinds": self.kinds}) + "\n")


def _markdown(rows: list[dict]) -> str:
    """The samples as a TensorBoard text (markdown) table."""
    def cell(v) -> str:
        text = f"{v:.3f}" if isinstance(v, float) else str(v)
        return text.replace("|", "\\|").replace("\n", "<br>")

    cols = ("row", "kind", "prompt", "completion", "reward", "correct")
    return "\n".join(["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
                     + ["| " + " | ".join(cell(r[c]) for c in cols) + " |" for r in rows])


def summary(out_dir: Path) -> str:
    """Held-out accuracy at the start of the run (before SFT if any), at RL step 0, and at its last evaluation."""
    path = Path(out_dir) / "metrics.jsonl"
    rows = read_rows(path) if path.exists() else []
    # evaluations that scored something (an empty held-out set, e.g. every item also a training one, scores nothing)
    evals = [r for r in rows if r["kind"] in ("eval_before_sft", "eval") and "greedy_accuracy" in r]
    if not evals:
        return f"summary ({out_dir}): no held-out problems were evaluated"
    keys = ("greedy_accuracy", "sampled_accuracy")
    points = [("start", evals[0])] + ([("RL step 0", evals[1])] if evals[0]["kind"] == "eval_before_sft"
                                       and len(evals) > 2 else []) + [(f"step {evals[-1]['step']}", evals[-1])]
    return f"summary ({out_dir}): " + "; ".join(
        f"{k.replace('_', ' ')} " + " -> ".join(f"{r[k]:.3f} ({w})" for w, r in points) for k in keys)
