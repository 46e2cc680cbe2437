"""Reward functions written by the user (`reward.functions`): resolved in the trainer, run in the reward pool.

An entry is "module:function", "path/to/file.py:function" (relative to the working directory), or a mapping
{name: "module:function", weight: 1.0}. The function is called once per response as

    f(prompt: str, completion: str, item: dict) -> float | dict[str, float]

`prompt`: the task's question as the user message (data.instruction appended, no chat template); `completion`:
the response as scored (a replayed row's given prefix included); `item`: {"question", "answer", **the row's other
columns} (TaskItem.extra). A float is one component named after the function; a dict gives named components
(e.g. {"correct": 1.0, "format": 0.5}). The entry's term is weight x the sum of its components.

Every entry is imported and its signature checked in the trainer before the pool starts (`resolve`: an error
names the entry), and again in each worker at its start (`load`), beside the built-in scorers. A call that
raises, returns something other than a finite number or a mapping of names to finite numbers, runs past
reward.timeout_s or exceeds the sandbox's limits scores 0 for that term; the pool counts it and keeps its text.
Module names are looked up on the Python path, then in the working directory; a file's folder is added to the
path (after everything else) so the file can import its neighbours.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import importlib.util
import inspect
import json
import numbers
import os
import sys
from typing import Callable, Mapping, Sequence

from jaxrl_llm.config.reward_entries import BUILTIN, LIMIT, RewardFn, parse  # noqa: F401 (parse: this module's API)
from jaxrl_llm.rewards.types import Score


def import_module_or_file(place: str, *, is_file: bool, root: str = ""):
    """The module named `place`, or the Python file at `place` (one module per file, named after its path, so two
    files called rewards.py do not collide; its folder goes on the path, after everything else, so it can import
    its neighbours), imported in this process. `root`: a folder searched for modules after the Python path.
    FileNotFoundError for a missing file; whatever the import itself raises."""
    if not is_file:
        if root and root not in sys.path:
            sys.path.append(root)
        return importlib.import_module(place)
    if not os.path.isfile(place):
        raise FileNotFoundError(f"no such file {place}")
    name = f"_jaxrl_user_{hashlib.blake2b(os.path.abspath(place).encode(), digest_size=6).hexdigest()}"
    module = sys.modules.get(name)
    if module is None:
        folder = os.path.dirname(os.path.abspath(place))
        if folder not in sys.path:
            sys.path.append(folder)
        spec = importlib.util.spec_from_file_location(name, place)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[name]
            raise
    return module


def import_callable(fn: RewardFn) -> Callable:
    """The function `fn` names, imported in this process; ValueError naming the entry when it cannot be."""
    try:
        module = import_module_or_file(fn.path or fn.module, is_file=bool(fn.path), root=fn.root)
    except (Exception, SystemExit) as e:  # a broken user module: its error, on one line, naming the entry
        raise ValueError(f"{fn.label}: cannot import {fn.path or fn.module!r}: {type(e).__name__}: {e}") from None
    target = module
    for part in fn.attr.split("."):
        if not hasattr(target, part):
            raise ValueError(f"{fn.label}: {fn.path or fn.module!r} has no attribute {fn.attr!r}")
        target = getattr(target, part)
    if not callable(target):
        raise ValueError(f"{fn.label}: {fn.attr!r} is a {type(target).__name__}, not a function")
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):  # some builtins have none: called as they are
        return target
    try:
        signature.bind("prompt", "completion", {})
    except TypeError as e:
        raise ValueError(f"{fn.label}: {fn.attr}{signature} cannot be called as f(prompt, completion, item): "
                         f"{e}") from None
    return target


def resolve(entries: Sequence, root: str | None = None) -> tuple[RewardFn, ...]:
    """`parse`d entries with file paths made absolute (against `root`, default the working directory) and each
    function imported and its signature checked here, so a bad entry stops the run before any worker starts."""
    root = os.path.abspath(root or os.getcwd())
    fns = tuple(dataclasses.replace(f, path=os.path.normpath(os.path.join(root, f.path)) if f.path else "",
                                    root=root) for f in parse(entries))
    for f in fns:
        import_callable(f)
    return fns


_LOADED: list[tuple[RewardFn, Callable]] = []  # this worker's functions, by entry index


def load(fns: Sequence[RewardFn]) -> None:
    """Import `fns` in a reward worker (at its start, beside the built-in scorers)."""
    _LOADED[:] = [(f, import_callable(f)) for f in fns]


def components(fn: RewardFn, value) -> dict[str, float]:
    """A function's result as named components; TypeError / ValueError naming it for anything else."""
    def number(v, what: str) -> float:
        if not isinstance(v, numbers.Real):
            raise TypeError(f"{fn.label} returned {what}{type(v).__name__} {v!r:.80}, not a number")
        if not abs(v) <= LIMIT:  # NaN, inf, and ints past float's range (compared exactly, no OverflowError)
            raise ValueError(f"{fn.label} returned {what}{v!r:.80}, not a finite number in [-{LIMIT:g}, {LIMIT:g}] "
                             f"(reward.functions: rewards are float32 and their group statistics square them)")
        return float(v)

    if isinstance(value, Mapping):
        if not value:
            raise ValueError(f"{fn.label} returned an empty mapping")
        bad = [k for k in value if not isinstance(k, str) or not k or k == BUILTIN]
        if bad:
            raise TypeError(f"{fn.label} returned the component name {bad[0]!r}: names are non-empty strings other "
                            f"than {BUILTIN!r}")
        return {k: number(v, f"component {k!r} = ") for k, v in value.items()}
    return {fn.name: number(value, "")}


def call(index: int, prompt: str, completion: str, question: str, answer: str, extra: str) -> Score:
    """Run loaded function `index` on one response (a pool job): its components."""
    fn, f = _LOADED[index]
    item = {"question": question, "answer": answer, **(json.loads(extra) if extra else {})}
    try:
        value = f(prompt, completion, item)
    except (MemoryError, KeyboardInterrupt, SystemExit):  # the pool counts these by their kind
        raise
    except Exception as e:
        raise RuntimeError(f"{fn.label} raised {type(e).__name__}: {e}") from None
    return Score.of_components(components(fn, value))
