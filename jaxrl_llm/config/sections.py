"""The run configuration's schema: frozen dataclasses, one per concern. The comment beside or above each field is
its documentation (tools/gen_config_docs.py writes docs/configuration.md from this file)."""

from __future__ import annotations

import dataclasses
import typing


class ConfigError(ValueError):
    pass


# projections an adapter may target (Hugging Face / PEFT names; model/lora.py TARGETS maps them to our weights)
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclasses.dataclass(frozen=True)
class LoraSection:
    """Low-rank adapters (model/lora.py) on a frozen base: only they train, and only they are in the optimizer
    state and the checkpoints; the KL reference is the base with the adapters of RL's start (no second copy of
    the weights)."""

    rank: int = 0  # 0: full fine-tuning; r >= 1: adapters of rank r
    alpha: float = 16.0  # the adapters' term is scaled by alpha / rank (PEFT's lora_alpha)
    # projections that get adapters (Hugging Face names); default: every linear layer of attention and the MLP
    targets: list = dataclasses.field(default_factory=lambda: list(LORA_TARGETS))
    # dropout on the adapters' input in the training forward only (PEFT's lora_dropout); sampling, evaluation and
    # the KL reference run without it, so on-policy the update's log-probs differ from the sampler's by its noise
    dropout: float = 0.0


@dataclasses.dataclass(frozen=True)
class ModelSection:
    name: str = "smollm2-135m-instruct"  # HF folder, known short name, or "scratch" (built from `scratch`)
    param_dtype: str = "float32"
    compute_dtype: str = "float32"  # bfloat16: forward/backward in bf16 over float32 master weights
    remat: bool = False
    # attention of several tokens over more keys than this (prefill, log-probs, the update) walks the keys in
    # blocks of this many with an online softmax: memory linear in length, not T x S scores (0: dense always)
    attention_block: int = 512
    scratch: dict = dataclasses.field(default_factory=dict)  # ModelConfig fields for name == "scratch"
    lora: LoraSection = LoraSection()


@dataclasses.dataclass(frozen=True)
class MeshSection:
    data: int = -1
    fsdp: int = 1
    tensor: int = 1


@dataclasses.dataclass(frozen=True)
class DataSection:
    source: str = "reasoning_gym"  # reasoning_gym | jsonl | parquet | hf (`datasets`) | rubric (generated rubric tasks)
    task: str = "basic_arithmetic"  # reasoning-gym data set name
    task_args: dict = dataclasses.field(default_factory=dict)
    path: str = ""  # jsonl / parquet file (train); `eval_path` for held-out rows
    eval_path: str = ""
    train_size: int = 2000
    eval_size: int = 200
    # SFT on items of their own (reasoning-gym: this many from another generator stream; files: sft_path),
    # never an RL training question, so the warm start cannot memorise the RL prompts; 0 / "": SFT on the
    # RL training items
    sft_size: int = 0
    sft_path: str = ""
    # source hf (data/hf_rows.py): datasets.load_dataset(dataset, subset, data_files=data_files, split=split):
    dataset: str = ""  # a Hub name ("openai/gsm8k"), a local folder, or a builder (parquet, json, csv) with data_files
    subset: str = ""  # the dataset's config name (e.g. "main" for openai/gsm8k)
    data_files: str | list | dict = ""  # a path or glob, a list of them, or {split: files}; from the working folder
    split: str = "train"  # the training rows; datasets' slices and sums work ("train[:1000]", "train+test")
    eval_split: str = ""  # held-out rows (e.g. "test"); "": none
    sft_split: str = ""  # separate SFT rows, never an RL training question; "": SFT on the training rows
    # every source but reasoning_gym / rubric (data/tasks.py): {our field: the row's column}, fields question,
    # answer, scorer, reference, difficulty, rubric, messages; a row's other columns reach reward functions as
    # TaskItem.extra (a JSON object)
    columns: dict = dataclasses.field(default_factory=dict)
    # the gold answer read out of the answer column: none (as is) | gsm8k (after the last "####", commas removed) |
    # boxed (the last \boxed{...}); the column's full text then becomes the reference solution. Rows where the
    # preset finds nothing are skipped and counted (a warning names them); over half of a split: an error
    answer_preset: str = "none"
    # "module:function" or "file.py:function", called on each raw row dict before the column mapping; returns the
    # row dict, or None to drop the row (counted)
    preprocess: str = ""
    seed: int = 0
    system_prompt: str = ""
    answer_format: str = "tags"  # tags | last_number | boxed | raw: how the answer is read from a response
    instruction: str = ""  # appended to every question (e.g. how to format the answer)
    chat_template: bool = True
    # a Jinja chat template (text, or the path of a .jinja file) replacing the tokenizer's, for models without one;
    # rows with `messages` (system and few-shot turns ending in a user turn) always render through the template
    chat_template_override: str = ""
    # reference solutions written by the project for tasks that ship none ("steps": basic_arithmetic left to
    # right, one operation a line; data/worked.py): SFT targets and RRL's optional reference prefixes
    worked: str = ""
    max_prompt_len: int = 256
    overlong: str = "drop"  # drop | truncate: prompts over max_prompt_len


