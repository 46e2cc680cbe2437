"""The prompt pipeline (data/pipeline.py): every item once per epoch, a fresh order each epoch, an iterator state
that resumes exactly, and no threads of its own (grain's default read options ran 16 prefetch threads)."""

import threading

import numpy as np
import pytest

from jaxrl_llm.data.pipeline import prompt_batches


def test_each_epoch_covers_every_item_once_in_a_new_order():
    it = prompt_batches(12, 4, seed=3)
    epochs = [np.concatenate([next(it) for _ in range(3)]) for _ in range(3)]
    for e in epochs:
        assert sorted(e.tolist()) == list(range(12))
    assert len({tuple(e) for e in epochs}) == 3
    assert epochs[0].tolist() != list(range(12))
    assert next(prompt_batches(12, 4, seed=3)).tolist() == epochs[0][:4].tolist()
    assert next(prompt_batches(12, 4, seed=4)).tolist() != epochs[0][:4].tolist()


def test_a_restored_state_continues_where_the_iterator_was():
    a = prompt_batches(10, 3, seed=0)
    for _ in range(5):
        next(a)
    b = prompt_batches(10, 3, seed=0)
    b.set_state(a.get_state())
    assert [next(b).tolist() for _ in range(6)] == [next(a).tolist() for _ in range(6)]


def test_batches_are_computed_in_the_calling_thread():
    before = threading.active_count()
    it = prompt_batches(1000, 8, seed=1)
    for _ in range(3):
        next(it)
    assert threading.active_count() == before


def test_too_few_items_for_a_batch_is_refused():
    with pytest.raises(ValueError, match="3 prompts cannot fill a batch of 4"):
        prompt_batches(3, 4, seed=0)
