"""Any data set the `datasets` way (data.source: hf), column mapping and extra columns, answer presets, the
preprocessing hook, multi-turn prompts through the chat template, and the HF_* environment left to the CLI."""

import dataclasses
import json
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.helpers import CHAT, byte_bpe_tokenizer, hf_tokenizer
from jaxrl_llm.config import ConfigError, load_config
from jaxrl_llm.data.tasks import load_items
from jaxrl_llm.data.types import DataError
from jaxrl_llm.hub import offline_unless_reachable
from jaxrl_llm.model.tokenizer import load_tokenizer, read_chat_template
from jaxrl_llm.train.policy import encode_prompt
from tests.stand_in_http import serve

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
GSM8K = FIXTURES / "gsm8k_tiny.parquet"
MATH = FIXTURES / "math_tiny.jsonl"
# worked out by hand from the fixtures' word problems (not read back from the loader)
GSM8K_GOLD = ["29", "405", "1250", "7", "-6", "20", "150", "3600"]
MATH_GOLD = [r"\frac{3}{4}", r"2\sqrt{5}", "3", r"\{1, 2\}", "1024"]


def _jsonl(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_gsm8k_recipe_reads_gold_answers_through_datasets():
    cfg = load_config(ROOT / "configs" / "gsm8k.yaml",
                      [f"data.data_files={{train: {GSM8K}, test: {GSM8K}}}", "data.eval_split=test[6:]"])
    assert cfg.data.source == "hf" and cfg.data.answer_preset == "gsm8k"
    items = load_items(cfg.data, "train")
    rows = pq.read_table(GSM8K).to_pylist()
    assert [it.answer for it in items] == GSM8K_GOLD
    assert [it.question for it in items] == [r["question"] for r in rows]
    assert [it.reference for it in items] == [r["answer"] for r in rows]  # the worked solution, as written
    assert {it.extra for it in items} == {""} and items[2].uid == f"{GSM8K} [train]:2"
    held = load_items(cfg.data, "eval")  # datasets' own split slicing
    assert [it.answer for it in held] == GSM8K_GOLD[6:] and held[0].uid.endswith("[test[6:]]:0")


def test_math_recipe_maps_columns_and_passes_the_rest_to_extra():
    cfg = load_config(ROOT / "configs" / "math.yaml", [f"data.data_files={MATH}", "data.eval_split="])
    items = load_items(cfg.data, "train")
    rows = [json.loads(line) for line in MATH.read_text().splitlines()]
    assert [it.answer for it in items] == MATH_GOLD
    assert [it.question for it in items] == [r["problem"] for r in rows]
    assert [it.reference for it in items] == [r["solution"] for r in rows]
    assert [json.loads(it.extra) for it in items] == [{"level": r["level"], "type": r["type"]} for r in rows]
    assert load_items(cfg.data, "eval") == []


def test_file_rows_keep_their_other_keys_in_extra(tmp_path):
    path = _jsonl(tmp_path / "t.jsonl", [{"question": "q0", "answer": "1", "id": 7, "tags": ["a", "b"]},
                                         {"question": "q1", "answer": "2", "scorer": "exact"}])
    items = load_items(load_config(None, ["data.source=jsonl", f"data.path={path}"]).data, "train")
    assert json.loads(items[0].extra) == {"id": 7, "tags": ["a", "b"]} and items[1].extra == ""
    assert [(it.answer, it.scorer, it.uid) for it in items] == [("1", "math", f"{path}:0"), ("2", "exact", f"{path}:1")]


def test_preprocess_hook_rewrites_and_drops_rows(tmp_path, caplog, monkeypatch):
    hook = tmp_path / "hooks.py"
    hook.write_text("def keep_easy(row):\n"
                    "    if row['level'] != 'Level 1':\n"
                    "        return None\n"
                    "    return {**row, 'problem': row['problem'].upper(), 'source': 'math'}\n")
    cfg = load_config(ROOT / "configs" / "math.yaml",
                      [f"data.data_files={MATH}", "data.eval_split=", f"data.preprocess={hook}:keep_easy"])
    with caplog.at_level(logging.WARNING, logger="jaxrl_llm.data"):
        items = load_items(cfg.data, "train")
    rows = [json.loads(line) for line in MATH.read_text().splitlines()]
    easy = [r for r in rows if r["level"] == "Level 1"]
    assert [it.question for it in items] == [r["problem"].upper() for r in easy]
    assert [it.answer for it in items] == [MATH_GOLD[i] for i, r in enumerate(rows) if r["level"] == "Level 1"]
    assert json.loads(items[0].extra) == {"level": "Level 1", "type": "Prealgebra", "source": "math"}
    assert "dropped 2 of 5 rows (rows 1, 3)" in caplog.text
    monkeypatch.syspath_prepend(str(tmp_path))  # the module:function form, for an importable module
    again = load_items(dataclasses.replace(cfg.data, preprocess="hooks:keep_easy"), "train")
    assert [(it.question, it.answer, it.extra) for it in again] == [(it.question, it.answer, it.extra) for it in items]


def test_messages_row_renders_through_the_chat_template(tmp_path):
    turns = [{"role": "system", "content": "You add numbers."}, {"role": "user", "content": "2 + 2?"},
             {"role": "assistant", "content": "4"}, {"role": "user", "content": "3 + 5?"}]
    path = _jsonl(tmp_path / "chat.jsonl", [{"messages": turns, "answer": "8"}, {"question": "1 + 1?", "answer": "2"}])
    cfg = load_config(None, ["data.source=jsonl", f"data.path={path}", "data.instruction=Reply with a number.",
                             "data.system_prompt=Be brief."])
    chat, plain = load_items(cfg.data, "train")
    assert chat.question == "3 + 5?" and json.loads(chat.messages) == turns and plain.messages == ""
    tok = hf_tokenizer(byte_bpe_tokenizer())
    oracle = lambda msgs: tok(tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True),  # noqa: E731
                              add_special_tokens=False)["input_ids"]
    # the row's own system turn stays (data.system_prompt only fills in for rows without one)
    last = {"role": "user", "content": "3 + 5?\nReply with a number."}
    assert encode_prompt(tok, cfg, chat) == oracle(turns[:3] + [last])
    assert encode_prompt(tok, cfg, plain) == oracle([{"role": "system", "content": "Be brief."},
                                                     {"role": "user", "content": "1 + 1?\nReply with a number."}])