@dataclasses.dataclass(frozen=True)
class RolloutSection:
    prompts_per_step: int = 8
    group_size: int = 8
    max_new_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    # encode each group's context once, in sampling and in the update (false: every row carries its prompt)
    shared_prefix: bool = True
    # > 0: a sampler call's rows decode through this many slots (rounded up to a power of two); finished rows leave
    # and waiting rows take their place, live rows are compacted as rows finish (sampling/slots.py). 0: all rows in
    # one program until the last ends
    decode_slots: int = 0


@dataclasses.dataclass(frozen=True)
class AlgoSection:
    advantage: str = "grpo"
    eps_low: float = 0.2
    eps_high: float = 0.28
    dual_clip: float = 3.0
    loss_agg: str = "token-mean"
    kl_coef: float = 0.0
    kl_estimator: str = "k3"  # k3 | k2 (loss terms whose gradient pulls toward the reference; k1 is refused)
    ppo_epochs: int = 1
    minibatches: int = 1
    micro_batch: int = 16  # rows per gradient-accumulation slice
    # true: old log-probs come from the trainer's own forward pass (one extra forward per step) instead of
    # the sampler's, so the first update's ratio is exactly 1 even when sampler and trainer numerics differ
    recompute_old_logp: bool = False
    # HeRL revision rows (RowBatch.hindsight) are trained with -A rho / (rho + gamma), unclipped (ALGORITHMS.md §2)
    hindsight_gamma: float = 1.0


@dataclasses.dataclass(frozen=True)
class OptimSection:
    lr: float = 1e-6
    warmup_steps: int = 0
    schedule: str = "constant"  # constant | cosine
    weight_decay: float = 0.0
    b1: float = 0.9
    b2: float = 0.999
    max_grad_norm: float = 1.0


