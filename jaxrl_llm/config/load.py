"""Loading a run configuration from YAML with `a.b=c` overrides.

Unknown keys are refused with the closest known names; values are checked against their types and
the choices each field allows, and errors name the file and the dotted key at fault.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from pathlib import Path
from typing import Any

import yaml

from jaxrl_llm.config.checks import validate
from jaxrl_llm.config.choices import CHOICES, REFUSED
from jaxrl_llm.config.sections import Config, ConfigError


def _build(cls, raw: Any, where: str, source: str):
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: '{where or 'top level'}' must be a mapping, got {type(raw).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for key, value in raw.items():
        dotted = f"{where}.{key}" if where else key
        if key not in fields:
            close = difflib.get_close_matches(key, fields, n=3, cutoff=0.5)
            hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else \
                f"; known keys: {', '.join(fields)}"
            raise ConfigError(f"{source}: unknown key '{dotted}'{hint}")
        typ = hints[key]
        if dataclasses.is_dataclass(typ):
            kwargs[key] = _build(typ, value or {}, dotted, source)
        else:
            kwargs[key] = _coerce(value, typ, dotted, source)
            if isinstance(kwargs[key], str) and (dotted, kwargs[key]) in REFUSED:
                raise ConfigError(f"{source}: '{dotted}' is {kwargs[key]!r}: {REFUSED[dotted, kwargs[key]]}")
            if dotted in CHOICES and kwargs[key] not in CHOICES[dotted]:
                raise ConfigError(f"{source}: '{dotted}' is {kwargs[key]!r}; choose from {CHOICES[dotted]}")
    return cls(**kwargs)


def _coerce(value, typ, dotted, source):
    origin = typing.get_origin(typ)
    if origin in (typing.Union, types.UnionType):
        options = [t for t in typing.get_args(typ) if t is not type(None)]
        if len(options) > 1:  # a field of several types (data.data_files: str | list | dict)
            for option in options:
                try:
                    return _coerce(value, option, dotted, source)
                except ConfigError:
                    pass
            raise ConfigError(f"{source}: '{dotted}' must be {' or '.join(t.__name__ for t in options)}, "
                              f"got {value!r}")
        typ = options[0]
    if typ is bool:
        if isinstance(value, bool):
            return value
    elif typ is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif typ is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML 1.1 reads 3e-4 (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
    elif typ is str:
        if isinstance(value, str):
            return value
    elif typ is dict:
        if isinstance(value, dict):
            return value
    elif typ is list:
        if isinstance(value, list):
            return value
    raise ConfigError(f"{source}: '{dotted}' must be {typ.__name__}, got {value!r}")


def _parse_override(item: str):
    if "=" not in item:
        raise ConfigError(f"override {item!r} is not of the form a.b=value")
    key, text = item.split("=", 1)
    try:
        return key.strip().split("."), yaml.safe_load(text) if text != "" else ""
    except yaml.YAMLError:  # prose that is no YAML (a multi-line template): the text itself; typed fields check it
        return key.strip().split("."), text


def load_config(path: str | Path | None = None, overrides: list[str] = ()) -> Config:
    raw: dict = {}
    source = "defaults"
    if path is not None:
        source = str(path)
        try:
            raw = yaml.safe_load(Path(path).read_text()) or {}
        except FileNotFoundError:
            raise ConfigError(f"{path}: no such config file") from None
        except yaml.YAMLError as e:
            raise ConfigError(f"{path}: invalid YAML: {e}") from None
    for item in overrides:
        keys, value = _parse_override(item)
        node = raw
        for k in keys[:-1]:
            node = node.setdefault(k, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {item!r}: '{k}' is not a section")
        node[keys[-1]] = value
    if overrides:
        source += " + overrides"
    cfg = _build(Config, raw, "", source)
    validate(cfg, source)
    return cfg

