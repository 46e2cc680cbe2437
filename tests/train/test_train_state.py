"""train/state.py: what split() saves and joined() puts back."""

import jax.numpy as jnp

from jaxrl_llm.train.state import TrainState


def test_explorer_state_without_arrays_survives_a_save_and_restore():
    """HeRL's state is {"herl": {}}: nothing for orbax to save. A resume must keep the explorer's name
    (a resumed HeRL run failed with KeyError: 'herl' when joined() put back {})."""
    live = TrainState(params={"w": jnp.ones(2)}, explore={"herl": {}}, stage="rl", step=3)
    arrays, registry = live.split()
    assert "explore" not in arrays and registry["step"] == 3
    fresh = TrainState(params={"w": jnp.zeros(2)}, explore={"herl": {}})  # a new run before its resume
    back = fresh.joined(arrays, registry)
    assert back.explore == {"herl": {}} and back.step == 3 and back.stage == "rl"
    assert float(back.params["w"][0]) == 1.0 and back.ref_params is None


def test_explorer_arrays_are_restored_from_the_checkpoint():
    live = TrainState(params={"w": jnp.ones(2)}, explore={"e3": {"t": jnp.full(1, 0.7)}, "herl": {}})
    arrays, registry = live.split()
    back = TrainState(explore={"e3": {"t": jnp.zeros(1)}, "herl": {}}).joined(arrays, registry)
    assert float(back.explore["e3"]["t"][0]) == jnp.float32(0.7)
