"""Mechanism checks of the positive controls (issue 25): for each finished run of a control spec, the
figures its prediction is about, and whether the prediction held. The predictions are written here and
in the spec's header before the runs; this reads the runs' records (the archive or out_dir), never
edits them. `jaxrl-llm ablate-check SPEC [--out FILE.md]` prints the report.
"""

from __future__ import annotations

import inspect
import statistics
from pathlib import Path

from jaxrl_llm.ablate.records import RunData, by_step, collect
from jaxrl_llm.ablate.spec import Spec, SpecError, load_spec

TAIL = 10  # steps the "holds" figures average over, at the end of a run


def _series(run: RunData, key: str) -> list[float]:
    rows = by_step(run.rows, "train")
    return [float(rows[s][key]) for s in sorted(rows) if key in rows[s]]


def _tail_mean(values: list[float]) -> float:
    return statistics.fmean(values[-TAIL:])


def closed_loop(run: RunData, runs=()) -> dict:
    """lr 0 from a low start temperature toward a set target: T rises monotonically until the entropy first
    comes within 5 % of the target, and the last steps' mean entropy is within 5 % of it."""
    temps, ents, target = _series(run, "temperature"), _series(run, "entropy"), _series(run, "e3_target_entropy")
    h_star = target[0]
    reach = next((i for i, h in enumerate(ents) if abs(h / h_star - 1) <= 0.05), len(ents))
    rising = all(b >= a for a, b in zip(temps[:reach + 1], temps[1:reach + 1]))
    gap = _tail_mean(ents) / h_star - 1
    worst = max(abs(h / h_star - 1) for h in ents[-TAIL:])
    return {"T first": temps[0], "T last": temps[-1], "target H*": h_star, "steps to reach 5 %": reach + 1,
            "T monotone until then": rising, f"entropy gap, last {TAIL}": gap, f"worst step, last {TAIL}": worst,
            "holds": rising and abs(gap) <= 0.05}


def collapse_grpo(run: RunData, runs=()) -> dict:
    """High learning rate under plain GRPO: the last steps' entropy is below half of step 1's (and, at lr
    3e-4, held-out greedy accuracy does not end below its start: a collapse, not a wrecked policy)."""
    ents = _series(run, "entropy")
    ratio = _tail_mean(ents) / ents[0]
    evals = by_step(run.rows, "eval")
    start, end = (float(evals[s].get("greedy_accuracy", float("nan"))) if evals else float("nan")
                  for s in (min(evals, default=0), max(evals, default=0)))
    kept = end >= start if run.arm.endswith("3e-4") else True
    return {"H step 1": ents[0], f"H last {TAIL}": _tail_mean(ents), "ratio": ratio,
            "greedy start": start, "greedy end": end, "holds": ratio < 0.5 and kept}


def collapse_e3(run: RunData, runs=()) -> dict:
    """The same learning rate with E3's temperature controller: the last steps' entropy within 10 % of target."""
    ents, target = _series(run, "entropy"), _series(run, "e3_target_entropy")
    gap = _tail_mean(ents) / target[-1] - 1
    return {"H step 1": ents[0], f"H last {TAIL}": _tail_mean(ents), "target H*": target[-1],
            "T last": _series(run, "temperature")[-1], "gap to target": gap, "holds": abs(gap) <= 0.10}


def _weighted(run: RunData, key: str, weight: str) -> float:
    """A per-step rate over the run, each step weighted by its count of `weight` (steps without it skipped)."""
    rows = by_step(run.rows, "train").values()
    pairs = [(float(r[key]), float(r[weight])) for r in rows if key in r and r.get(weight) and r[key] == r[key]]
    total = sum(w for _, w in pairs)
    return sum(v * w for v, w in pairs) / total if total else float("nan")


def _total(run: RunData, key: str) -> float:
    return float(sum(r.get(key, 0) for r in by_step(run.rows, "train").values()))


def _replay_figures(run: RunData) -> dict:
    on_wrong = _total(run, "rrl_replay_groups_all_wrong_prompts")
    last = by_step(run.rows, "train")
    return {"continuation success": _weighted(run, "rrl_continuation_success", "rrl_replay_rows"),
            "fresh success, same prompts": _weighted(run, "rrl_fresh_success_same_prompts", "rrl_replay_rows"),
            "replay groups on all-wrong prompts": int(on_wrong),
            "mixed share of those": _total(run, "rrl_replay_mixed_all_wrong_prompts") / on_wrong if on_wrong else
            float("nan"),
            "zero-variance replay groups": _weighted(run, "replay_groups_zero_variance", "rrl_replayed_states"),
            "solved first via replay": int(last[max(last)].get("rrl_solved_first_via_replay", 0))}


