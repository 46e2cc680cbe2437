"""Decoder-only transformer (Llama / Qwen2 / Qwen3 / Mistral) in flax.nnx.

Every parameter carries `logical_axes` metadata (names from parallel/rules.py) so sharding is
decided by one rule table, never here. Softmax, RoPE, norms' statistics and logits are float32
whatever the parameter dtype.

Shapes in names: B batch, T new tokens, S cache slots (or keys), D model width, H heads, K kv heads,
G = H // K query heads per kv head, E head dim, F mlp width, V vocabulary.

The KV cache holds one slot per position: a token at position p is written to slot p, so a
query at position p attends to slots <= p (and > p - window in sliding-window layers). Rows of
one batch may sit at different positions; that is how right-padded prompts of varied lengths
decode together and why a padded row computes what it would alone.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxrl_llm.model import attention, lora
from jaxrl_llm.model.config import ModelConfig
from jaxrl_llm.model.remat import remat

# keys per block of the blockwise attention (model/attention.py) in calls of several tokens over more keys than
# this: prefill, log-probs and the update; 0: dense attention everywhere. A Transformer attribute like remat
# (set from model.attention_block), so it travels in the static graphdef
ATTENTION_BLOCK = 512


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class KVCache:
    """Per-layer keys [B, K, E, S] and values [B, K, S, E]: laid out so both attention matmuls
    are plain (non-transposed) batched GEMMs over the cache, read in place every decode step."""

    keys: list[jax.Array]
    values: list[jax.Array]

    @classmethod
    def zeros(cls, cfg: ModelConfig, batch: int, slots: int, dtype=None) -> "KVCache":
        dtype = dtype or jnp.dtype(cfg.param_dtype)
        k_shape = (batch, cfg.num_kv_heads, cfg.head_dim, slots)
        v_shape = (batch, cfg.num_kv_heads, slots, cfg.head_dim)
        return cls([jnp.zeros(k_shape, dtype) for _ in range(cfg.num_layers)],
                   [jnp.zeros(v_shape, dtype) for _ in range(cfg.num_layers)])

    @property
    def slots(self) -> int:
        return self.values[0].shape[2]


def dot(eq: str | None, x, w):
    """einsum (x @ w when `eq` is None) with float32 accumulation, the result in x's dtype: the numbers of a plain
    einsum (bf16 dots accumulate in float32 and round once), but XLA:CPU runs bf16 operands natively (oneDNN /
    YNNPACK) only when the dot asks for a float32 result; a bf16 result makes it convert both operands, every
    weight at every decode step, to float32 first (`jaxrl-llm bench decode`). The same program as before in
    float32."""
    if eq is None:  # x @ w
        return jnp.matmul(x, w, preferred_element_type=jnp.float32).astype(x.dtype)
    return jnp.einsum(eq, x, w, preferred_element_type=jnp.float32).astype(x.dtype)


def _param(init, key, shape, dtype, axes):
    return nnx.Param(init(key, shape, dtype), logical_axes=axes)


class RMSNorm(nnx.Module):
    def __init__(self, dim: int, eps: float, dtype):
        self.eps = eps
        self.scale = nnx.Param(jnp.ones((dim,), dtype), logical_axes=("norm",))

    def __call__(self, x):
        x32 = x.astype(jnp.float32)
        y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return self.scale[...] * y.astype(x.dtype)


def rope_inv_freq(head_dim: int, theta: float, scaling=None) -> np.ndarray:
    """Inverse frequencies [E/2] (float32, as transformers computes them), with `llama3` scaling when
    `scaling` (ModelConfig.rope_scaling) says so: low frequencies divided by `factor`, high ones kept,
    a smooth blend between (transformers' _compute_llama3_parameters)."""
    inv_freq = 1.0 / (np.float32(theta) ** (np.arange(0, head_dim, 2).astype(np.float32) / np.float32(head_dim)))
    inv_freq = inv_freq.astype(np.float32)
    if not scaling:
        return inv_freq
    p = dict(scaling)
    assert p["rope_type"] == "llama3", p  # ModelConfig refuses the others
    factor, low, high = p["factor"], p["low_freq_factor"], p["high_freq_factor"]
    old_len = p["original_max_position_embeddings"]
    wavelen = (2 * math.pi / inv_freq).astype(np.float32)
    scaled = np.where(wavelen > old_len / low, inv_freq / factor, inv_freq).astype(np.float32)
    smooth = ((old_len / wavelen - low) / (high - low)).astype(np.float32)
    smoothed = ((1 - smooth) * scaled / factor + smooth * scaled).astype(np.float32)
    medium = ~(wavelen < old_len / high) & ~(wavelen > old_len / low)
    return np.where(medium, smoothed, scaled).astype(np.float32)


def rope_angles(positions_BT, head_dim: int, theta: float, scaling=None):
    """(cos, sin) [B, T, 1, E/2] in float32, computed once per forward and shared by all layers."""
    inv_freq = jnp.asarray(rope_inv_freq(head_dim, theta, scaling))
    angles_BTh = positions_BT.astype(jnp.float32)[..., None] * inv_freq
    return jnp.cos(angles_BTh)[:, :, None, :], jnp.sin(angles_BTh)[:, :, None, :]


def rope(x_BTNE, cos_sin):
    """Rotary embedding, Hugging Face rotate-half convention, computed in float32."""
    cos, sin = cos_sin
    half = x_BTNE.shape[-1] // 2
    x = x_BTNE.astype(jnp.float32)
    x1, x2 = x[..., :half], x[..., half:]
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return out.astype(x_BTNE.dtype)


class Attention(nnx.Module):
    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs, layer: int = 0):
        d, h, k, e = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        dt = jnp.dtype(cfg.param_dtype)
        init = nnx.initializers.normal(0.02)
        self.cfg = cfg
        self.window = cfg.layer_window(layer)  # Qwen2/3 slide in some layers only
        self.q = _param(init, rngs.params(), (d, h, e), dt, ("embed", "heads", "head_dim"))
        self.k = _param(init, rngs.params(), (d, k, e), dt, ("embed", "kv_heads", "head_dim"))
        self.v = _param(init, rngs.params(), (d, k, e), dt, ("embed", "kv_heads", "head_dim"))
        self.o = _param(init, rngs.params(), (h, e, d), dt, ("heads", "head_dim", "embed"))
        if cfg.attention_bias:
            zeros = nnx.initializers.zeros
            self.q_bias = _param(zeros, rngs.params(), (h, e), dt, ("heads", "head_dim"))
            self.k_bias = _param(zeros, rngs.params(), (k, e), dt, ("kv_heads", "head_dim"))
            self.v_bias = _param(zeros, rngs.params(), (k, e), dt, ("kv_heads", "head_dim"))
        if cfg.out_bias:
            self.o_bias = _param(nnx.initializers.zeros, rngs.params(), (d,), dt, ("embed",))
        if cfg.qk_norm:
            self.q_norm = RMSNorm(e, cfg.rms_norm_eps, dt)
            self.k_norm = RMSNorm(e, cfg.rms_norm_eps, dt)

    def __call__(self, x_BTD, positions_BT, cos_sin, cache_kv, prefix=None, block: int = 0, lora_key=None):
        """Without a cache: causal attention over the given tokens, after the keys and values of an
        optional `prefix` (keys [B, K, E, P], values [B, K, P, E], positions [B, P]; slots to ignore
        carry a position past every query). Returns (y, (keys, values)): the cache's keys and values
        when there is one, else this call's own. `block` > 0: blockwise attention where several tokens
        attend to more keys than that (model/attention.py)."""
        cfg = self.cfg
        q = lora.add(self, "q", x_BTD, dot("btd,dhe->bthe", x_BTD, self.q[...]), lora_key)
        k = lora.add(self, "k", x_BTD, dot("btd,dke->btke", x_BTD, self.k[...]), lora_key)
        v = lora.add(self, "v", x_BTD, dot("btd,dke->btke", x_BTD, self.v[...]), lora_key)
        if cfg.attention_bias:
            q, k, v = q + self.q_bias[...], k + self.k_bias[...], v + self.v_bias[...]
        if cfg.qk_norm:  # Qwen3: per head, after the projection's bias, before RoPE
            q, k = self.q_norm(q), self.k_norm(k)
        q = rope(q, cos_sin)
        k = rope(k, cos_sin)

        if cache_kv is None:  # full causal attention over the given tokens (and the prefix)
            keys, values, key_pos_BS = k.transpose(0, 2, 3, 1), v.transpose(0, 2, 1, 3), positions_BT
            own = (keys, values)
            if prefix is not None:
                pk, pv, ppos = prefix
                keys = jnp.concatenate([pk.astype(keys.dtype), keys], axis=-1)
                values = jnp.concatenate([pv.astype(values.dtype), values], axis=2)
                key_pos_BS = jnp.concatenate([ppos, positions_BT], axis=1)
        else:  # write this step's keys into their position slots, attend over the whole cache
            cache_k, cache_v = cache_kv
            rows = jnp.arange(x_BTD.shape[0])[:, None]
            keys = cache_k.at[rows, :, :, positions_BT].set(k.astype(cache_k.dtype))
            values = cache_v.at[rows, :, positions_BT].set(v.astype(cache_v.dtype))
            key_pos_BS = jnp.broadcast_to(jnp.arange(values.shape[2]), values.shape[:1] + values.shape[2:3])
            own = (keys, values)

        b, t, h, e = q.shape
        kh, g = cfg.num_kv_heads, h // cfg.num_kv_heads
        # queries of one kv head flattened to Q = T*G rows: one plain batched matmul per (b, k),
        # which XLA runs far faster than a dot with two free dims on one side
        q_BKQE = q.reshape(b, t, kh, g, e).transpose(0, 2, 1, 3, 4).reshape(b, kh, t * g, e)
        qpos_BQ = jnp.repeat(positions_BT, g, axis=1)
        if block and t > 1 and keys.shape[-1] > block:  # memory linear in the keys, not T x S scores
            out = attention.blockwise(q_BKQE, keys, values, qpos_BQ, key_pos_BS, self.window, block)
        else:
            out = attention.dense(q_BKQE, keys, values, qpos_BQ, key_pos_BS, self.window)
        out = out.reshape(b, kh, t, g, e).transpose(0, 2, 1, 3, 4).reshape(b, t, h, e)
        o_w = self.o[...]
        if o_w.dtype == jnp.float32:
            y = dot("bthe,hed->btd", out, o_w)
        else:  # heads and head dim flattened (a bitcast of [H, E, D]): with two contracting dims XLA:CPU copies
            # the transposed weight at every call, and converts a bf16 one to float32 (float32 keeps its own
            # summation order: the GRPO reference test holds its last bits)
            y = dot("btf,fd->btd", out.reshape(b, t, h * e), o_w.reshape(h * e, o_w.shape[-1]))
        y = lora.add(self, "o", out, y, lora_key)
        if cfg.out_bias:
            y = y + self.o_bias[...]
        return y, own


