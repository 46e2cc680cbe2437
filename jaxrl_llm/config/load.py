"""Loading a run configuration from YAML with `a.b=c` overrides.

Unknown keys are refused with the closest known names; values are checked against their types and
the choices each field allows, and errors name the file and the dotted key at fault.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import types
import typing
from pathlib import Path
from typing import Any

import yaml

from jaxrl_llm.config.checks import validate
from jaxrl_llm.config.choices import CHOICES, REFUSED
from jaxrl_llm.config.sections import Config, ConfigError


class _Loader(yaml.SafeLoader):
    """YAML as a config means it: numbers as YAML 1.2 reads them (010 is ten, not eight; 1:30 is text, not
    ninety; 1e-3 is a float where YAML 1.1 reads a string), and a key given twice in one mapping is an error
    (PyYAML kept the last one silently: a second `train:` section replaced the first)."""

    yaml_implicit_resolvers = {k: [(tag, rx) for tag, rx in v if tag not in ("tag:yaml.org,2002:int",
                                                                              "tag:yaml.org,2002:float")]
                               for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()}

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"the key {key!r} is given twice",
                                                        key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep)


_Loader.add_implicit_resolver("tag:yaml.org,2002:int", re.compile(r"^[-+]?[0-9]+$"), list("-+0123456789"))
_Loader.add_constructor("tag:yaml.org,2002:int", lambda loader, node: int(loader.construct_scalar(node), 10))
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
               r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"),
    list("-+0123456789."))


def _yaml(text: str):
    return yaml.load(text, Loader=_Loader)  # noqa: S506 (a SafeLoader)


def _field_type(keys: list[str]):
    """The declared type of the config field at dotted `keys` (None: not a field, or inside a dict field)."""
    cls = Config
    for i, key in enumerate(keys):
        if not dataclasses.is_dataclass(cls):
            return None
        hints = typing.get_type_hints(cls)
        if key not in hints:
            return None
        cls = hints[key]
    return cls


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
            kwargs[key] = _build(typ, {} if value is None else value, dotted, source)  # `explore.e3=false` refused
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
    keys = key.strip().split(".")
    if _field_type(keys) is str:  # text as written: YAML would cut it at ' #' or read 'Answer: x' as a mapping
        if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":  # a quoted YAML scalar: its text
            try:
                value = _yaml(text)
            except yaml.YAMLError:
                value = None
            if isinstance(value, str):
                return keys, value
        return keys, text
    try:
        return keys, _yaml(text) if text != "" else ""
    except yaml.YAMLError:  # prose that is no YAML (a multi-line template): the text itself; typed fields check it
        return keys, text


def load_config(path: str | Path | None = None, overrides: list[str] = ()) -> Config:
    raw: dict = {}
    source = "defaults"
    if path is not None:
        source = str(path)
        try:
            raw = _yaml(Path(path).read_text())
        except FileNotFoundError:
            raise ConfigError(f"{path}: no such config file") from None
        except IsADirectoryError:
            raise ConfigError(f"{path}: is a folder, not a config file") from None
        except UnicodeDecodeError as e:
            raise ConfigError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
        except yaml.YAMLError as e:
            raise ConfigError(f"{path}: invalid YAML: {e}") from None
        if raw is None:  # an empty file: every default
            raw = {}
        if not isinstance(raw, dict):
            raise ConfigError(f"{path}: a config is a mapping of sections (model:, data:, ...), got "
                              f"{type(raw).__name__} {raw!r:.60}")
    for item in overrides:
        keys, value = _parse_override(item)
        node = raw
        for k in keys[:-1]:
            if node.get(k) is None:  # absent, or a section left empty in the file
                node[k] = {}
            node = node[k]
            if not isinstance(node, dict):
                raise ConfigError(f"override {item!r}: '{k}' is not a section")
        node[keys[-1]] = value
    if overrides:
        source += " + overrides"
    cfg = _build(Config, raw, "", source)
    validate(cfg, source)
    return _expand_home(cfg)


def _expand_home(cfg: Config) -> Config:
    """`~` in the run's paths is the user's home (a shell leaves `train.out_dir=~/runs/x` as it is; a folder named
    `~` in the working directory was made)."""
    def home(p: str) -> str:
        return str(Path(p).expanduser()) if p.startswith("~") else p

    return dataclasses.replace(
        cfg, train=dataclasses.replace(cfg.train, out_dir=home(cfg.train.out_dir)),
        data=dataclasses.replace(cfg.data, path=home(cfg.data.path), eval_path=home(cfg.data.eval_path),
                                 sft_path=home(cfg.data.sft_path)))

