"""RRL in the trainer and the sampler: continuation rows continue their stored prefix exactly as if
prompt + prefix were the prompt, the prefix carries no loss, E3 + RRL replay every step after warm-up
without compiling anything new, and a run stopped by SIGTERM and resumed equals an uninterrupted one,
the replay array and E3's state bit for bit (the resume test of both explorers)."""

import jax
import numpy as np
import pytest
from flax import nnx

from jaxrl_llm.config import load_config
from jaxrl_llm.explore.rows import RowPlan, Rollouts
from jaxrl_llm.train.loop import Run
from jaxrl_llm.train.rollout import sample_plan, update_rows, with_advantages
from tests.helpers import RRL_REFERENCE, compilations, rrl_cfg, sigterm_after_row, train_rows

pytestmark = pytest.mark.slow  # integration runs: tools/test.sh runs them, `-m "not slow"` leaves them out


def test_continuations_sample_like_prompt_plus_prefix_and_carry_no_prefix_loss(tiny_sampler):
    sampler, state = tiny_sampler
    cfg = load_config(None, ["rollout.max_new_tokens=6", "rollout.top_p=1.0", "rollout.top_k=0"])
    prompts = [[5, 6, 7], [9, 10]]
    plan = RowPlan.groups([2, 3], 1.0, jax.random.key(4), prompt_ids=[0, 1])
    prefix = ((), (), (11, 12), (11, 12), (13,))
    plan = RowPlan(prompt=plan.prompt, group=plan.group, temperature=plan.temperature, prefix=prefix,
                   replayed=np.array([len(p) > 0 for p in prefix]), hindsight=np.zeros(5, bool),
                   row_keys=plan.row_keys)
    out = sample_plan(sampler, state, cfg, prompts, plan)
    # the same rows sampled with prompt + prefix as their prompt (row keys travel with the rows)
    alone = sampler(state, [prompts[p] + list(x) for p, x in zip(plan.prompt, prefix)],
                    max_new_tokens=np.array([6, 6, 4, 4, 5]), temperature=1.0,
                    row_keys=jax.random.wrap_key_data(plan.row_keys))
    for i in range(5):
        assert out.generated(i) == alone.generated(i)
        assert out.num_generated[i] <= 6 - len(prefix[i])  # the prefix counts against the budget
        ctx = out.context_len[i]
        assert out.tokens[i, out.prompt_len[i]:ctx].tolist() == list(prefix[i])
        np.testing.assert_allclose(out.logprobs[i, ctx:ctx + out.num_generated[i]],
                                   alone.logprobs[i, ctx:ctx + alone.num_generated[i]], rtol=1e-6, atol=1e-6)
    r = with_advantages(Rollouts(plan, out, np.array([1, 0, 1, 0, 1], np.float32), ("",) * 5), "grpo")
    rows = update_rows(r)
    assert not (rows.loss_mask & out.prefix_mask).any()
    np.testing.assert_array_equal(rows.loss_mask, out.response_mask)
    np.testing.assert_array_equal(rows.context_len, out.prompt_len + np.array([len(p) for p in prefix]))


