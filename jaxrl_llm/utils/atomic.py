"""A folder that appears whole or not at all: written beside its place under a hidden name, then renamed into it.

A run's `final/` export is what `already_complete` trusts once `final/config.json` exists; written in place, a kill
between the weights and the config (or a second export over a first, after `train.steps` was raised) left a folder
that looked complete and was not, and no rerun repaired it. Here the new folder replaces the old one by rename:
at any moment `final/` is the old folder whole or the new one whole (the window between the two renames leaves
no `final/`, which a rerun exports again).
"""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path


@contextlib.contextmanager
def atomic_folder(target: str | Path):
    """Yield a fresh empty folder beside `target`; on success it replaces `target` (a file or folder there is
    removed), on an exception it is removed and `target` is left as it was."""
    target = Path(target)
    partial, old = (target.with_name(f".{target.name}.{tag}") for tag in ("partial", "old"))
    for leftover in (partial, old):  # from a process killed here before
        shutil.rmtree(leftover, ignore_errors=True)
    partial.mkdir(parents=True)
    try:
        yield partial
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    if target.is_dir() and not target.is_symlink():
        target.rename(old)
    elif target.exists() or target.is_symlink():
        target.unlink()
    partial.rename(target)
    shutil.rmtree(old, ignore_errors=True)