def test_chat_template_override_for_a_tokenizer_without_one(tmp_path):
    from transformers import PreTrainedTokenizerFast

    bare = PreTrainedTokenizerFast(tokenizer_object=byte_bpe_tokenizer(), eos_token="<|im_end|>")
    assert not bare.chat_template
    bare.save_pretrained(str(tmp_path / "tok"))
    (tmp_path / "chat.jinja").write_text(CHAT)
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
            {"role": "user", "content": "2 + 2?"}]
    want = bare.apply_chat_template(msgs, chat_template=CHAT, tokenize=False, add_generation_prompt=True)
    assert want.endswith("<|im_start|>user\n2 + 2?<|im_end|>\n<|im_start|>assistant\n")
    tok = load_tokenizer(tmp_path / "tok", str(tmp_path / "chat.jinja"))
    assert tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True) == want
    assert read_chat_template(CHAT) == CHAT  # Jinja text is taken as it is
    with pytest.raises(FileNotFoundError, match=r"chat_template_override='nope.jinja': no such file"):
        read_chat_template("nope.jinja")
    with pytest.raises(ValueError, match=r"not a Jinja template"):
        read_chat_template("{% for m in messages %}")


def test_bad_columns_presets_and_hooks_are_named(tmp_path, caplog):
    def items(path, *extra):
        return load_items(load_config(None, ["data.source=jsonl", f"data.path={path}", *extra]).data, "train")

    path = _jsonl(tmp_path / "g.jsonl", [{"q": "a", "a": "x #### 1"}, {"q": "b", "a": "no marker"},
                                         {"q": "c", "a": "#### 2,000"}])
    with pytest.raises(DataError, match=rf"{path}: row 0: no column 'problem' \(data.columns.question\); "
                                        r"its columns: q, a"):
        items(path, "data.columns={question: problem, answer: a}")
    with pytest.raises(DataError, match=r"data.columns.prompt: 'prompt' is no task field"):
        items(path, "data.columns={prompt: q}")
    # one row in three without '####': skipped and named; the others load
    with caplog.at_level(logging.WARNING, logger="jaxrl_llm.data"):
        got = items(path, "data.columns={question: q, answer: a}", "data.answer_preset=gsm8k")
    assert [it.answer for it in got] == ["1", "2000"]
    assert "skipped 1 of 3 rows where data.answer_preset='gsm8k' finds no answer (rows 1)" in caplog.text
    # most rows without one: the preset (or column) is wrong, an error naming the rows
    with pytest.raises(DataError, match=r"data.answer_preset='boxed' finds no answer in 3 of 3 rows \(rows 0, 1, 2; "
                                        r"row 0's answer ends 'x #### 1'\)"):
        items(path, "data.columns={question: q, answer: a}", "data.answer_preset=boxed")
    for spec, match in (("no_such_module_xyz:f", r"data.preprocess='no_such_module_xyz:f': cannot import "
                                                 r"'no_such_module_xyz': ModuleNotFoundError"),
                        ("json:no_such_fn", r"data.preprocess='json:no_such_fn': 'json' has no function 'no_such_fn'"),
                        ("missing.py:f", r"data.preprocess='missing.py:f': missing.py: no such file"),
                        ("json", r"data.preprocess='json': write it as module:function or file.py:function"),
                        ("json:dumps", rf"{path}: row 0: data.preprocess='json:dumps' returned str")):
        with pytest.raises(DataError, match=match):
            items(path, "data.columns={question: q, answer: a}", f"data.preprocess={spec}")


