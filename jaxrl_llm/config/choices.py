"""The values a config field may take, and values refused with the reason. The layers that implement a choice
(rl's advantage estimators and loss aggregations) import their vocabulary from here, so the config stays at the
bottom of the package."""

ADVANTAGE_ESTIMATORS = ("grpo", "drgrpo", "rloo")
LOSS_AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")
# Only estimators whose gradient pulls the policy toward the reference. k1 (logp - ref_logp) as a loss
# term has gradient kl_coef * grad logp, zero in expectation on-policy: it is refused (REFUSED below).
KL_ESTIMATORS = ("k2", "k3")

CHOICES = {
    "model.param_dtype": ("float32", "bfloat16"),
    "model.compute_dtype": ("float32", "bfloat16"),
    "data.source": ("reasoning_gym", "jsonl", "parquet", "hf", "rubric"),
    "data.answer_preset": ("none", "gsm8k", "boxed"),
    "data.answer_format": ("tags", "last_number", "boxed", "raw"),
    "data.overlong": ("drop", "truncate"),
    "data.worked": ("", "steps"),
    "explore.rrl.boundary": ("line", "sentence", "tokens"),
    "explore.rrl.prior": ("response", "steps"),
    "explore.rrl.priority": ("uncertainty", "value"),
    "explore.herl.train_on": ("original", "revise_prompt"),
    "explore.herl.train_temperature": ("rollout", "guided"),
    "explore.herl.keep": ("better", "at_least"),
    "algo.advantage": ADVANTAGE_ESTIMATORS,
    "algo.loss_agg": LOSS_AGGREGATIONS,
    "algo.kl_estimator": KL_ESTIMATORS,
    "optim.schedule": ("constant", "cosine"),
    "eval.split": ("heldout", "train"),
    "logging.wandb_mode": ("offline", "online", "disabled"),
}

# Values that were once accepted, or that users expect, refused with the reason.
REFUSED = {
    ("algo.kl_estimator", "k1"): "k1 (logp - ref_logp) as a loss term has gradient kl_coef * grad logp, zero in "
                                 "expectation on-policy, so it never pulls toward the reference; use k2 (the "
                                 "true KL's gradient) or k3 (low-variance, non-negative)",
}

