"""Generated rubric tasks (seeded, held-out constraint combinations, rubrics that parse and that a compliant
response meets) and the rubric jsonl loader."""

import json
from pathlib import Path

import pytest

from jaxrl_llm.data.rubric_tasks import (BASE_INSTRUCTIONS, FAMILIES, combinations, load_rubric_jsonl,
                                         rubric_items)
from jaxrl_llm.data.tasks import DataError
from jaxrl_llm.rewards.rubrics import IFEVAL, grade, parse_rubric

EXAMPLE = Path(__file__).resolve().parents[1] / "configs" / "data" / "rubric_example.jsonl"


def combo(row) -> tuple[str, ...]:
    return tuple(sorted(it["check"][len(IFEVAL):] for it in row["rubric"]))


def test_seeded():
    assert rubric_items("train", 30, seed=3) == rubric_items("train", 30, seed=3)
    assert rubric_items("train", 30, seed=3) != rubric_items("train", 30, seed=4)
    assert rubric_items("eval", 10, seed=3) == rubric_items("eval", 10, seed=3)
    with pytest.raises(ValueError, match="split 'test'"):
        rubric_items("test", 1, seed=0)


def test_held_out_combinations_never_trained():
    split = combinations()
    assert split.eval and not set(split.train) & set(split.eval)
    assert all(len(c) >= 2 for c in split.eval)
    assert {c[0] for c in split.train if len(c) == 1} == set(FAMILIES)  # every constraint is trained alone
    train = {combo(r) for seed in (0, 1) for r in rubric_items("train", 300, seed)}
    held = {combo(r) for seed in (0, 1) for r in rubric_items("eval", 150, seed)}
    assert train <= set(split.train) and held <= set(split.eval) and not train & held
    assert len(held) > 50 and {len(c) for c in train} == {1, 2, 3}
    for c in train | held:  # no generated task asks for both cases, or for an impossible sentence position
        assert not {"change_case:english_lowercase", "change_case:english_capital"} <= set(c)
        assert not {"length_constraints:number_sentences", "sentence:keyword"} <= set(c)


def test_generated_rows_parse_and_read_as_instructions():
    rows = rubric_items("train", 150, seed=0) + rubric_items("eval", 80, seed=0)
    for i, row in enumerate(rows):
        items = parse_rubric(row["rubric"], f"row {i}")
        assert 1 <= len(items) <= 3 and all(it.weight == 1.0 for it in items)
        base = next(b for b in BASE_INSTRUCTIONS if row["question"].startswith(b))
        assert row["question"] == " ".join([base, *(it.description for it in items)])


def test_descriptions_state_the_checked_values():
    words = {"less than": "fewer than", "at least": "at least"}
    for row in rubric_items("train", 300, seed=5):
        for it in row["rubric"]:
            for key, value in it["args"].items():
                if key.endswith("relation"):
                    assert words[value] in it["description"], it
                    continue
                for v in value if isinstance(value, list) else [value]:
                    assert str(v).rstrip(".") in it["description"], (key, it)


def compliant(rubric) -> str | None:
    """A response meeting every constraint, written by hand per kind; None when a constraint is not one of these."""
    body, head, tail, quote = ["The lamp turns slowly over the dark water."], "", [], False
    for it in rubric:
        kind, args = it["check"][len(IFEVAL):], it["args"]
        if kind == "detectable_format:title":
            head = "<<notes from the shore>>\n"
        elif kind == "keywords:existence":
            body.append(f"It speaks of {args['keywords'][0]} and {args['keywords'][1]}.")
        elif kind == "keywords:frequency":
            body.append(" ".join([args["keyword"]] * args["frequency"]) + ".")
        elif kind == "keywords:letter_frequency":
            body.append(args["letter"] * args["let_frequency"] + ".")
        elif kind == "detectable_content:number_placeholders":
            body.append(" ".join(["Meet me at [place]."] * args["num_placeholders"]))
        elif kind == "detectable_format:number_highlighted_sections":
            body.append(" ".join(["It is *bright and slow*."] * args["num_highlights"]))
        elif kind == "detectable_content:postscript":
            tail.insert(0, f"{args['postscript_marker'].rstrip('.')}. Write back soon.")
        elif kind == "startend:end_checker":
            tail.append(args["end_phrase"])
        elif kind == "startend:quotation":
            quote = True
        elif kind not in ("punctuation:no_comma", "keywords:forbidden_words"):  # the body has no commas or fillers
            return None
    text = head + " ".join(body) + "".join("\n" + t for t in tail)
    return f'"{text}"' if quote else text


def test_compliant_responses_meet_generated_rubrics():
    met_all = 0
    for row in rubric_items("train", 400, seed=1) + rubric_items("eval", 200, seed=1):
        response = compliant(row["rubric"])
        if response is None:
            continue
        items = parse_rubric(row["rubric"], "t")
        score, met = grade(items, response)
        assert score == 1.0, (row["question"], response, met)
        assert grade(items, "")[0] == 0.0
        met_all += 1
    assert met_all >= 10


def test_example_file_loads():
    rows = load_rubric_jsonl(EXAMPLE)
    assert len(rows) == 5
    kinds = {it["check"].split(":")[0] for row in rows for it in row["rubric"]}
    assert kinds == {"ifeval", "py", "judge"}
    assert any("reference" in r for r in rows) and any("answer" in r for r in rows)
    for row in rows:
        items = parse_rubric(row["rubric"], "t")
        assert [it.to_dict() for it in items] == row["rubric"]


def test_generated_rows_round_trip(tmp_path):
    rows = rubric_items("eval", 20, seed=2)
    path = tmp_path / "gen.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    assert load_rubric_jsonl(path) == rows


GOOD = {"question": "Say hi.", "rubric": [{"description": "No commas.", "weight": 1,
                                           "check": "ifeval:punctuation:no_comma"}]}


@pytest.mark.parametrize("line,message", [
    (json.dumps({"rubric": GOOD["rubric"]}), r"row 1: key 'question' must be a non-empty string"),
    (json.dumps({"question": "q"}), r"row 1: key 'rubric' is missing"),
    (json.dumps({"question": "q", "rubric": "no commas"}), r"row 1: key 'rubric' must be a non-empty list"),
    (json.dumps({**GOOD, "rubric": GOOD["rubric"] + [{"description": "x", "weight": -2, "check": "judge"}]}),
     r"row 1 item 1: key 'weight' must be a number >= 0, got -2"),
    (json.dumps({**GOOD, "rubric": [{"description": "x", "weight": 1, "check": "ifeval:punctuation:no_commas"}]}),
     r"row 1 item 0: check 'ifeval:punctuation:no_commas' is no if-verifiable instruction id; closest: "
     r"'punctuation:no_comma'"),
    (json.dumps({**GOOD, "rubrics": []}), r"row 1: unknown key 'rubrics'"),
    (json.dumps({**GOOD, "answer": 47}), r"row 1: key 'answer' must be a string, got 47"),
    ('{"question": "q", "rubric": [', r"row 1: not JSON"),
    ("[1, 2]", r"row 1: a row must be a JSON object, got list"),
])
def test_loader_names_file_row_and_key(tmp_path, line, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(GOOD) + "\n" + line + "\n")
    with pytest.raises(DataError, match=r"bad\.jsonl: " + message):
        load_rubric_jsonl(path)


def test_loader_missing_or_empty_file(tmp_path):
    with pytest.raises(DataError, match=r"nope\.jsonl: no such file"):
        load_rubric_jsonl(tmp_path / "nope.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(DataError, match=r"empty\.jsonl: no rows"):
        load_rubric_jsonl(tmp_path / "empty.jsonl")