def rrl(run: RunData, runs) -> dict:
    """Continuations succeed at least twice as often as fresh rollouts of the same prompts; at least a quarter
    of the replay groups on prompts whose latest fresh group was all wrong are mixed; some prompt is first
    solved via replay."""
    f = _replay_figures(run)
    holds = (f["continuation success"] >= 2 * f["fresh success, same prompts"] and f["mixed share of those"] >= 0.25
             and f["solved first via replay"] > 0)
    return {**f, "holds": holds}


def rrl_value(run: RunData, runs) -> dict:
    """The value-greedy draw: a larger share of zero-variance replay groups than the uncertainty draw (arm rrl,
    mean over its finished seeds)."""
    f = _replay_figures(run)
    theirs = [_replay_figures(r)["zero-variance replay groups"] for r in runs if r.arm == "rrl"]
    ref = statistics.fmean(theirs) if theirs else float("nan")
    return {**f, "rrl arm's zero-variance share": ref, "holds": f["zero-variance replay groups"] > ref}


WIDENED = 9  # first step of the budget control after its bounds have widened (epochs of 4 steps, delta 4)


def budget(run: RunData, runs) -> dict:
    """Once widened, the easiest rank quintile gets the lower bound and the hardest the upper (within a row);
    more of the step's rows sit in mixed-reward groups than under GRPO (arm grpo, mean over its seeds), at
    sampled tokens within 5 % of GRPO's."""
    rows = [r for s, r in by_step(run.rows, "train").items() if s >= WIDENED]
    q1 = statistics.fmean(r["e3_group_size_q1"] for r in rows if "e3_group_size_q1" in r)
    q5 = statistics.fmean(r["e3_group_size_q5"] for r in rows if "e3_group_size_q5" in r)
    n_min = statistics.fmean(r["e3_n_min"] for r in rows)
    n_max = statistics.fmean(r["e3_n_max"] for r in rows)

    def mixed(r):
        return statistics.fmean(x["rows_in_mixed_groups"] for s, x in by_step(r.rows, "train").items()
                                if s >= WIDENED)

    grpo = [r for r in runs if r.arm == "grpo"]
    mine, theirs = mixed(run), statistics.fmean(mixed(r) for r in grpo) if grpo else float("nan")
    tokens = _total(run, "sampled_tokens")
    their_tokens = statistics.fmean(_total(r, "sampled_tokens") for r in grpo) if grpo else float("nan")
    holds = q1 <= n_min + 1 and q5 >= n_max - 1 and mine > theirs and abs(tokens / their_tokens - 1) <= 0.05
    return {"group size q1 (easiest)": q1, "n_min": n_min, "group size q5 (hardest)": q5, "n_max": n_max,
            "rows in mixed groups": mine, "GRPO's": theirs, "sampled tokens / GRPO's": tokens / their_tokens,
            "holds": holds}


HIDDEN = 1  # position of the hidden item in the HeRL control's rubrics (tools/hidden_rubric_tasks.py)


def _hidden_rate(run: RunData) -> tuple[float, float]:
    """(step 1's, the last 4 steps' mean) rate of the hidden item in fresh samples."""
    rates = [r["rubric_item_met"][HIDDEN] for _, r in sorted(by_step(run.rows, "train").items())]
    return rates[0], statistics.fmean(rates[-4:])


def _final_eval(run: RunData, key: str) -> float:
    evals = by_step(run.rows, "eval")
    return float(evals[max(evals)].get(key, float("nan")))


def _arm_mean(runs, arm: str, fn) -> float:
    values = [fn(r) for r in runs if r.arm == arm]
    return statistics.fmean(values) if values else float("nan")


def herl_hidden(run: RunData, runs) -> dict:
    """Revision success >= 0.3 over the first 4 steps (calibration); the hidden item's rate in fresh samples
    (last 4 steps) at least 0.1 above GRPO's, and held-out sampled reward above GRPO's (means over GRPO's seeds)."""
    trained = by_step(run.rows, "train")
    success = statistics.fmean(trained[s]["herl_revision_success"] for s in sorted(trained)[:4]
                               if "herl_revision_success" in trained[s])
    start, end = _hidden_rate(run)
    grpo_end = _arm_mean(runs, "grpo", lambda r: _hidden_rate(r)[1])
    reward, grpo_reward = (_final_eval(run, "sampled_reward_mean"),
                           _arm_mean(runs, "grpo", lambda r: _final_eval(r, "sampled_reward_mean")))
    return {"revision success, steps 1-4": success, "hidden rate step 1": start, "hidden rate last 4": end,
            "GRPO's last 4": grpo_end, "held-out sampled reward": reward, "GRPO's": grpo_reward,
            "holds": success >= 0.3 and end >= grpo_end + 0.1 and reward > grpo_reward}


