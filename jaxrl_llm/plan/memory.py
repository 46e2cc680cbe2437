"""Memory planning: before a run allocates anything, will it fit the devices found?

Per device, for the config and mesh:

    parameters, optimizer state, KL reference   exact, from their shardings (nothing allocated); with LoRA
                                                 (model/lora.py) the optimizer state and the reference are
                                                 the adapters' alone
    gradients                                    float32, one copy (two when micro-batches accumulate) of
                                                 what trains: every parameter, or the adapters
    update activations                           XLA's memory analysis of the compiled (never run) update
                                                 program at the trainer's largest batch (plan/program.py),
                                                 its temporaries less the gradients
    KV cache                                     the sampler's cache for a step's rows at their largest
                                                 (every prompt data.max_prompt_len tokens, every response
                                                 rollout.max_new_tokens), keys and values of every layer
    sampler logits                               float32 [rows, vocab], three live copies (logits, noise /
                                                 probabilities, the top-p sort)

Two phases hold memory at different times: sampling (parameters, optimizer state, reference, the
sampling copy of the parameters when the compute dtype differs, KV cache, logits) and the update
(XLA's peak for the program: its arguments, temporaries and outputs less the donated ones). The
plan's peak is the larger. `check` refuses a config whose peak exceeds the devices' memory with the
settings that would make it fit: a smaller algo.micro_batch (activations scale with the rows of a
micro-batch), a larger mesh.fsdp (parameters, optimizer state and gradients divide by it), and
model.remat.

`memory_plan` is a pure function of the run's shapes (plan/shapes.py), its abstract state, the update
program's memory analysis and the devices' capacity; the trainer calls it before it allocates the
optimizer state or a sampler cache, `plan` makes them all for a config (benchmarks).

Device memory is what the device reports (`memory_stats()["bytes_limit"]`: GPU, TPU) or, on CPU, the
host's RAM divided among the process's devices; `train.device_memory_gib` overrides it.
"""

from __future__ import annotations

import dataclasses
import math
import os

_GIB = 1024 ** 3
HEADROOM = 0.9  # of device memory usable by the plan: runtime, compiled code and fragmentation take the rest


class MemoryPlanError(ValueError):
    """The config will not fit the devices found; the message says by how much and what would fit."""


@dataclasses.dataclass(frozen=True)
class MemoryPlan:
    devices: int
    platform: str
    mesh: dict
    capacity: int  # bytes per device
    capacity_source: str
    params: int
    optimizer: int
    reference: int
    sampling_copy: int
    gradients: int
    activations: int
    update_peak: int  # XLA: arguments + temporaries + outputs - donated
    kv_cache: int
    sampler_logits: int
    micro_batch: int
    micro_batches: int
    remat: bool

    @property
    def sampling_peak(self) -> int:
        return self.params + self.optimizer + self.reference + self.sampling_copy + self.kv_cache + self.sampler_logits

    @property
    def peak(self) -> int:
        return max(self.update_peak + self.sampling_copy, self.sampling_peak)

    @property
    def usable(self) -> int:
        return int(self.capacity * HEADROOM)

    @property
    def fits(self) -> bool:
        return self.peak <= self.usable

    def report(self) -> str:
        g = format_size
        lines = [f"memory plan per device ({self.devices} {self.platform} device(s), mesh {self.mesh}; "
                 f"{g(self.capacity)} each from {self.capacity_source}, {HEADROOM:.0%} usable):",
                 f"  parameters      {g(self.params)}", f"  optimizer       {g(self.optimizer)}"]
        if self.reference:
            lines.append(f"  KL reference    {g(self.reference)}")
        if self.sampling_copy:
            lines.append(f"  sampling copy   {g(self.sampling_copy)}  (parameters in the compute dtype)")
        lines += [f"  gradients       {g(self.gradients)}",
                  f"  activations     {g(self.activations)}  (update, {self.micro_batches} micro-batch(es) of "
                  f"{self.micro_batch} rows, remat {self.remat})",
                  f"  KV cache        {g(self.kv_cache)}", f"  sampler logits  {g(self.sampler_logits)}",
                  f"  peak            {g(self.peak)}  (update {g(self.update_peak + self.sampling_copy)}, "
                  f"sampling {g(self.sampling_peak)})"]
        return "\n".join(lines)


