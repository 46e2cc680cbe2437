"""The syntax of reward.functions entries ("module:function", "path/to/file.py:function", or {name, weight}),
checked when the config loads and nothing imported (rewards/functions.py imports and calls them)."""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Mapping, Sequence

# a component name reserved for the built-in scorer's reward in metrics (reward/builtin)
BUILTIN = "builtin"
_ATTR = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
_MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
_KEYS = ("name", "weight")
# The largest magnitude a reward function may return, and a weight may have. Rewards are float32 in the update and
# their group statistics square them: past ~1e19 a square is inf and the group's advantages NaN, which skips the
# whole step; 1e6 leaves room for any sum of weighted components (a value past it scores 0, counted as a failure).
LIMIT = 1e6


@dataclasses.dataclass(frozen=True)
class RewardFn:
    """One reward.functions entry. `module` or `path` (absolute once resolved) names where `attr` lives; `name`:
    the component a float result is logged as (the function's name); `root`: the working directory it was
    resolved in (searched for modules after the Python path)."""

    label: str  # "reward.functions[i] ('spec')", for messages
    spec: str
    module: str
    path: str
    attr: str
    weight: float
    root: str = ""

    @property
    def name(self) -> str:
        return self.attr.rsplit(".", 1)[-1]


def parse(entries: Sequence) -> tuple[RewardFn, ...]:
    """The entries' shape checked, nothing imported; ValueError naming the entry at fault."""
    if not isinstance(entries, (list, tuple)):
        raise ValueError(f"reward.functions must be a list of entries, got {entries!r}")
    out, names = [], {}
    for i, entry in enumerate(entries):
        where = f"reward.functions[{i}]"
        weight = 1.0
        if isinstance(entry, Mapping):
            unknown = sorted(set(entry) - set(_KEYS))
            if unknown or "name" not in entry:
                raise ValueError(f"{where} ({dict(entry)!r}): a mapping takes the keys {list(_KEYS)} with 'name' "
                                 f"required" + (f"; unknown: {unknown}" if unknown else ""))
            weight = entry.get("weight", 1.0)
            if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not abs(weight) <= LIMIT:
                raise ValueError(f"{where} ({entry['name']!r}): weight must be a number in [-{LIMIT:g}, {LIMIT:g}], "
                                 f"got {weight!r:.80}")
            entry = entry["name"]
        if not isinstance(entry, str) or ":" not in entry:
            raise ValueError(f"{where} ({entry!r}) must be 'module:function' or 'path/to/file.py:function'")
        where = f"{where} ({entry!r})"
        place, attr = (s.strip() for s in entry.rsplit(":", 1))
        if not _ATTR.fullmatch(attr):
            raise ValueError(f"{where}: {attr!r} is not a function name")
        is_file = place.endswith(".py") or "/" in place or os.sep in place
        if not place or (not is_file and not _MODULE.fullmatch(place)):
            raise ValueError(f"{where}: {place!r} is neither a module name nor a .py file")
        fn = RewardFn(where, entry, "" if is_file else place, place if is_file else "", attr, float(weight))
        if fn.name == BUILTIN:
            raise ValueError(f"{where}: the name {BUILTIN!r} is the built-in scorer's component; rename the function")
        if fn.name in names:
            raise ValueError(f"{where}: a second function named {fn.name!r} (also {names[fn.name]}): components are "
                             f"logged by function name, so rename one")
        names[fn.name] = where
        out.append(fn)
    return tuple(out)