@dataclasses.dataclass(frozen=True)
class RewardSection:
    workers: int = 2
    timeout_s: float = 5.0
    # the reward workers' sandbox (rewards/sandbox.py): address space a job may add beyond what a worker holds
    # once its scorers are loaded (0: no limit; a loaded worker holds ~1.8 GB of mostly unused mappings), the
    # largest file a job may write (0: none), and how often a worker that dies while starting is started again
    memory_mb: float = 2048.0
    file_mb: float = 0.0
    start_retries: int = 3
    # false: a response earns 1 only when the scorer gives full marks, else 0. Some scorers give partial
    # credit (reasoning-gym: len(answer) / len(response) when the answer is a substring), which a small
    # policy can farm by writing long digit strings.
    partial_credit: bool = True
    # rubric items whose check is "judge": "" refuses them; "policy": the current policy judges them; an HF folder
    # or known short name: that local model does (weights fixed); greedy, through our sampler (rewards/judge.py),
    # in the trainer's process after the pool's checks
    judge: str = ""
    judge_max_new_tokens: int = 24
    # a judge answer without a readable verdict is asked again this many times, sampled at this temperature
    # (the first ask is greedy; a greedy retry would repeat the same answer)
    judge_retries: int = 1
    judge_retry_temperature: float = 0.7
    # Python reward functions (rewards/functions.py): each entry "module:function", "path/to/file.py:function"
    # (relative to the working directory) or {name: "module:function", weight: 1.0}; f(prompt, completion, item)
    # -> float | dict[str, float]; a row's reward adds weight x the sum of its components. Imported and checked
    # at start-up; a call that fails scores 0 for its term (counted: reward_fn_errors). Metrics: reward/<component>
    functions: list = dataclasses.field(default_factory=list)
    builtin: bool = True  # add the task's own scorer (exact, math, reasoning-gym, rubric); false: the functions only
    # what accuracy and pass@k count as solved: "" the built-in scorer's full marks; a component's name (a float
    # function's name, or a key of a dict one): rows where that component, unweighted, is >= 1
    correctness: str = ""


@dataclasses.dataclass(frozen=True)
class SFTSection:
    steps: int = 0  # supervised warm start on reference answers before RL (0: none)
    batch_size: int = 32
    lr: float = 1e-3


@dataclasses.dataclass(frozen=True)
class EvalSection:
    every: int = 10
    size: int = 100  # held-out prompts
    samples: int = 4  # samples per prompt at T = 1 for sampled accuracy and pass@k
    max_new_tokens: int = 0  # 0: rollout.max_new_tokens
    split: str = "heldout"  # heldout | train: which problems `jaxrl-llm eval` scores (train: how hard the task is)
    # test-time self-revision (train/revise_eval.py): after the first answer, each rubric-graded problem not fully
    # met is sent back with explore.herl.revise_template (met and unmet items, the draft) for a new answer, up to
    # this many rounds, greedy and sampled; revise_* figures per round. No effect on tasks without a rubric
    revise_rounds: int = 0
    # a folder where runs that start from the same weights with the same evaluation share their step-0
    # evaluation (train/start_cache.py); `jaxrl-llm ablate` sets it for every run of a spec. "": off
    start_cache: str = ""


@dataclasses.dataclass(frozen=True)
class E3Section:
    """E3 (ALGORITHMS.md §1): difficulty-aware rollout budgets and an entropy-targeting temperature."""

    enabled: bool = False
    budget: bool = True  # rollouts per prompt by difficulty rank (total stays prompts_per_step x group_size)
    temperature: bool = True  # the temperature controller toward a target entropy
    rank_every: int = 0  # steps between re-ranks of the prompts' difficulty (0: once per epoch)
    data_rank: bool = True  # seed unseen prompts' ranks with the data set's `difficulty` column when it has one
    delta: int = 2  # budget bounds widen by this after each epoch: n_min down to n_low, n_max up to n_high
    n_low: int = 4
    n_high: int = 12
    target_entropy: float = 0.0  # 0: the entropy measured at RL step 1
    t_min: float = 0.3
    t_max: float = 2.0
    anneal: bool = True  # cosine-decay the target over the last anneal_ratio of the steps to anneal_factor x
    anneal_ratio: float = 0.4
    anneal_factor: float = 0.9
    difficulty_temperature: float = 0.0  # per-row T x (1 + this x (rank - 0.5)): harder prompts hotter; 0: off