def format_size(b: int) -> str:
    return f"{b / _GIB:.2f} GiB" if b >= _GIB / 10 else f"{b / 2 ** 20:.1f} MiB"


def device_capacity(devices, override_gib: float = 0.0) -> tuple[int, str]:
    """(bytes per device, where the figure comes from)."""
    import jax

    if override_gib > 0:
        return int(override_gib * _GIB), "train.device_memory_gib"
    local = [d for d in devices if d.process_index == jax.process_index()] or list(devices)
    stats = local[0].memory_stats()  # only this process's devices can be asked
    if stats and stats.get("bytes_limit"):
        return int(stats["bytes_limit"]), "the device's memory_stats"
    host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return host // len(local), f"host RAM / {len(local)} local device(s)"


def _per_device_bytes(tree) -> int:
    """Bytes one device holds of a tree of ShapeDtypeStructs with shardings (the largest shard)."""
    import jax
    import numpy as np

    total = 0
    for x in jax.tree.leaves(tree):
        shape = x.sharding.shard_shape(x.shape) if getattr(x, "sharding", None) is not None else x.shape
        total += math.prod(shape) * np.dtype(x.dtype).itemsize
    return total


def _axis_share(mesh, rule_axes, size: int) -> int:
    """How many ways a dimension of `size` splits over the mesh axes named by a rule (1 when they do not divide)."""
    axes = rule_axes if isinstance(rule_axes, tuple) else (rule_axes,) if rule_axes else ()
    ways = math.prod(mesh.shape[a] for a in axes)
    return ways if ways and size % ways == 0 else 1


JUDGE_ALLOWANCE = 256  # tokens of a judge prompt beyond the question and response (instructions, criteria)


def kv_cache_bytes(cfg, model_cfg, mesh, prefill: int | None = None, calls=()) -> int:
    """The sampler's KV cache for a step's rows at their largest, per device: [rows, kv heads, slots, head dim]
    keys and values in every layer, in the sampling dtype; rows over the batch axes, kv heads over the tensor
    axis (parallel/rules.py). Prefilled contexts are cached once more before they are copied into the rows, and
    where decode's cache grows through levels (sampling/sampler.py decode_levels) the cache of one level and the
    next are both held while it is copied: the larger of those moments counts.
    `prefill`: the context bucket (default: that of data.max_prompt_len). `calls`: (rows, context length) of
    explorers' own sampler calls (HeRL's revisions: every row its own context); the largest call counts. The
    held-out evaluation's calls count too (a step's rows at eval.max_new_tokens, every row its own prompt in the
    greedy pass), and with reward.judge=policy the judge's (a step's rows, each prompt the response after its
    instructions: JUDGE_ALLOWANCE tokens for those, an estimate). With rollout.decode_slots, a call's cache holds
    that many rows (a bucket) whatever its rows."""
    import numpy as np

    from jaxrl_llm.parallel.rules import DEFAULT_RULES
    from jaxrl_llm.rl.spec import rows_per_step
    from jaxrl_llm.sampling.buckets import bucket
    from jaxrl_llm.sampling.sampler import Sampler, decode_levels

    sampler = Sampler(None, pad_id=0, max_cache_len=model_cfg.max_position_embeddings)
    max_new = min(cfg.rollout.max_new_tokens, sampler.max_cache_len - 1)  # the sampler's per-row clamp
    rows, prefill, slots = sampler.shapes(rows_per_step(cfg), prefill or cfg.data.max_prompt_len, max_new)
    contexts = bucket(cfg.rollout.prompts_per_step) if cfg.rollout.shared_prefix else rows
    # sampling runs in the compute dtype; on CPU the sampler keeps a float32 cache of the same bf16 numbers
    # (sampling/decode.py cache_dtype), twice this for a bf16 config: plans made on CPU are for accelerators
    dtype = np.dtype(cfg.model.compute_dtype).itemsize
    kv = model_cfg.num_kv_heads // _axis_share(mesh, DEFAULT_RULES["kv_heads"], model_cfg.num_kv_heads)
    per_slot = 2 * model_cfg.num_layers * kv * model_cfg.head_dim * dtype

    def held(rows, contexts, prefill, slots):  # cache slots held at once, at the call's largest moment
        if cfg.rollout.decode_slots:  # rows pass through the decode slots (sampling/slots.py); regrouping and a
            rows = min(rows, bucket(cfg.rollout.decode_slots))  # level change hold two caches, as growth does
            contexts = min(contexts, rows)
        levels = decode_levels(prefill, slots, sampler.decode_level)
        moments = [rows * levels[0] + contexts * prefill] + [rows * (a + b) for a, b in zip(levels, levels[1:])]
        return per_slot * max(moments) // _axis_share(mesh, DEFAULT_RULES["batch"], rows)

    sizes = [held(rows, contexts, prefill, slots)]
    step_rows, prompt = rows_per_step(cfg), prefill or cfg.data.max_prompt_len
    own = [(step_rows, prompt, cfg.eval.max_new_tokens or cfg.rollout.max_new_tokens)]
    if cfg.reward.judge == "policy":  # a longer judge prompt is not sent (rewards/judge.py)
        own.append((step_rows, min(prompt + max_new + JUDGE_ALLOWANCE, sampler.max_cache_len - 1),
                    cfg.reward.judge_max_new_tokens))
    for n, context, *new in [*calls, *own]:  # with a floor on rows the sampler prefills one context a row
        call_new = min(new[0], sampler.max_cache_len - 1) if new else max_new
        rows, prefill, slots = sampler.shapes(n, context, call_new)
        sizes.append(held(rows, rows, prefill, slots))
    return max(sizes)


