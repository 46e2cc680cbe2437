"""Generated rubric tasks (seeded, held-out constraint combinations, rubrics that parse and that a compliant
response meets), the rubric jsonl loader, and rubric rows read from jsonl and parquet task files exactly."""

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from jaxrl_llm.config import load_config
from jaxrl_llm.data.rubric_tasks import (BASE_INSTRUCTIONS, FAMILIES, combinations, load_rubric_jsonl,
                                         rubric_items)
from jaxrl_llm.data.tasks import load_items
from jaxrl_llm.data.types import DataError
from jaxrl_llm.rewards.rubrics import IFEVAL, grade, parse_rubric

EXAMPLE = Path(__file__).resolve().parents[2] / "configs" / "data" / "rubric_example.jsonl"


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
     r"row 1 item 1: key 'weight' must be a finite number >= 0, got -2"),
    (json.dumps({**GOOD, "rubric": [{"description": "x", "weight": 1, "check": "ifeval:punctuation:no_commas"}]}),
     r"row 1 item 0: check 'ifeval:punctuation:no_commas' is no if-verifiable instruction id; closest: "
     r"'punctuation:no_comma'"),
    (json.dumps({**GOOD, "rubrics": []}), r"row 1: unknown key 'rubrics'"),
    (json.dumps({**GOOD, "answer": 47}), r"row 1: key 'answer' must be a string, got 47"),
    ('{"question": "q", "rubric": [', r"line 2: not JSON"),
    ("[1, 2]", r"line 2: a row must be a JSON object, got list"),
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


# rows whose items take different args ({"keywords": [...]}, {"N": 3}, {"n": 30}) beside judge items without any
# and a plain answer row: a parquet writer gives every row's args the union of these keys (null where absent)
MIXED = [
    {"question": "Name two things plants make food from.", "rubric": [
        {"description": 'Include "sunlight" and "water".', "weight": 1, "check": "ifeval:keywords:existence",
         "args": {"keywords": ["sunlight", "water"]}},
        {"description": "The answer is correct.", "weight": 2, "check": "judge"}]},
    {"question": "Name three years of the 1910s.", "answer": "1914", "reference": "1912, 1914, 1918", "rubric": [
        {"description": "Include exactly 3 numbers.", "weight": 1, "check": "ifeval:count:numbers", "args": {"N": 3}},
        {"description": "At most 30 words.", "weight": 0.5, "check": "py:max_words", "args": {"n": 30}},
        {"description": "The years are in the 1910s.", "weight": 1, "check": "judge", "args": {}}]},
    {"question": "1 + 1?", "answer": "2", "scorer": "exact"},
]


def _write_parquet(rows, path):
    """As pandas or datasets would write it: one column per key of any row, null where a row lacks it."""
    keys = list(dict.fromkeys(k for r in rows for k in r))
    pq.write_table(pa.Table.from_pylist([{k: r.get(k) for k in keys} for r in rows]), path)


def _expected(rows):
    """The oracle: each row as written, rubric items through parse_rubric (no file in between)."""
    return [(r["question"], r.get("answer", ""), r.get("reference", ""), "rubric" if "rubric" in r else r["scorer"],
             [it.to_dict() for it in parse_rubric(r["rubric"], "t")] if "rubric" in r else None) for r in rows]


def _loaded(path, kind):
    items = load_items(load_config(None, [f"data.source={kind}", f"data.path={path}"]).data, "train")
    return [(it.question, it.answer, it.reference, it.scorer, json.loads(it.rubric) if it.rubric else None)
            for it in items]


@pytest.mark.parametrize("kind", ["jsonl", "parquet"])
def test_rubric_rows_with_differing_args_load_exactly(tmp_path, kind):
    path = tmp_path / f"mixed.{kind}"
    if kind == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in MIXED))
    else:
        _write_parquet(MIXED, path)
        # the trap is real: the file's one args type holds every row's keys
        args_type = pq.read_schema(path).field("rubric").type.value_type.field("args").type
        assert sorted(args_type.names) == ["N", "keywords", "n"]
    expected = _expected(MIXED)
    assert expected[1][4][1]["args"] == {"n": 30} and expected[0][4][1]["args"] == {}
    assert _loaded(path, kind) == expected