class MLP(nnx.Module):
    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
        d, f, dt = cfg.hidden_size, cfg.intermediate_size, jnp.dtype(cfg.param_dtype)
        init = nnx.initializers.normal(0.02)
        self.gate = _param(init, rngs.params(), (d, f), dt, ("embed", "mlp"))
        self.up = _param(init, rngs.params(), (d, f), dt, ("embed", "mlp"))
        self.down = _param(init, rngs.params(), (f, d), dt, ("mlp", "embed"))

    def __call__(self, x_BTD, lora_key=None):
        gate = lora.add(self, "gate", x_BTD, dot(None, x_BTD, self.gate[...]), lora_key)
        h = jax.nn.silu(gate) * lora.add(self, "up", x_BTD, dot(None, x_BTD, self.up[...]), lora_key)
        return lora.add(self, "down", h, dot(None, h, self.down[...]), lora_key)


class Block(nnx.Module):
    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs, layer: int = 0):
        dt = jnp.dtype(cfg.param_dtype)
        self.attn_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dt)
        self.attn = Attention(cfg, rngs, layer)
        self.mlp_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dt)
        self.mlp = MLP(cfg, rngs)

    def __call__(self, x_BTD, positions_BT, cos_sin, cache_kv, prefix=None, block: int = 0, lora_key=None):
        a, cache_kv = self.attn(self.attn_norm(x_BTD), positions_BT, cos_sin, cache_kv, prefix, block, lora_key)
        x_BTD = x_BTD + a
        return x_BTD + self.mlp(self.mlp_norm(x_BTD), lora_key), cache_kv