def memory_plan(cfg, model_cfg, mesh, shapes, params, opt_state, update, capacity: tuple[int, str]) -> MemoryPlan:
    """The plan of a run of `cfg` on `mesh` (pure: allocates and compiles nothing). `shapes`: the run's
    plan/shapes.py RunShapes; `params`, `opt_state`: its state, arrays or ShapeDtypeStructs with their shardings;
    `update`: plan/program.py's analysis of its update program; `capacity`: (bytes per device, whence)."""
    import jax
    import numpy as np

    from jaxrl_llm.model.lora import trainable
    from jaxrl_llm.parallel.rules import DEFAULT_RULES
    from jaxrl_llm.plan.program import peak_bytes
    from jaxrl_llm.sampling.buckets import bucket

    param_bytes, opt_bytes = _per_device_bytes(params), _per_device_bytes(opt_state)
    trained = trainable(params)
    f32_params = _per_device_bytes(jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, np.float32,
                                                                               sharding=x.sharding), trained))
    reference = _per_device_bytes(trained) if cfg.algo.kl_coef > 0 else 0  # the reference is what trains
    temp = update.memory.temp_size_in_bytes
    grads = f32_params * (2 if update.micro_batches > 1 else 1)
    copy = 0
    if cfg.model.compute_dtype != cfg.model.param_dtype:
        copy = param_bytes * np.dtype(cfg.model.compute_dtype).itemsize // np.dtype(cfg.model.param_dtype).itemsize
    rows = bucket(shapes.rows)
    logits = 3 * rows * model_cfg.vocab_size * 4 // _axis_share(mesh, DEFAULT_RULES["batch"], rows)
    return MemoryPlan(devices=int(mesh.devices.size), platform=mesh.devices.flat[0].platform, mesh=dict(mesh.shape),
                      capacity=capacity[0], capacity_source=capacity[1], params=param_bytes, optimizer=opt_bytes,
                      reference=reference, sampling_copy=copy, gradients=grads,
                      activations=max(temp - grads, 0), update_peak=peak_bytes(update.memory),
                      kv_cache=kv_cache_bytes(cfg, model_cfg, mesh, shapes.prefill, shapes.sampling_calls),
                      sampler_logits=logits, micro_batch=int(update.rows_per_micro_batch),
                      micro_batches=int(update.micro_batches), remat=bool(cfg.model.remat))