def hidden_flat(run: RunData, runs) -> dict:
    """The hidden item's rate (last 4 steps) stays within 0.1 of its step-1 base."""
    start, end = _hidden_rate(run)
    return {"hidden rate step 1": start, "hidden rate last 4": end, "holds": abs(end - start) <= 0.1}


def herl_slower(run: RunData, runs) -> dict:
    """A smaller hindsight weight: the hidden item's rise (last 4 steps minus step 1) below herl's (mean)."""
    start, end = _hidden_rate(run)
    theirs = _arm_mean(runs, "herl", lambda r: _hidden_rate(r)[1] - _hidden_rate(r)[0])
    return {"hidden rate step 1": start, "hidden rate last 4": end, "rise": end - start, "herl's rise": theirs,
            "holds": end - start < theirs}


def all_three(run: RunData, runs) -> dict:
    """E3 + RRL + HeRL together: HeRL's prediction (herl_hidden against GRPO's seeds); continuations succeed at
    least as often as fresh rollouts of the same prompts; the entropy of the last 4 steps within 10 % of E3's
    target; held-out sampled reward at least HeRL alone's (mean over its seeds) minus 0.05."""
    herl = herl_hidden(run, runs)
    replay = _replay_figures(run)
    ents, targets = _series(run, "entropy")[-4:], _series(run, "e3_target_entropy")[-4:]
    entropy_gap = statistics.fmean(abs(h / t - 1) for h, t in zip(ents, targets)) if targets else float("nan")
    herl_alone = _arm_mean(runs, "herl", lambda r: _final_eval(r, "sampled_reward_mean"))
    reward = herl["held-out sampled reward"]
    holds = (herl["revision success, steps 1-4"] >= 0.3 and herl["hidden rate last 4"] >= herl["GRPO's last 4"] + 0.1
             and replay["continuation success"] >= replay["fresh success, same prompts"] and entropy_gap <= 0.1
             and reward >= herl_alone - 0.05)
    return {**{k: v for k, v in herl.items() if k != "holds"}, "HeRL alone's": herl_alone,
            "continuation success": replay["continuation success"],
            "fresh success, same prompts": replay["fresh success, same prompts"],
            "entropy gap to target, last 4": entropy_gap, "holds": holds}


CHECKS = {  # spec file stem -> arm -> check
    "e3_temperature_control": {"closed_loop": closed_loop, "closed_loop_100": closed_loop,
                               "grpo_collapse": collapse_grpo,
                               "e3_collapse": collapse_e3, "grpo_collapse_3e-4": collapse_grpo,
                               "e3_collapse_3e-4": collapse_e3, "grpo_collapse_400": collapse_grpo,
                               "e3_collapse_400": collapse_e3},
    "e3_budget_control": {"budget": budget},
    "herl_control": {"herl": herl_hidden, "grpo": hidden_flat, "herl_revise_prompt": hidden_flat,
                     "herl_low_weight": herl_slower},
    "rrl_control": {"rrl": rrl, "rrl_reference": rrl, "rrl_value": rrl_value},
    "all_three_control": {"all_three": all_three, "e3": hidden_flat, "rrl": hidden_flat, "grpo": hidden_flat,
                          "herl": herl_hidden},
}


def _fmt(v) -> str:
    if isinstance(v, bool):
        return "yes" if v else "NO"
    if isinstance(v, float):
        return f"{v:.3f}"
    return str(v)


def report(spec_path: str, spec: Spec | None = None) -> str:
    """The checks' tables for the spec at spec_path (`spec`: that spec as loaded, e.g. with another out_dir)."""
    spec = load_spec(spec_path) if spec is None else spec
    checks = CHECKS.get(Path(spec_path).stem)
    if checks is None:
        raise SpecError(f"{spec_path}: no mechanism checks defined in jaxrl_llm/ablate/controls.py "
                        f"(known: {sorted(CHECKS)})")
    runs, missing = collect(spec)
    out = [f"# Mechanism checks: {spec_path}", "", f"Made by `python tools/controls.py {spec_path}`.", ""]
    for arm, check in checks.items():
        mine = [r for r in runs if r.arm == arm]
        out += [f"## {arm}", "", inspect.cleandoc(check.__doc__ or ""), ""]
        if not mine:
            out += ["(no finished run)", ""]
            continue
        results = [(r.seed, check(r, runs)) for r in mine]
        keys = list(results[0][1])
        out += ["| seed | " + " | ".join(keys) + " |", "|---" * (len(keys) + 1) + "|"]
        out += [f"| {seed} | " + " | ".join(_fmt(res[k]) for k in keys) + " |" for seed, res in results]
        held = sum(res["holds"] for _, res in results)
        out += ["", f"Prediction held in {held} of {len(results)} runs.", ""]
    if missing:
        out += ["## Not finished", ""] + [f"- {arm} seed {seed}: {why}" for arm, seed, why in missing] + [""]
    return "\n".join(out)