@dataclasses.dataclass(frozen=True)
class RRLSection:
    """RRL (ALGORITHMS.md §3): a replay array of prefix states cut from unsolved prompts' responses, continued
    later in a dynamic share of the rollout slots."""

    enabled: bool = False
    capacity: int = 4096  # states in the replay array
    max_prefix_tokens: int = 64  # longest stored prefix (and at most rollout.max_new_tokens - 1)
    boundary: str = "line"  # line | sentence | tokens: where responses are cut into prefix states
    every_tokens: int = 16  # boundary=tokens: a cut every this many tokens
    prefixes_per_response: int = 2  # cuts kept per response: highest prior first, ties spread (a short and a long one)
    unsolved_below: float = 0.5  # a prompt whose fresh group succeeds less often than this is unsolved
    reference_prefixes: bool = False  # also cut the data set's reference solutions of unsolved prompts
    # a state's prior: "response" = the reward of the response it was cut from (ALGORITHMS.md §3); "steps" =
    # the prefix's own partial credit against the item's line-by-line reference solution (data.worked):
    # m / L when its m complete lines are the reference's first m of L, else 0
    prior: str = "response"
    replay_ratio: float = 0.25  # share of the rollout slots replayed, times the batch's unsolved share
    warmup_steps: int = 2  # steps that only collect states
    continuations: int = 4  # rows sampled from each replayed state (one advantage group)
    c_ucb: float = 0.5  # exploration bonus of the priority
    # what a state's priority scores (explore/replay.py): "uncertainty" = the variance of a continuation's success
    # (states whose continuations will differ: the groups a group-relative estimator learns from); "value" = the
    # Monte Carlo value (ALGORITHMS.md §3, which favours states whose continuations all succeed: zero advantage)
    priority: str = "uncertainty"
    priority_temperature: float = 0.1  # states drawn by softmax(priority / this) without replacement; 0: top-k
    min_visits: int = 1  # backtracking compares states with at least this many continuations
    backtrack_margin: float = 0.0  # a longer prefix is demoted when a shorter one of it beats it by more
    max_age: int = 0  # drop states whose prefix came from a policy more than this many steps old (0: never)
    age_penalty: float = 0.0  # priority lost per step of a state's age when drawing states


REVISE_TEMPLATE = """{question}

Here is a draft answer:
{draft}

The draft already meets these requirements:
{met}
It does not meet these yet:
{unmet}

Rewrite the answer so that it meets every requirement, keeping what the draft already does right. Reply with the \
revised answer only."""


@dataclasses.dataclass(frozen=True)
class HeRLSection:
    """HeRL (ALGORITHMS.md §2): rubric-guided hindsight revisions of failed groups' best responses."""

    enabled: bool = False
    threshold: float = 1.0  # a group fails when its best reward is below this
    candidate_limit: int = 16  # most candidates revised per step (taken round-robin over failed groups)
    num_guided: int = 1  # revisions sampled per candidate
    guided_temperature: float = 0.3
    alpha: float = 0.05  # candidate bonus: r <- r + alpha (best revision score - r)
    replace_top_n: int = 1  # revisions swapped into each failed group
    keep_best_original: bool = False  # no revision reaches the group's best: copy its best response instead
    train_on: str = "original"  # original | revise_prompt: the context a kept revision is trained under
    # the temperature a kept revision is trained (and its old log-probs taken) at: "rollout" = its group's own
    # sampling temperature, as the released code trains every row; "guided" = guided_temperature, the one it was
    # sampled at (before: at 0.3 the loss's gradient on non-argmax tokens is up to 3.3x larger, imitation of
    # revise-prompt text)
    train_temperature: str = "rollout"
    # which revisions may replace a group member: "better" = only those scoring strictly above the group's best;
    # "at_least" = those, else ties at the best (ALGORITHMS.md §2 step 7: in an all-zero group, anything at all)
    keep: str = "better"
    revise_template: str = REVISE_TEMPLATE  # fields {question}, {draft}, {met}, {unmet}


@dataclasses.dataclass(frozen=True)
class ExploreSection:
    e3: E3Section = E3Section()
    rrl: RRLSection = RRLSection()
    herl: HeRLSection = HeRLSection()


