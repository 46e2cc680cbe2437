"""config/load.py and checks.py on what users type: overrides kept as written where a field is text, numbers as
YAML 1.2 reads them, a key given twice, files that are no config, values no run can use (each found by a review,
2026-12-07, and each failing on the loader before it)."""

import json

import pytest

from jaxrl_llm.config import ConfigError, load_config


def test_a_text_field_takes_the_override_as_written():
    cfg = load_config(None, ["data.instruction=Put the answer after #### like GSM8K",
                             "data.system_prompt=Answer: give a number # be kind"])
    assert cfg.data.instruction == "Put the answer after #### like GSM8K"  # YAML cut it at ' #'
    assert cfg.data.system_prompt == "Answer: give a number # be kind"  # YAML read a mapping
    # a quoted value is a YAML scalar, as before (specs and scripts quote templates that start with '{')
    cfg = load_config(None, ["explore.herl.revise_template='{question} D {draft} M {met} U {unmet}'",
                             'data.instruction="Say \\"yes\\"."'])
    assert cfg.explore.herl.revise_template == "{question} D {draft} M {met} U {unmet}"
    assert cfg.data.instruction == 'Say "yes".'


def test_numbers_are_read_as_yaml_1_2_reads_them():
    assert load_config(None, ["train.steps=010"]).train.steps == 10  # YAML 1.1: octal 8
    for text in ("1:30", "0b101"):  # YAML 1.1: 90 and 5
        with pytest.raises(ConfigError, match=rf"'train.steps' must be int, got '{text}'"):
            load_config(None, [f"train.steps={text}"])
    functions = [{"name": "jaxrl_llm.rewards.examples:length_penalty", "weight": "WEIGHT"}]
    text = json.dumps(functions).replace('"WEIGHT"', "1e-3")  # YAML 1.1 read 1e-3 as a string: refused
    assert load_config(None, [f"reward.functions={text}"]).reward.functions[0]["weight"] == 0.001


def test_a_config_file_that_is_no_config_is_named(tmp_path):
    twice = tmp_path / "twice.yaml"
    twice.write_text("train: {steps: 5}\noptim: {lr: 0.1}\ntrain: {seed: 3}\n")
    with pytest.raises(ConfigError, match=r"twice.yaml: invalid YAML: .*the key 'train' is given twice"):
        load_config(twice)
    for name, content, why in (("list.yaml", "- a\n- b\n", "a config is a mapping of sections .* got list"),
                               ("zero.yaml", "0\n", "a config is a mapping of sections .* got int 0"),
                               ("bin.yaml", b"\xd0\xff\x00", "not UTF-8 text")):
        path = tmp_path / name
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
        with pytest.raises(ConfigError, match=rf"{name}: {why}"):
            load_config(path, ["train.steps=3"])
    with pytest.raises(ConfigError, match=r": is a folder, not a config file"):
        load_config(tmp_path)
    empty = tmp_path / "empty_section.yaml"
    empty.write_text("explore:\n  # e3: {enabled: true}\n")  # a section whose keys are all commented out
    assert load_config(empty, ["explore.e3.enabled=true"]).explore.e3.enabled


@pytest.mark.parametrize("override,why", [
    ("optim.lr=.nan", "optim.lr=nan must be a finite number >= 0"),
    ("optim.lr=-1e-6", "optim.lr=-1e-06 must be a finite number >= 0"),
    ("sft.lr=.inf", "sft.lr=inf must be a finite number >= 0"),
    ("optim.max_grad_norm=-1", r"optim.max_grad_norm=-1.0 must be > 0"),
    ("optim.max_grad_norm=0", r"optim.max_grad_norm=0.0 must be > 0"),
    ("optim.warmup_steps=-5", r"optim: warmup_steps \(-5\)"),
    ("train.steps=-3", r"train.steps \(-3\) and sft.steps \(0\) must be >= 0"),
    ("sft.batch_size=0", r"sft.batch_size \(0\) >= 1"),
    ("rollout.top_k=-2", r"top_k \(-2\) >= 0"),
    ("rollout.top_p=0", r"top_p \(0.0\) in \(0, 1\]"),
])
def test_values_no_run_can_use_are_refused(override, why):
    with pytest.raises(ConfigError, match=why):
        load_config(None, [override])


def test_home_in_the_run_paths_is_expanded(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    cfg = load_config(None, ["train.out_dir=~/runs/x", "data.path=~/d.jsonl", "data.source=jsonl"])
    assert cfg.train.out_dir == str(tmp_path / "runs" / "x") and cfg.data.path == str(tmp_path / "d.jsonl")


def test_unknown_scratch_model_keys_are_named():
    from jaxrl_llm.model.config import ModelConfig, UnsupportedModelError

    with pytest.raises(UnsupportedModelError, match=r"model.scratch: unknown keys \['bogus'\]; known: .*hidden_size"):
        ModelConfig.from_scratch({"hidden_size": 8, "bogus": 3}, vocab_size=10, param_dtype="float32",
                                 eos_token_ids=(1,))


def test_a_corrupt_model_config_names_its_file(tmp_path):
    from jaxrl_llm.model.config import ModelConfig, UnsupportedModelError

    (tmp_path / "config.json").write_text("{")
    with pytest.raises(UnsupportedModelError, match=rf"{tmp_path / 'config.json'}: not a JSON config"):
        ModelConfig.from_hf_folder(tmp_path)


def test_sft_without_sft_steps_is_refused_and_help_and_ablate_commands_probe_no_network(monkeypatch, capsys):
    from jaxrl_llm import cli, hub

    monkeypatch.setattr(hub, "offline_unless_reachable", lambda *a, **k: pytest.fail("network check on --help"))
    monkeypatch.setattr(cli, "offline_unless_reachable", lambda *a, **k: pytest.fail("network check on --help"))
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    assert cli.main(["ablate-check", "configs/ablate/herl_control.yaml"]) == 0  # records only: no probe either
    for command in ("ablate", "ablate-ci"):  # their processes run offline: no probe (a missing spec, refused)
        assert cli.main([command, "configs/ablate/no_such_spec.yaml"]) == 2
        assert "no_such_spec.yaml" in capsys.readouterr().err
    capsys.readouterr()
    monkeypatch.setattr(cli, "offline_unless_reachable", lambda *a, **k: False)
    assert cli.main(["sft", "--config", "configs/toy.yaml", "sft.steps=0"]) == 2
    assert "jaxrl-llm sft trains sft.steps supervised steps, and the config has sft.steps=0" in capsys.readouterr().err


@pytest.mark.parametrize("override", ["model.lora=0", "explore.e3=false"])
def test_a_section_given_a_value_is_refused(override):
    """`explore.e3=false` read as the section's defaults (e3 stays as configured) instead of an error."""
    with pytest.raises(ConfigError, match=rf"'{override.split('=')[0]}' must be a mapping"):
        load_config(None, [override])