def test_hf_errors_name_the_split_and_the_data_set():
    with pytest.raises(DataError, match=rf"{GSM8K} \[validation\] \(data.eval_split\): datasets.load_dataset\("
                                        rf"'parquet', data_files='{GSM8K}', split='validation'\) failed: .*validation"):
        load_items(load_config(None, ["data.source=hf", "data.dataset=parquet", f"data.data_files={GSM8K}",
                                      "data.eval_split=validation"]).data, "eval")
    with pytest.raises(ConfigError, match=r"data.source=hf needs data.dataset"):
        load_config(None, ["data.source=hf"])
    with pytest.raises(ConfigError, match=r"'data.data_files' must be str or list or dict, got 3"):
        load_config(None, ["data.data_files=3"])
    assert load_config(None, ["data.data_files=[a.parquet, b.parquet]"]).data.data_files == ["a.parquet", "b.parquet"]


def test_hub_probe_sets_offline_only_when_the_user_chose_nothing_and_the_hub_is_silent():
    server = serve(lambda handler: (404, b""))  # any answer counts as reachable
    try:
        up = f"http://127.0.0.1:{server.server_address[1]}"
        env = {"HF_ENDPOINT": up}
        assert not offline_unless_reachable(env, log=lambda m: None) and "HF_HUB_OFFLINE" not in env
    finally:
        server.shutdown()
        server.server_close()
    messages = []
    env = {"HF_ENDPOINT": up}  # the same port, now closed: refused at once
    assert offline_unless_reachable(env, timeout_s=1.0, log=messages.append) and env["HF_HUB_OFFLINE"] == "1"
    assert up in messages[0]
    for key in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):  # the user's choice stands
        env = {key: "0", "HF_ENDPOINT": up}
        assert not offline_unless_reachable(env, log=messages.append) and env == {key: "0", "HF_ENDPOINT": up}


def test_importing_leaves_the_hf_environment_alone_and_the_cli_decides():
    script = (
        "import os, sys\n"
        "before = {k: v for k, v in os.environ.items() if k.startswith(('HF_', 'TRANSFORMERS_'))}\n"
        "import jaxrl_llm, jaxrl_llm.model.tokenizer, jaxrl_llm.hub, jaxrl_llm.cli\n"
        "after = {k: v for k, v in os.environ.items() if k.startswith(('HF_', 'TRANSFORMERS_'))}\n"
        "assert before == after, (before, after)\n"
        "try:\n"
        "    jaxrl_llm.cli.main(['--help'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "print('HELP=' + os.environ.get('HF_HUB_OFFLINE', 'unset'))\n"  # --help asks nothing of the network
        "jaxrl_llm.cli.main(['prepare-model', '/nonexistent/model/folder'])\n"
        "print('OFFLINE=' + os.environ.get('HF_HUB_OFFLINE', 'unset'))\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TRANSFORMERS_"))}
    env["HF_ENDPOINT"] = "http://127.0.0.1:9"  # the discard port: nothing listens, refused at once
    out = subprocess.run([sys.executable, "-c", script], env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "HELP=unset" in out.stdout and "OFFLINE=1" in out.stdout and "did not answer" in out.stderr, out
    # and no module of the package writes an HF_* key into the process environment (a subprocess's env= is fine)
    writes = re.compile(r"os\.environ(\[[^]]*\]\s*=[^=]|\.setdefault\(|\.update\(|\.pop\()|os\.putenv\(")
    found = [f"{f.relative_to(ROOT)}:{n}" for f in sorted((ROOT / "jaxrl_llm").rglob("*.py"))
             for n, line in enumerate(f.read_text().splitlines(), 1)
             if writes.search(line) and re.search(r"HF_|TRANSFORMERS_", line)]
    assert found == [], found
