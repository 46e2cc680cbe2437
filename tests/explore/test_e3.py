"""E3 in the trainer: budgets and temperatures change every step while nothing compiles after
warm-up, and the controller follows its formula step by step. A resumed E3 + RRL run equals an
uninterrupted one (tests/test_rrl.py)."""

import math

import jax
import numpy as np
import pytest

from jaxrl_llm.explore.temperature import entropy_constant
from jaxrl_llm.train.loop import Run
from tests.helpers import compilations, e3_cfg, train_rows

pytestmark = pytest.mark.slow  # integration runs: tools/test.sh runs them, `-m "not slow"` leaves them out


def test_e3_changes_budgets_and_temperature_without_recompiling(tmp_path):
    cfg = e3_cfg(tmp_path, "train.steps=9", "train.checkpoint_every=100", "eval.every=100")
    run = Run(cfg, log=lambda *a: None)
    run.train()
    rows = train_rows(cfg.train.out_dir)
    hist = [np.asarray(rows[s]["e3_group_size_hist"]) for s in sorted(rows)]
    assert all((h * np.arange(len(h))).sum() == 32 for h in hist)  # N = 4 x 8 rows every step
    assert all(h[8] == 4 for h in hist[:2]) and all(h[8] < 4 for h in hist[4:]), hist  # bounds (8, 8) in epoch 1
    assert [rows[s]["e3_n_min"] for s in (1, 3, 5, 9)] == [8, 6, 4, 4]
    assert [rows[s]["e3_n_max"] for s in (1, 3, 5, 9)] == [8, 10, 12, 12]
    temps = [rows[s]["temperature"] for s in sorted(rows)]
    assert len(set(np.round(temps, 6))) > 3, temps  # the controller moved T
    # after warm-up E3 compiles nothing (plain GRPO: tests/test_trainer.py
    # test_compilations_stay_flat_after_warmup_and_final_policy_exports)
    counts = compilations(cfg.train.out_dir)
    assert counts[2:] == [counts[2]] * (len(counts) - 2), counts

    # the controller, recomputed from the logged entropy and target: T' = T (1 + T ln(H*/H) / k), clamped
    k = float(entropy_constant(run.policy.model_cfg.vocab_size))
    e3 = cfg.explore.e3
    for s in sorted(rows)[:-1]:
        r = rows[s]
        t, h, target = r["temperature"], r["e3_entropy"], r["e3_target_entropy"]
        want = min(max(t * (1 + t * math.log(target / h) / k), e3.t_min), e3.t_max)
        assert rows[s + 1]["temperature"] == np.float32(want) or abs(rows[s + 1]["temperature"] - want) < 1e-5 * want
        assert r["e3_temperature"] == rows[s + 1]["temperature"]
    assert rows[1]["e3_target_entropy"] == rows[1]["e3_entropy"]  # H* is the entropy of step 1


def test_controller_brings_the_sampled_entropy_to_its_target(tiny_sampler):
    """Closed loop on a toy policy: the tiny model sampled by the real sampler at the controller's
    temperature. The target is the entropy the policy shows at T = 0.6; from T = 1.0 the controller
    reaches it within 5 % (mean of the last 5 steps)."""
    from jaxrl_llm.explore.temperature import next_temperature

    sampler, state = tiny_sampler
    prompts = [[1 + (i * 7) % 90, 2 + i % 50, 3] for i in range(64)]

    def entropy_at(t, seed):
        out = sampler(state, prompts, max_new_tokens=16, temperature=t, key=jax.random.key(seed))
        return float(out.entropy[out.response_mask].mean())

    target = entropy_at(0.6, 0)
    k = float(entropy_constant(96))
    t, seen = 1.0, []
    for step in range(30):
        h = entropy_at(t, step + 1)
        seen.append(h)
        t = float(next_temperature(t, target, h, k, 0.3, 2.0))
    assert abs(np.mean(seen[:1]) - target) / target > 0.2  # it started far from the target
    assert abs(np.mean(seen[-5:]) - target) / target < 0.05, (target, seen[-5:], t)
