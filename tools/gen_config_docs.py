"""Writes docs/configuration.md, the configuration reference, from jaxrl_llm/config/sections.py.

Sections, fields, types and defaults come from the config dataclasses themselves; each field's
description is the comment written beside it or on the lines just above it in config/sections.py (read with
`tokenize`, so a `#` inside a string is not a comment), and its allowed values come from
`config.CHOICES`. The page therefore cannot say anything the source does not; tests/test_docs.py
fails when the committed page differs from what this script writes.

    .venv/bin/python tools/gen_config_docs.py           # rewrite docs/configuration.md
    .venv/bin/python tools/gen_config_docs.py --check   # exit 1 (and say so) when it is stale
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import io
import json
import re
import sys
import tokenize
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "jaxrl_llm" / "config" / "sections.py"
OUTPUT = ROOT / "docs" / "configuration.md"
COMMAND = ".venv/bin/python tools/gen_config_docs.py"


def field_comments(source: str) -> tuple[dict[tuple[str, str], str], dict[str, str]]:
    """(class, field) -> the field's comment, and class -> docstring, for the module-level classes.

    A field's comment is the block of comment-only lines right above it (no blank line between)
    followed by any comment on its own lines; a block above one field says nothing about the next.
    """
    comments: dict[int, tuple[str, bool]] = {}  # line -> (text, whether the line holds only the comment)
    lines = source.splitlines()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            row, col = tok.start
            alone = not lines[row - 1][:col].strip()
            comments[row] = (tok.string.lstrip("#").strip(), alone)
    fields: dict[tuple[str, str], str] = {}
    docs: dict[str, str] = {}
    for node in ast.parse(source).body:
        if not isinstance(node, ast.ClassDef):
            continue
        docs[node.name] = " ".join((ast.get_docstring(node) or "").split())
        for stmt in node.body:
            if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
                continue
            above = []
            row = stmt.lineno - 1
            while row in comments and comments[row][1]:
                above.append(comments[row][0])
                row -= 1
            beside = [comments[r][0] for r in range(stmt.lineno, stmt.end_lineno + 1)
                      if r in comments and not comments[r][1]]
            fields[node.name, stmt.target.id] = " ".join(above[::-1] + beside)
    return fields, docs


def _default(field: dataclasses.Field):
    if field.default is not dataclasses.MISSING:
        return field.default
    return field.default_factory()


def _yaml(value) -> str:
    """A default as it would be written in a YAML config."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):  # quoted only where YAML would read the bare text as something else
        return value if value and yaml.safe_load(value) == value else json.dumps(value)
    if isinstance(value, dict):
        return "{}" if not value else repr(value)
    if isinstance(value, float):
        text = repr(value)  # YAML reads 1e-06 as a string: the mantissa needs its dot
        mantissa, e, exponent = text.partition("e")
        return f"{mantissa}{'' if '.' in mantissa else '.0'}e{exponent}" if e else text
    return repr(value)


def _cell(text: str) -> str:
    # a bare <out_dir> would read as an HTML tag; inside `code` an entity would show as written
    parts = re.split(r"(`[^`]*`)", text)
    return "".join(p if p.startswith("`") else p.replace("<", "&lt;") for p in parts).replace("|", "\\|")


def _pointer(field: str, own: dict[str, str], section: str) -> str:
    """For a field without a comment: 'see `x`' when the comment of field x of its section names it.

    Only names with an underscore are looked for: a plain word (`steps`, `seed`) in a comment is English.
    """
    if "_" not in field:
        return ""
    for other, text in own.items():
        if other != field and re.search(rf"(?<![\w.]){re.escape(field)}(?!\w)", text):
            return f"see `{section}.{other}`"
    return ""


def sections(cls, prefix: str = ""):
    """(dotted section, its dataclass) for every section, depth first in declaration order."""
    for f in dataclasses.fields(cls):
        sub = type(_default(f))
        if dataclasses.is_dataclass(sub):
            name = f"{prefix}{f.name}"
            yield name, sub
            yield from sections(sub, name + ".")


def render() -> str:
    """The whole page, as `main` would write it."""
    from jaxrl_llm import config

    comments, class_docs = field_comments(SOURCE.read_text())
    out = [
        "# Configuration reference",
        "",
        "Generated by `tools/gen_config_docs.py` from `jaxrl_llm/config/sections.py`: do not edit by hand; after changing",
        f"a config field or its comment, run `{COMMAND}`. Each description is the comment",
        "beside or above the field in config/sections.py; a field without one points to the field whose comment names",
        "it (\"see ...\"), or is left empty.",
        "",
        "A run's config is a YAML file of these sections (`--config FILE`, e.g. `configs/default.yaml`) plus",
        "`a.b=value` overrides on the command line (`jaxrl-llm train --config configs/toy.yaml optim.lr=3e-4`);",
        "a key left out takes the default below. Unknown keys are refused with the closest known names, values",
        "are checked against their type and allowed values, and the cross-field rules (`validate` in",
        "jaxrl_llm/config/checks.py) name the keys at fault. Every run writes its resolved config to `<train.out_dir>/config.yaml`.",
        "",
        "Sections: " + ", ".join(f"[`{name}`](#{name.replace('.', '')})" for name, _ in sections(config.Config)) + ".",
        "",
    ]
    long_defaults = []
    for name, cls in sections(config.Config):
        out += [f"## {name}", ""]
        if class_docs.get(cls.__name__):
            out += [class_docs[cls.__name__], ""]
        leaves = [f for f in dataclasses.fields(cls) if not dataclasses.is_dataclass(type(_default(f)))]
        subs = [f"`{name}.{f.name}`" for f in dataclasses.fields(cls) if f not in leaves]
        if subs:
            out += ["Subsections: " + ", ".join(subs) + ".", ""]
        if not leaves:
            continue
        out += ["| key | type | default | allowed | description |", "|---|---|---|---|---|"]
        own = {f.name: comments.get((cls.__name__, f.name), "") for f in leaves}
        for f in leaves:
            key = f"{name}.{f.name}"
            value = _default(f)
            if isinstance(value, str) and "\n" in value:
                shown = "see below"
                long_defaults.append((key, value))
            else:
                shown = f"`{_yaml(value)}`"
            allowed = ", ".join(f"`{_yaml(c)}`" for c in config.CHOICES.get(key, ()))
            refused = [f"`{v}` refused: {why}" for (k, v), why in config.REFUSED.items() if k == key]
            text = " ".join([own[f.name] or _pointer(f.name, own, name)] + refused).strip()
            out.append(f"| `{key}` | {_cell(f.type)} | {_cell(shown)} | {_cell(allowed)} | {_cell(text)} |")
        out.append("")
    for key, value in long_defaults:
        out += [f"Default of `{key}`:", "", "```text", value, "```", ""]
    return "\n".join(out)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when docs/configuration.md is stale")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        if OUTPUT.exists() and OUTPUT.read_text() == text:
            return 0
        print(f"{OUTPUT.relative_to(ROOT)} is stale: run `{COMMAND}`", file=sys.stderr)
        return 1
    OUTPUT.write_text(text)
    print(f"wrote {OUTPUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