def test_example_file_reads_the_same_from_parquet(tmp_path):
    """The shipped example (judge items without args beside ifeval and py items with their own) survives parquet."""
    rows = [json.loads(line) for line in EXAMPLE.read_text().splitlines()]
    _write_parquet(rows, tmp_path / "example.parquet")
    assert _loaded(tmp_path / "example.parquet", "parquet") == _loaded(EXAMPLE, "jsonl") == _expected(
        [{**r, "scorer": "rubric"} for r in rows])


def test_parquet_map_args_keep_their_keys(tmp_path):
    item = pa.struct([("description", pa.string()), ("weight", pa.float64()), ("check", pa.string()),
                      ("args", pa.map_(pa.string(), pa.int64()))])
    rows = [{"question": "Give tips.", "rubric": [
                {"description": "3 bullets", "weight": 1.0, "check": "ifeval:detectable_format:number_bullet_lists",
                 "args": {"num_bullets": 3}}]},
            {"question": "Be brief.", "rubric": [
                {"description": "At most 30 words.", "weight": 1.0, "check": "py:max_words", "args": {"n": 30}},
                {"description": "Polite.", "weight": 2.0, "check": "judge", "args": {}}]}]
    path = tmp_path / "map.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema=pa.schema([("question", pa.string()),
                                                                 ("rubric", pa.list_(item))])), path)
    assert _loaded(path, "parquet") == [(r["question"], "", "", "rubric", [it.to_dict() for it in
                                         parse_rubric(r["rubric"], "t")]) for r in rows]


def test_task_file_errors_name_the_file_and_line(tmp_path):
    path = tmp_path / "broken.jsonl"
    path.write_text(json.dumps(MIXED[2]) + "\n\n" + '{"question": "q", "answer":\n')
    with pytest.raises(DataError, match=r"broken\.jsonl: line 3: not JSON: Expecting value \(column 28\)$"):
        _loaded(path, "jsonl")
    path.write_text(json.dumps(MIXED[2]) + "\n" + json.dumps(["q", "a"]) + "\n")
    with pytest.raises(DataError, match=r"broken\.jsonl: line 2: a row must be a JSON object, got list$"):
        _loaded(path, "jsonl")
    for bad, why in [('{"question": "q", "answer": ' + "9" * 5000 + "}", "ValueError: Exceeds the limit"),
                     ('{"question": ' * 200_000, "RecursionError")]:  # json.loads' own errors, not JSONDecodeError
        path.write_text(json.dumps(MIXED[2]) + "\n" + bad + "\n")
        with pytest.raises(DataError, match=rf"broken\.jsonl: line 2: not a row this reader can take: {why}"):
            _loaded(path, "jsonl")
    huge = '{"question": "q", "answer": "1", "difficulty": 1' + "0" * 400 + "}"
    path.write_text(json.dumps(MIXED[2]) + "\n" + huge + "\n")
    with pytest.raises(DataError, match=r"broken\.jsonl: row 1 has difficulty 1000{77}; give a number in \[0, 1\]"):
        _loaded(path, "jsonl")
    path.write_text(json.dumps({**MIXED[2], "rubric": [{"description": "d", "weight": 10**400, "check": "judge"}]}))
    with pytest.raises(DataError, match=r"broken\.jsonl: row 0 item 0: key 'weight' must be a finite number >= 0"):
        _loaded(path, "jsonl")
    path.write_bytes(b'{"question": "caf\xe9", "answer": "1"}\n')
    with pytest.raises(DataError, match=r"broken\.jsonl: not UTF-8 text"):
        _loaded(path, "jsonl")
    path.write_text("\n")
    with pytest.raises(DataError, match=r"broken\.jsonl: no rows$"):
        _loaded(path, "jsonl")
    with pytest.raises(DataError, match=r"nope\.parquet: no such file$"):
        _loaded(tmp_path / "nope.parquet", "parquet")
    whole = tmp_path / "whole.parquet"
    _write_parquet(MIXED, whole)
    (tmp_path / "half.parquet").write_bytes(whole.read_bytes()[:whole.stat().st_size // 2])
    with pytest.raises(DataError, match=r"half\.parquet: could not be read as parquet: ") as err:
        _loaded(tmp_path / "half.parquet", "parquet")
    assert "\n" not in str(err.value)