@dataclasses.dataclass(frozen=True)
class TrainSection:
    steps: int = 100
    seed: int = 0
    out_dir: str = "runs/default"
    checkpoint_every: int = 10
    keep_checkpoints: int = 3
    async_checkpoint: bool = True
    resume: bool = True
    # resume=false on a folder that holds a run is refused; true: that run is first moved (never deleted) into the
    # sibling <out_dir>.overwritten-<UTC time>/ (train/run_dir.py). Needs resume=false
    overwrite: bool = False
    # a resume refuses a config that differs from its checkpoint's outside the keys safe to change (steps, eval and
    # checkpoint cadence, logging: train/run_dir.py), naming each; these comma-separated keys or sections may differ
    # ("optim.lr,data.path"; "*": any). A changed data file at the same path is its key's change
    accept_changes: str = ""
    export_final: bool = True
    tensorboard: bool = True
    # before anything is allocated: print the per-device memory plan (plan/memory.py) and refuse a config
    # that will not fit; device_memory_gib > 0 replaces the memory the devices report (e.g. to keep a reserve)
    memory_check: bool = True
    device_memory_gib: float = 0.0
    # host maintenance / preemption notices (train/stop.py): "auto" watches the GCE metadata server's
    # maintenance-event on TPU VMs, "" nothing, any other URL that URL; a notice saves and exits 75 like SIGTERM
    maintenance_url: str = "auto"
    # multi-host runs (parallel/watchdog.py): when a step's cross-host agreement is overdue (4 x the median recent
    # step, clamped to [floor, ceiling], at most 60 s) and a process's heartbeat has stood still for stale_s
    # (posted every second), every live process names it and exits 75 (the launch scripts resume); while every
    # process answers, the run waits up to the ceiling. ceiling 0: no watchdog
    watchdog_floor_s: float = 30.0
    watchdog_ceiling_s: float = 1800.0
    watchdog_stale_s: float = 10.0


@dataclasses.dataclass(frozen=True)
class LoggingSection:
    """What a run reports beside metrics.jsonl and TensorBoard (train/tracking.py); process 0 only."""

    # Weights & Biases: every metrics.jsonl row and the completion samples go to one W&B run, whose id is kept in
    # <out_dir>/wandb.json so a resume continues it. Needs the `wandb` extra (pip install 'jaxrl-llm[wandb]')
    wandb: bool = False
    wandb_project: str = "jaxrl-llm"
    wandb_entity: str = ""  # "": the account's default entity
    # offline: written under wandb_dir only (upload later with `wandb sync <wandb_dir>/wandb/offline-run-*`);
    # online: needs WANDB_API_KEY or `wandb login` (refused rather than prompting); disabled: as wandb=false
    wandb_mode: str = "offline"
    wandb_dir: str = ""  # "": the run folder (W&B writes its files into <wandb_dir>/wandb/)
    # every samples_every RL steps (0: never), samples_per_step of the step's rows (spread over its groups) go to
    # <out_dir>/samples.jsonl (prompt, completion, reward, ...), a TensorBoard text and a W&B table
    samples_every: int = 10
    samples_per_step: int = 4


@dataclasses.dataclass(frozen=True)
class Config:
    model: ModelSection = ModelSection()
    mesh: MeshSection = MeshSection()
    data: DataSection = DataSection()
    rollout: RolloutSection = RolloutSection()
    algo: AlgoSection = AlgoSection()
    optim: OptimSection = OptimSection()
    reward: RewardSection = RewardSection()
    sft: SFTSection = SFTSection()
    eval: EvalSection = EvalSection()
    explore: ExploreSection = ExploreSection()
    train: TrainSection = TrainSection()
    logging: LoggingSection = LoggingSection()

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def is_key(dotted: str) -> bool:
    """Whether `dotted` names a config key or section (e.g. optim.lr, optim)."""
    cls = Config
    for part in dotted.split("."):
        fields = {f.name: f for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else {}
        if part not in fields:
            return False
        cls = typing.get_type_hints(cls)[part]
    return True