def plan(cfg, model_cfg=None) -> MemoryPlan:
    """The plan for a plain run of `cfg` (prompts up to data.max_prompt_len, no explorers) on the devices JAX
    finds: its update compiled (never run) from abstract state, nothing allocated."""
    from jaxrl_llm.parallel.mesh import make_mesh
    from jaxrl_llm.plan.program import config_update, model_config
    from jaxrl_llm.plan.shapes import config_shapes

    model_cfg = model_cfg or model_config(cfg)
    mesh = make_mesh({"data": cfg.mesh.data, "fsdp": cfg.mesh.fsdp, "tensor": cfg.mesh.tensor})
    _, params, opt_state, update = config_update(cfg, model_cfg, mesh)
    return memory_plan(cfg, model_cfg, mesh, config_shapes(cfg, model_cfg), params, opt_state, update,
                       device_capacity(list(mesh.devices.flat), cfg.train.device_memory_gib))


def suggestions(p: MemoryPlan, cfg) -> list[str]:
    """Settings that would bring the plan under the devices' usable memory, each estimated on its own."""
    out = []
    from jaxrl_llm.parallel.rules import DEFAULT_RULES
    from jaxrl_llm.rl.spec import rows_per_update

    rows = rows_per_update(cfg)
    m = cfg.algo.micro_batch
    # activations scale with a micro-batch's rows per device: rows split over the batch axes only when they
    # divide, so a micro-batch of fewer rows than the batch shards is no smaller on a device
    shards = math.prod(p.mesh.get(a, 1) for a in DEFAULT_RULES["batch"])
    per_device = lambda n: n // shards if n % shards == 0 else n  # noqa: E731
    while m > 1:
        m //= 2
        if rows % m or per_device(m) >= per_device(p.micro_batch):
            continue
        act = p.activations * per_device(m) // per_device(p.micro_batch)
        more = p.gradients if p.micro_batches == 1 else 0  # accumulating micro-batches keep a second gradient copy
        scaled = dataclasses.replace(p, activations=act, gradients=p.gradients + more,
                                     update_peak=p.update_peak - p.activations + act + more)
        if scaled.fits:
            peak = format_size(scaled.update_peak + scaled.sampling_copy)
            out.append(f"algo.micro_batch={m} (update peak about {peak})")
            break
    tensor = max(cfg.mesh.tensor, 1)
    for f in (2, 4, 8, 16, 32, 64, 128, 256):  # parameters, optimizer state and gradients divide by fsdp
        if f <= cfg.mesh.fsdp or p.devices % (f * tensor):
            continue
        part = lambda b: b * cfg.mesh.fsdp // f  # noqa: E731
        in_update = p.params + p.optimizer + p.reference + p.gradients
        scaled = dataclasses.replace(p, params=part(p.params), optimizer=part(p.optimizer),
                                     reference=part(p.reference), sampling_copy=part(p.sampling_copy),
                                     gradients=part(p.gradients),
                                     update_peak=p.update_peak - in_update + part(in_update))
        if scaled.fits:
            out.append(f"mesh.fsdp={f} with mesh.data={p.devices // f // tensor} "
                       f"(peak about {format_size(scaled.peak)})")
            break
    if not p.remat:
        out.append("model.remat=true (recomputes each layer's activations in the backward pass)")
    return out


def check(cfg, log=print, model_cfg=None, plan_made: MemoryPlan | None = None) -> MemoryPlan:
    """Print the plan (`plan_made`, or `plan(cfg, model_cfg)`); raise MemoryPlanError when it does not fit."""
    p = plan_made or plan(cfg, model_cfg)
    log(p.report())
    if not p.fits:
        tips = suggestions(p, cfg)
        raise MemoryPlanError(
            f"this config needs about {format_size(p.peak)} per device, more than the {format_size(p.usable)} "
            f"usable of each of the {p.devices} {p.platform} device(s) found ({HEADROOM:.0%} of "
            f"{format_size(p.capacity)}, {p.capacity_source}). "
            + ("Settings that would fit: " + "; or ".join(tips) if tips else
               "No single setting here makes it fit: use more or larger devices, or a smaller model") + ".")
    return p
