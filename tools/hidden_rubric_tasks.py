"""Hidden-requirement rubric tasks for HeRL's positive control (issue 25, configs/ablate/herl_control.yaml).

Each task is a short writing instruction with one visible, easy constraint ("Use fewer than N words.") and a
rubric of two items: that constraint, and a hidden one the question never states. A policy that has never been
told meets the hidden item only by chance, so under GRPO it contributes (almost) no advantage; HeRL's revise
prompt names it as unmet, so only hindsight can teach it. The reward is the share of items met: 0.5 for the
visible item alone, 1 for both.

Two hidden items, one task pair each:
    title    hidden_title_{train,eval}.jsonl: a title in <<double angular brackets>> (IFEval's title check). The
             control's task: SmolLM2-135M-Instruct revising its own draft copies the draft nearly verbatim, and
             a title put in front of the copy is the one edit it makes reliably (revision success 0.5 on the
             calibration probe, tools/results/herl_template_calib/README.md); unprompted, 0 of 32 drafts.
    lantern  hidden_word_{train,eval}.jsonl: mention a lantern. The first design; its revisions copy the draft
             without the word (success 0.0-0.19 with the draft in the revise prompt), so it failed calibration.

Training tasks use 30 of the base instructions, held-out tasks the other 8 (instructions that invite a
lantern on their own, a lighthouse or a clockmaker's shop, are left out for both items, so the two task
sets share their questions), each with 8 word limits.

    .venv/bin/python tools/hidden_rubric_tasks.py configs/data   # writes hidden_{title,word}_{train,eval}.jsonl
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from jaxrl_llm.data.rubric_tasks import BASE_INSTRUCTIONS  # noqa: E402

HIDDEN_WORD = "lantern"
# the hidden item of each task pair: (file stem, rubric item); the questions never state it
HIDDEN = (
    ("hidden_title", {"description": "Give the answer a title wrapped in double angular brackets, such as "
                                     "<<A Quiet Morning>>.", "weight": 1, "check": "ifeval:detectable_format:title",
                      "args": {}}),
    ("hidden_word", {"description": f"Mention a {HIDDEN_WORD} (use the word \"{HIDDEN_WORD}\").", "weight": 1,
                     "check": "py:contains_all", "args": {"keywords": [HIDDEN_WORD]}}),
)
LIMITS = (60, 70, 80, 90, 100, 110, 120, 150)
INVITING = ("lighthouse", "clockmaker")  # instructions whose answers would mention a lantern unprompted


def rows(instructions, hidden: dict) -> list[dict]:
    out = []
    for text in instructions:
        for n in LIMITS:
            out.append({"question": f"{text} Use fewer than {n} words.", "rubric": [
                {"description": f"Use fewer than {n} words.", "weight": 1, "check": "ifeval:length_constraints:number_words",
                 "args": {"num_words": n, "relation": "less than"}}, dict(hidden)]})
    return out


def main(argv=None) -> int:
    folder = Path((argv or sys.argv[1:] or ["configs/data"])[0])
    base = [t for t in BASE_INSTRUCTIONS if not any(w in t.lower() for w in INVITING)]
    for stem, hidden in HIDDEN:
        for name, part in (("train", base[:30]), ("eval", base[30:])):
            path = folder / f"{stem}_{name}.jsonl"
            path.write_text("".join(json.dumps(r) + "\n" for r in rows(part, hidden)))
            print(f"{path}: {len(part) * len(LIMITS)} tasks")
    return 0


if __name__ == "__main__":
    sys.exit(main())
