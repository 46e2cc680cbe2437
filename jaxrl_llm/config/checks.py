"""Checks of a loaded configuration across fields (ranges, sizes that must divide, settings that need each other),
each error naming the file and the keys at fault."""

from __future__ import annotations

import math

from jaxrl_llm.config.reward_entries import parse as parse_reward_functions
from jaxrl_llm.config.sections import LORA_TARGETS, Config, ConfigError, is_key


def validate(cfg: Config, source: str) -> None:
    def need(cond, msg):
        if not cond:
            raise ConfigError(f"{source}: {msg}")

    need(cfg.rollout.group_size >= 1 and cfg.rollout.prompts_per_step >= 1, "rollout sizes must be >= 1")
    need(cfg.rollout.decode_slots >= 0, f"rollout.decode_slots must be >= 0 (0: off), got {cfg.rollout.decode_slots}")
    need(cfg.rollout.max_new_tokens >= 1, "rollout.max_new_tokens must be >= 1")
    ro, o = cfg.rollout, cfg.optim
    need(math.isfinite(ro.temperature) and ro.temperature >= 0 and 0 < ro.top_p <= 1 and ro.top_k >= 0,
         f"rollout: temperature ({ro.temperature}) must be >= 0, top_p ({ro.top_p}) in (0, 1], top_k ({ro.top_k}) "
         f">= 0 (0: off)")
    # a negative learning rate climbs the loss; clip_by_global_norm with a negative norm flips every gradient
    for key, lr in (("optim.lr", o.lr), ("sft.lr", cfg.sft.lr)):
        need(math.isfinite(lr) and lr >= 0, f"{key}={lr} must be a finite number >= 0")
    need(o.max_grad_norm > 0, f"optim.max_grad_norm={o.max_grad_norm} must be > 0 (.inf: no clipping)")
    need(o.warmup_steps >= 0 and math.isfinite(o.weight_decay) and o.weight_decay >= 0 and 0 <= o.b1 < 1
         and 0 <= o.b2 < 1, f"optim: warmup_steps ({o.warmup_steps}) and weight_decay ({o.weight_decay}) must be >= 0, "
         f"b1 ({o.b1}) and b2 ({o.b2}) in [0, 1)")
    need(cfg.train.steps >= 0 and cfg.sft.steps >= 0 and cfg.sft.batch_size >= 1,
         f"train.steps ({cfg.train.steps}) and sft.steps ({cfg.sft.steps}) must be >= 0, sft.batch_size "
         f"({cfg.sft.batch_size}) >= 1")
    rw = cfg.reward
    need(rw.workers >= 1, f"reward.workers={rw.workers} must be >= 1 (processes that score responses)")
    need(math.isfinite(rw.timeout_s) and rw.timeout_s > 0,
         f"reward.timeout_s={rw.timeout_s} must be a number of seconds > 0 (each response's scoring time limit)")
    need(math.isfinite(rw.memory_mb) and rw.memory_mb >= 0,
         f"reward.memory_mb={rw.memory_mb} must be >= 0 (MB a reward worker may add; 0: no limit)")
    need(math.isfinite(rw.file_mb) and rw.file_mb >= 0,
         f"reward.file_mb={rw.file_mb} must be >= 0 (MB of the largest file a reward worker may write)")
    need(rw.start_retries >= 0, f"reward.start_retries={rw.start_retries} must be >= 0")
    need(rw.judge_retries >= 0 and rw.judge_max_new_tokens >= 1,
         f"reward.judge_retries ({rw.judge_retries}) must be >= 0 and reward.judge_max_new_tokens "
         f"({rw.judge_max_new_tokens}) >= 1")
    need(rw.judge_retry_temperature > 0, f"reward.judge_retry_temperature={rw.judge_retry_temperature} must be > 0 "
         "(a greedy retry repeats the answer that could not be read)")
    try:
        parse_reward_functions(rw.functions)
    except ValueError as e:
        need(False, str(e))
    need(rw.builtin or rw.functions, "reward.builtin=false needs reward.functions (there would be no reward)")
    need(rw.builtin or rw.correctness, "reward.builtin=false: set reward.correctness to the component of a reward "
         "function that says a response is solved (accuracy, pass@k), e.g. 'correct'")
    need(not rw.correctness or rw.functions, f"reward.correctness={rw.correctness!r} names a reward function's "
         "component, but reward.functions is empty")
    a = cfg.algo
    need(a.ppo_epochs >= 1 and a.minibatches >= 1 and a.micro_batch >= 1,
         f"algo.ppo_epochs ({a.ppo_epochs}), minibatches ({a.minibatches}) and micro_batch ({a.micro_batch}) "
         "must be >= 1")
    need(a.kl_coef >= 0, f"algo.kl_coef={a.kl_coef} must be >= 0 (0 turns the KL term off)")
    need(cfg.eval.every >= 1 and cfg.eval.samples >= 1 and cfg.eval.size >= 0,
         f"eval.every ({cfg.eval.every}) and eval.samples ({cfg.eval.samples}) must be >= 1, eval.size >= 0")
    need(cfg.eval.revise_rounds >= 0, f"eval.revise_rounds={cfg.eval.revise_rounds} must be >= 0 (0: no revise rounds)")
    rows = cfg.rollout.group_size * cfg.rollout.prompts_per_step
    need(rows % cfg.algo.minibatches == 0, f"algo.minibatches={cfg.algo.minibatches} must divide {rows} rollout rows")
    need((rows // cfg.algo.minibatches) % cfg.algo.micro_batch == 0 or cfg.algo.micro_batch >= rows,
         f"algo.micro_batch={cfg.algo.micro_batch} must divide the {rows // cfg.algo.minibatches} rows of a minibatch")
    need(0 <= cfg.algo.eps_low < 1 and cfg.algo.eps_high >= 0 and cfg.algo.dual_clip > 1, "bad clip settings")
    need(cfg.algo.hindsight_gamma > 0, f"algo.hindsight_gamma={cfg.algo.hindsight_gamma} must be > 0")
    need(cfg.model.name != "scratch" or cfg.model.scratch, "model.name=scratch needs model.scratch settings")
    lo = cfg.model.lora
    need(lo.rank >= 0 and (lo.rank == 0 or lo.alpha > 0), f"model.lora: rank ({lo.rank}) must be >= 0 (0: off) and "
         f"alpha ({lo.alpha}) > 0")
    need(lo.rank == 0 or (lo.targets and set(lo.targets) <= set(LORA_TARGETS)),
         f"model.lora.targets {lo.targets}: expected a non-empty list from {', '.join(LORA_TARGETS)}")
    need(0 <= lo.dropout < 1, f"model.lora.dropout ({lo.dropout}) must be in [0, 1)")
    need(cfg.model.attention_block >= 0, f"model.attention_block ({cfg.model.attention_block}) must be >= 0 (0: dense)")
    need(cfg.data.source in ("reasoning_gym", "rubric", "hf") or cfg.data.path,
         f"data.source={cfg.data.source} needs data.path")
    need(cfg.data.source != "hf" or cfg.data.dataset, "data.source=hf needs data.dataset (a Hub name, a local folder, "
         "or a builder such as parquet / json / csv with data.data_files)")
    need(cfg.data.sft_size == 0 or cfg.data.source == "reasoning_gym",
         f"data.sft_size generates reasoning-gym items; with data.source={cfg.data.source} give data.sft_path")
    need(cfg.sft.steps == 0 or not (cfg.data.sft_size or cfg.data.sft_path)
         or cfg.sft.batch_size <= max(cfg.data.sft_size, 1 << 30 if cfg.data.sft_path else 0),
         f"sft.batch_size={cfg.sft.batch_size} is more than the data.sft_size={cfg.data.sft_size} SFT items")
    e3, n = cfg.explore.e3, cfg.rollout.group_size
    if e3.enabled:
        need(1 <= e3.n_low <= n <= e3.n_high, f"explore.e3 needs 1 <= n_low ({e3.n_low}) <= rollout.group_size ({n}) "
             f"<= n_high ({e3.n_high})")
        need(e3.delta >= 0 and e3.rank_every >= 0, "explore.e3.delta and rank_every must be >= 0")
        need(0 < e3.t_min <= cfg.rollout.temperature <= e3.t_max,
             f"explore.e3 needs 0 < t_min ({e3.t_min}) <= rollout.temperature ({cfg.rollout.temperature}) <= "
             f"t_max ({e3.t_max})")
        need(0 <= e3.anneal_ratio <= 1 and e3.anneal_factor > 0, "explore.e3 anneal_ratio in [0, 1], anneal_factor > 0")
        need(e3.target_entropy >= 0, "explore.e3.target_entropy must be >= 0 (0: measured at step 1)")
    r = cfg.explore.rrl
    if r.enabled:
        need(r.capacity >= 1 and r.max_prefix_tokens >= 1 and r.prefixes_per_response >= 1,
             "explore.rrl capacity, max_prefix_tokens and prefixes_per_response must be >= 1")
        need(r.boundary != "tokens" or r.every_tokens >= 1, "explore.rrl.every_tokens must be >= 1")
        need(0 <= r.replay_ratio < 1, f"explore.rrl.replay_ratio={r.replay_ratio} must be in [0, 1)")
        need(2 <= r.continuations <= rows, f"explore.rrl.continuations={r.continuations} must be in [2, {rows}] "
             f"(a group needs two rows for an advantage)")
        need(r.replay_ratio * rows // r.continuations <= r.capacity,
             "explore.rrl.capacity is smaller than the states one step replays")
        need(int(r.replay_ratio * rows) // r.continuations >= 1,
             f"explore.rrl: replay_ratio x rows per step ({r.replay_ratio} x {rows}) is below continuations "
             f"({r.continuations}): no state could ever be replayed")
        need(r.warmup_steps >= 0 and r.max_age >= 0 and r.min_visits >= 1 and r.c_ucb >= 0
             and r.priority_temperature >= 0 and r.age_penalty >= 0 and r.backtrack_margin >= 0,
             "explore.rrl: warmup_steps, max_age, c_ucb, priority_temperature, age_penalty and backtrack_margin "
             "must be >= 0, min_visits >= 1")
    sizes = {f"mesh.{a}": getattr(cfg.mesh, a) for a in ("data", "fsdp", "tensor")}
    need(all(v == -1 or v >= 1 for v in sizes.values()) and list(sizes.values()).count(-1) <= 1,
         f"mesh sizes {sizes}: each must be >= 1, or -1 (the devices left) for at most one axis")
    need(cfg.train.device_memory_gib >= 0, f"train.device_memory_gib={cfg.train.device_memory_gib} must be >= 0 "
         "(0: what the devices report)")
    t = cfg.train
    need(t.watchdog_ceiling_s >= 0, f"train.watchdog_ceiling_s={t.watchdog_ceiling_s} must be >= 0 (0: no watchdog)")
    need(t.watchdog_ceiling_s == 0 or 0 < t.watchdog_floor_s <= t.watchdog_ceiling_s,
         f"train.watchdog_floor_s={t.watchdog_floor_s} must be > 0 and <= train.watchdog_ceiling_s="
         f"{t.watchdog_ceiling_s}")
    need(2 <= t.watchdog_stale_s <= 30, f"train.watchdog_stale_s={t.watchdog_stale_s} must be in [2, 30] s: a "
         "heartbeat is posted every second, and jax.distributed gives up on a silent process after 100 s")
    need(t.maintenance_url in ("auto", "") or t.maintenance_url.startswith(("http://", "https://")),
         f"train.maintenance_url={t.maintenance_url!r}: 'auto', '' or an http:// or https:// URL")
    need(cfg.train.keep_checkpoints >= 1, f"train.keep_checkpoints={cfg.train.keep_checkpoints} must be >= 1 (a run "
         "keeps at least its newest checkpoint to resume from)")
    need(cfg.train.checkpoint_every >= 1, f"train.checkpoint_every={cfg.train.checkpoint_every} must be >= 1")
    lg = cfg.logging
    need(lg.samples_every >= 0 and lg.samples_per_step >= 1, f"logging.samples_every ({lg.samples_every}) must be "
         f">= 0 (0: no samples) and logging.samples_per_step ({lg.samples_per_step}) >= 1")
    need(not (cfg.train.overwrite and cfg.train.resume), "train.overwrite=true starts the run over: set "
         "train.resume=false with it")
    for key in filter(None, (k.strip() for k in cfg.train.accept_changes.split(","))):
        need(key == "*" or is_key(key), f"train.accept_changes names {key!r}, which is no config key or section")
    h = cfg.explore.herl
    if h.enabled or cfg.eval.revise_rounds:
        for field in ("{question}", "{draft}", "{met}", "{unmet}"):
            need(field in h.revise_template, f"explore.herl.revise_template has no {field}")
        try:  # any other field, or a lone brace, would fail at the first revision, steps or an eval into the run
            h.revise_template.format(question="", draft="", met="", unmet="")
        except (KeyError, IndexError, ValueError) as e:
            need(False, f"explore.herl.revise_template does not format with the fields {{question}}, {{draft}}, "
                 f"{{met}}, {{unmet}} ({type(e).__name__}: {e}); write a literal brace as {{{{ or }}}}")
    if h.enabled:
        need(h.candidate_limit >= 1 and h.num_guided >= 1 and h.replace_top_n >= 1,
             "explore.herl candidate_limit, num_guided and replace_top_n must be >= 1")
        need(h.guided_temperature >= 0 and h.alpha >= 0, "explore.herl guided_temperature and alpha must be >= 0")
        need(h.replace_top_n < cfg.rollout.group_size, f"explore.herl.replace_top_n={h.replace_top_n} must leave a "
             f"group of rollout.group_size={cfg.rollout.group_size} at least one of its own rows")