class Transformer(nnx.Module):
    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
        dt = jnp.dtype(cfg.param_dtype)
        self.cfg = cfg
        self.embed = _param(nnx.initializers.normal(0.02), rngs.params(), (cfg.vocab_size, cfg.hidden_size), dt,
                            ("vocab", "embed"))
        self.layers = nnx.List([Block(cfg, rngs, i) for i in range(cfg.num_layers)])
        self.final_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dt)
        self.remat = False  # recompute each layer's activations in the backward pass (training memory)
        self.attention_block = ATTENTION_BLOCK
        if not cfg.tie_embeddings:
            self.lm_head = _param(nnx.initializers.normal(0.02), rngs.params(), (cfg.hidden_size, cfg.vocab_size), dt,
                                  ("embed", "vocab"))

    def __call__(self, tokens_BT, positions_BT, cache: KVCache | None = None, *, prefix=None,
                 return_kv: bool = False, lora_key=None):
        """Returns final-normed hidden states [B, T, D] and the updated cache (None without one).

        `lora_key` (raw uint32 key data): the training forward's key for LoRA dropout (model/lora.py add);
        None everywhere else (sampling, evaluation, the reference), where adapters see their whole input.

        Without a cache, `prefix` = (KVCache of P slots, positions [B, P]) is attended to before the
        tokens (the shared-prefix update), and `return_kv` returns this call's keys and values as a
        KVCache of T slots instead of None."""
        x = jnp.take(self.embed[...], tokens_BT, axis=0)
        cos_sin = rope_angles(positions_BT, self.cfg.head_dim, self.cfg.rope_theta, self.cfg.rope_scaling)
        new_k, new_v, block = [], [], self.attention_block
        for i, layer in enumerate(self.layers):
            layer_cache = None if cache is None else (cache.keys[i], cache.values[i])
            layer_prefix = None if prefix is None else (prefix[0].keys[i], prefix[0].values[i], prefix[1])
            layer_key = None if lora_key is None else jax.random.fold_in(lora_key, i)
            if self.remat:  # also with a cache or a prefix: the shared-prefix update trains through them
                graphdef, state = nnx.split(layer)

                def run(state, h, c, pre, positions, angles, key, graphdef=graphdef):
                    return nnx.merge(graphdef, state)(h, positions, angles, c, pre, block, key)

                x, kv = remat(run)(state, x, layer_cache, layer_prefix, positions_BT, cos_sin, layer_key)
            else:
                x, kv = layer(x, positions_BT, cos_sin, layer_cache, layer_prefix, block, layer_key)
            new_k.append(kv[0])
            new_v.append(kv[1])
        keep = cache is not None or return_kv
        return self.final_norm(x), (KVCache(new_k, new_v) if keep else None)

    def head(self):
        """The output projection [D, V] (the embedding's transpose when tied)."""
        return self.embed[...].T if self.cfg.tie_embeddings else self.lm_head[...]

    def logits(self, hidden_XD):
        """Float32 logits over the vocabulary for hidden states of any leading shape. Tied bf16 embeddings are
        contracted as they lie ([V, D], no transpose): XLA:CPU converts a transposed bf16 operand to float32
        (the whole embedding, at every decode step) but runs this form natively."""
        if self.cfg.tie_embeddings and self.embed[...].dtype != jnp.float32:
            return jnp.einsum("...d,vd->...v", hidden_XD, self.embed[...], preferred_element_type=jnp.float32)
        return jnp.matmul(hidden_XD, self.head(), preferred_element_type=jnp.float32)


def init_model(cfg: ModelConfig, seed: int = 0) -> Transformer:
    return Transformer(cfg, nnx.Rngs(params=seed))


def abstract_model(cfg: ModelConfig, adapters: "lora.LoraSpec | None" = None) -> Transformer:
    """The model's structure (with `adapters` when given) with ShapeDtypeStructs in place of arrays (no memory
    is used)."""
    return nnx.eval_shape(lambda: new_model(cfg, 0, adapters))


def new_model(cfg: ModelConfig, seed: int = 0, adapters: "lora.LoraSpec | None" = None) -> Transformer:
    """A freshly initialised model, with fresh LoRA adapters (model/lora.py) when `adapters` is given."""
    model = Transformer(cfg, nnx.Rngs(params=seed))
    return lora.add_adapters(model, adapters, seed) if adapters else model
