"""Mesh sizes and RRL's replay share are checked when the config loads, naming the keys (a review found
mesh.fsdp=0 with mesh.data=-1 ending in a ZeroDivisionError, and a replay share too small for one state letting RRL
collect states it never replayed)."""

import pytest

from jaxrl_llm.config import ConfigError, load_config


@pytest.mark.parametrize("sizes", [["mesh.fsdp=0"], ["mesh.tensor=-2"], ["mesh.data=-1", "mesh.fsdp=-1"]])
def test_mesh_sizes_are_refused_naming_the_keys(sizes):
    with pytest.raises(ConfigError, match=r"mesh sizes \{'mesh.data': .*each must be >= 1, or -1"):
        load_config(None, sizes)


def test_mesh_sizes_that_make_a_mesh_load():
    assert load_config(None, ["mesh.data=2", "mesh.fsdp=-1", "mesh.tensor=2"]).mesh.fsdp == -1


def test_a_replay_share_below_one_state_is_refused():
    rows = ["rollout.prompts_per_step=2", "rollout.group_size=4", "explore.rrl.enabled=true"]  # 8 rows a step
    with pytest.raises(ConfigError, match=r"replay_ratio x rows per step \(0.25 x 8\) is below continuations \(4\)"):
        load_config(None, rows)
    assert load_config(None, rows + ["explore.rrl.replay_ratio=0.5"]).explore.rrl.replay_ratio == 0.5
