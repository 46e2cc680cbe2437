"""Tokenizers from local folders only (the Hub is never contacted) and chat-prompt encoding."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def load_tokenizer(folder: str | Path):
    from transformers import AutoTokenizer

    folder = Path(folder)
    if not (folder / "tokenizer.json").is_file() and not (folder / "tokenizer_config.json").is_file():
        raise FileNotFoundError(f"{folder}: no tokenizer files (tokenizer.json / tokenizer_config.json)")
    return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)


def pad_id(tokenizer) -> int:
    pid = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return int(pid if pid is not None else 0)


def stop_ids(tokenizer, extra: Sequence[int] = ()) -> tuple[int, ...]:
    ids = [tokenizer.eos_token_id, *extra]
    return tuple(sorted({int(i) for i in ids if i is not None}))


def encode_chat(tokenizer, messages: list[dict[str, str]]) -> list[int]:
    """Token ids of `messages` through the tokenizer's chat template, ready for the assistant turn."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("the tokenizer has no chat template; pass a raw prompt instead")
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tokenizer(text, add_special_tokens=False)["input_ids"]
