"""The policy a run trains: model (loaded or built from scratch) placed on the mesh, its tokenizer,
and the prompts of a task set encoded once."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import jax
from flax import nnx
from jax.sharding import Mesh

from jaxrl_llm.config import Config
from jaxrl_llm.data.tasks import prompt_messages
from jaxrl_llm.data.types import TaskItem
from jaxrl_llm.model import lora
from jaxrl_llm.model.config import ModelConfig
from jaxrl_llm.model.hf_io import load_hf_folder
from jaxrl_llm.model.registry import resolve
from jaxrl_llm.model.tokenizer import encode_chat, load_tokenizer
from jaxrl_llm.model.transformer import abstract_model, new_model
from jaxrl_llm.parallel import hosts
from jaxrl_llm.parallel.rules import sharding_tree


@dataclasses.dataclass(frozen=True)
class Policy:
    """What stays fixed about the policy: its graph, shape and tokenizer. Its weights live in the
    train state (train/state.py) only: the update donates them, so no other reference may be kept."""

    graphdef: nnx.GraphDef
    model_cfg: ModelConfig
    tokenizer: object
    adapters: lora.LoraSpec | None = None  # model.lora: only these adapters train (model/lora.py)

    def signature(self) -> dict:
        """What a checkpoint must match to be restored into this policy."""
        c = self.model_cfg
        sig = {"architecture": c.architecture, "vocab_size": c.vocab_size, "hidden_size": c.hidden_size,
               "intermediate_size": c.intermediate_size, "num_layers": c.num_layers, "num_heads": c.num_heads,
               "num_kv_heads": c.num_kv_heads, "head_dim": c.head_dim}
        if self.adapters:  # a full fine-tune's checkpoint (no key) and an adapter checkpoint never mix
            sig["lora"] = {"rank": self.adapters.rank, "alpha": self.adapters.alpha,
                           "targets": list(self.adapters.targets)}
        return sig


def build_policy(cfg: Config, mesh: Mesh, out_dir: Path) -> tuple[Policy, nnx.State]:
    """The policy and its initial weights (placed on the mesh), with fresh adapters on a frozen base when
    model.lora.rank > 0."""
    adapters = lora.LoraSpec.from_config(cfg.model.lora)
    if cfg.model.name == "scratch":
        from jaxrl_llm.model.char_tokenizer import char_tokenizer

        tok = char_tokenizer()
        model_cfg = ModelConfig.from_scratch(cfg.model.scratch, vocab_size=len(tok), param_dtype=cfg.model.param_dtype,
                                             eos_token_ids=(tok.eos_token_id,))
        graphdef, abstract = nnx.split(abstract_model(model_cfg, adapters))
        shardings = sharding_tree(abstract, mesh)
        # created directly in the sharded layout: the initialiser itself is jitted with out_shardings
        params = jax.jit(lambda: nnx.state(new_model(model_cfg, cfg.train.seed, adapters)), out_shardings=shardings)()
        tok.save_pretrained(str(out_dir / "tokenizer"))
    else:
        folder = resolve(cfg.model.name)
        model, model_cfg = load_hf_folder(folder, mesh=mesh, param_dtype=cfg.model.param_dtype)
        tok = load_tokenizer(folder, cfg.data.chat_template_override)
        if adapters:  # small: made on the host, then laid out by the rule table like the base
            lora.add_adapters(model, adapters, cfg.train.seed)
        graphdef, params = nnx.split(model)
        if adapters:
            fresh = jax.device_get(lora.adapter_state(params))
            params = lora.combine(hosts.put_tree(fresh, sharding_tree(fresh, mesh)), lora.frozen(params))
    return Policy(with_options(graphdef, params, cfg), model_cfg, tok, adapters), params


def with_options(graphdef, params, cfg: Config):
    """The graphdef with the run's computation options (model.remat, model.attention_block) set."""
    model = nnx.merge(graphdef, params)
    model.remat, model.attention_block = bool(cfg.model.remat), int(cfg.model.attention_block)
    return nnx.split(model)[0]


def encode_prompt(tok, cfg: Config, item: TaskItem) -> list[int]:
    if item.messages:  # a multi-turn row: its own turns, always in the chat template
        return encode_chat(tok, prompt_messages(item, cfg.data.system_prompt, cfg.data.instruction))
    return encode_text(tok, cfg, item.question + (f"\n{cfg.data.instruction}" if cfg.data.instruction else ""))


def encode_text(tok, cfg: Config, content: str) -> list[int]:
    """A user message as the policy sees a prompt: in the chat template (with the system prompt) unless
    data.chat_template is off."""
    if not cfg.data.chat_template:
        return tok(content, add_special_tokens=False)["input_ids"]
    messages = ([{"role": "system", "content": cfg.data.system_prompt}] if cfg.data.system_prompt else []) + \
        [{"role": "user", "content": content}]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tok(text, add_special_tokens=False)["input_ids"]


def encode_items(tok, cfg: Config, items: list[TaskItem]) -> tuple[list[tuple[TaskItem, list[int]]], int, int]:
    """(item, prompt ids) pairs, and the numbers of prompts longer than data.max_prompt_len dropped and cut.
    With data.overlong=truncate, long prompts keep their last max_prompt_len tokens (the question's end
    and the assistant header) instead: counted, since their start (a system prompt, the question's opening) is
    gone."""
    out, dropped, truncated = [], 0, 0
    for item in items:
        ids = encode_prompt(tok, cfg, item)
        if len(ids) > cfg.data.max_prompt_len:
            if cfg.data.overlong == "drop":
                dropped += 1
                continue
            ids, truncated = ids[-cfg.data.max_prompt_len:], truncated + 1
        out.append((item, ids))
    return out, dropped, truncated