@pytest.mark.xdist_group("rrl_reference")
def test_e3_rrl_herl_compose_without_recompiling_and_resume_exactly(tmp_path, rrl_reference):
    """One run of E3, RRL and HeRL composed (the shared `rrl_reference`), then the same run stopped by
    SIGTERM after step 3 and resumed: every metric, explorer state (E3's tracker, ranks, bounds, temperature
    and target; RRL's replay array and trackers) and parameter equal. Plain GRPO's flat compilations and
    resume are tests/train/test_trainer.py's. Five steps (not rrl_cfg's seven): the bounds reach (4, 12) at
    step 5, replay runs from step 2 and E3 re-ranks at step 4, after the resume."""
    whole, run = rrl_reference
    rows = train_rows(whole.train.out_dir)
    assert rows[1]["rrl_replay_rows"] == 0 and rows[1]["rrl_inserted"] > 0  # warm-up: collect only
    assert all(rows[s]["rrl_replay_rows"] == 16 for s in range(2, 6)), [rows[s]["rrl_replay_rows"] for s in rows]
    # E3 plans 32 fresh rows (bounds widening by epoch), RRL turns 16 of them into continuations, HeRL
    # swaps a revision into each failed fresh group (one at most; revisions score 0 at worst, the failed
    # group's best is 0: every failed group keeps one)
    hist = {s: np.asarray(rows[s]["e3_group_size_hist"]) for s in rows}
    kept = {s: rows[s]["herl_kept"] for s in rows}
    assert all(kept[s] == rows[s]["herl_failed_groups"] for s in rows) and sum(kept.values()) >= 5, kept
    assert all((hist[s] * np.arange(len(hist[s]))).sum() == (32 if s == 1 else 16) - kept[s] for s in rows), hist
    assert [rows[s]["e3_n_max"] for s in (1, 3, 5)] == [8, 10, 12]
    counts = compilations(whole.train.out_dir)  # step 2 is the first with replay rows: flat from there
    assert counts[1:] == [counts[1]] * (len(counts) - 1), counts
    fill = [rows[s]["rrl_fill"] for s in sorted(rows)]
    assert fill[-1] > fill[0] > 0, fill

    stopped = rrl_cfg(tmp_path / "b", *RRL_REFERENCE)
    sigterm_after_row(tmp_path, stopped, '"step": 3, "kind": "train"')
    logs = []
    resumed = Run(stopped, log=logs.append)
    resumed.train()
    where = [ln for ln in logs if ln.startswith("resumed from")]
    assert where and int(where[0].split("RL step ")[1].rstrip(")")) < 5, logs
    timing = ("time", "_per_s", "compilations")
    b = train_rows(stopped.train.out_dir)
    assert sorted(b) == sorted(rows) == list(range(1, 6))
    for s in rows:
        assert {k: v for k, v in rows[s].items() if not any(t in k for t in timing)} == \
            {k: v for k, v in b[s].items() if not any(t in k for t in timing)}, s
    same = lambda x, y: np.testing.assert_array_equal(np.asarray(x), np.asarray(y))  # noqa: E731
    jax.tree.map(same, jax.device_get(run.state.explore), jax.device_get(resumed.state.explore))
    ranks = np.asarray(run.state.explore["e3"].rank)
    assert not np.allclose(ranks, np.arange(8) / 7), ranks  # re-ranked from rewards, not the data's seed
    jax.tree.map(same, jax.device_get(nnx.to_pure_dict(run.state.params)),
                 jax.device_get(nnx.to_pure_dict(resumed.state.params)))


@pytest.mark.xdist_group("rrl_reference")
def test_decode_slots_train_what_the_one_call_sampler_trains(tmp_path, rrl_reference):
    """The shared E3 + RRL + HeRL run again with `rollout.decode_slots=8` (sampling/slots.py: every sampler call
    of the run, the step's rows, RRL's continuations, HeRL's revisions and evaluation, through 8 slots refilled
    and compacted): every count and sampled length equal, rewards and losses to float rounding (the slots'
    batches have other shapes), and nothing compiled after the first replay step."""
    whole, run = rrl_reference
    want = train_rows(whole.train.out_dir)
    cfg = rrl_cfg(tmp_path, *RRL_REFERENCE, "rollout.decode_slots=8")
    slotted = Run(cfg, log=lambda *a: None)
    slotted.train()
    got = train_rows(cfg.train.out_dir)
    assert sorted(got) == sorted(want) == list(range(1, 6))
    for s in want:
        for k, v in want[s].items():
            if any(t in k for t in ("time", "_per_s", "compilations")):
                continue
            if isinstance(v, (int, str)) or k.endswith(("_tokens", "_rows", "_kept", "_hist")):
                assert got[s][k] == v, (s, k, got[s][k], v)
            else:
                np.testing.assert_allclose(np.asarray(got[s][k], float), np.asarray(v, float), rtol=1e-4, atol=1e-5,
                                           err_msg=f"step {s} {k}")
    counts = compilations(cfg.train.out_dir)
    assert counts[1:] == [counts[1]] * (len(counts) - 1), counts
    close = lambda x, y: np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=1e-4)  # noqa: E731
    jax.tree.map(close, jax.device_get(nnx.to_pure_dict(run.state.params)),
                 jax.device_get(nnx.to_pure_dict(slotted.state.params)))
