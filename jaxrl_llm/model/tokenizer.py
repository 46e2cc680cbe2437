"""Tokenizers from local folders only (the Hub is never contacted) and chat-prompt encoding.

Nothing here changes the HF_* environment: `local_files_only=True` keeps loading off the network, and the
CLI alone decides offline mode for its process (jaxrl_llm/hub.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence


# tokenizer_config.json classes that AutoTokenizer resolves to transformers' generic tokenizers-library class
# (what this package writes for scratch and GGUF models, and what many hub models name)
GENERIC_CLASSES = frozenset({"TokenizersBackend", "PreTrainedTokenizerFast"})


def load_tokenizer(folder: str | Path, chat_template: str = ""):
    """The tokenizer of a local model folder; `chat_template` (data.chat_template_override: Jinja text or the path
    of a .jinja file) replaces the folder's template, e.g. for a model that ships none. A folder whose
    tokenizer_config.json names the generic class (GENERIC_CLASSES; no remote code) is loaded through that class:
    the object AutoTokenizer returns, without importing AutoTokenizer's model registry, which imports torch where
    it is installed (~3.5 s of every process's start on a 2-core CPU)."""
    folder = Path(folder)
    if not (folder / "tokenizer.json").is_file() and not (folder / "tokenizer_config.json").is_file():
        raise FileNotFoundError(f"{folder}: no tokenizer files (tokenizer.json / tokenizer_config.json)")
    if _generic(folder):
        from transformers import PreTrainedTokenizerFast as Loader
    else:
        from transformers import AutoTokenizer as Loader
    tok = Loader.from_pretrained(str(folder), local_files_only=True)
    if chat_template:
        tok.chat_template = read_chat_template(chat_template)
    return tok


def _generic(folder: Path) -> bool:
    """Whether `folder` holds a tokenizer.json and a tokenizer_config.json naming a GENERIC_CLASSES class, with no
    `auto_map` (remote code); anything else (a class of its own, a sentencepiece model alone, an unreadable
    config) goes to AutoTokenizer, which also gives the errors."""
    import json

    try:
        config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return (isinstance(config, dict) and config.get("tokenizer_class") in GENERIC_CLASSES
            and "auto_map" not in config and (folder / "tokenizer.json").is_file())


def read_chat_template(value: str) -> str:
    """A chat template given as Jinja text (it holds "{%" or "{{") or as the path of a file holding it; a path
    that is no file, or a template Jinja cannot parse, is refused naming it."""
    import jinja2

    text = value
    if "{%" not in value and "{{" not in value:
        path = Path(value).expanduser()
        if not path.is_file():
            raise FileNotFoundError(f"data.chat_template_override={value!r}: no such file (give a Jinja template or "
                                    f"the path of a .jinja file)")
        text = path.read_text(encoding="utf-8")
    try:
        jinja2.Environment().parse(text)
    except jinja2.TemplateSyntaxError as e:
        raise ValueError(f"data.chat_template_override={value!r}: not a Jinja template: {e.message} "
                         f"(line {e.lineno})") from None
    return text


def pad_id(tokenizer) -> int:
    pid = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return int(pid if pid is not None else 0)


def stop_ids(tokenizer, extra: Sequence[int] = ()) -> tuple[int, ...]:
    ids = [tokenizer.eos_token_id, *extra]
    return tuple(sorted({int(i) for i in ids if i is not None}))


def encode_chat(tokenizer, messages: list[dict[str, str]]) -> list[int]:
    """Token ids of `messages` through the tokenizer's chat template, ready for the assistant turn."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("the tokenizer has no chat template: give one (data.chat_template_override: Jinja text or "
                         "a .jinja file) or encode a raw prompt")
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tokenizer(text, add_special_tokens=False)["input_ids"]
