"""The explorers a config switches on, in the fixed order of explore/base.py."""

from __future__ import annotations

from jaxrl_llm.config import Config
from jaxrl_llm.explore.base import Explorer


def build_explorers(cfg: Config) -> list[Explorer]:
    explorers: list[Explorer] = []
    if cfg.explore.e3.enabled:
        from jaxrl_llm.explore.e3 import E3

        explorers.append(E3(cfg.explore.e3))
    if cfg.explore.rrl.enabled:
        from jaxrl_llm.explore.rrl import RRL

        explorers.append(RRL(cfg.explore.rrl))
    if cfg.explore.herl.enabled:
        from jaxrl_llm.explore.herl import HeRL

        explorers.append(HeRL(cfg.explore.herl, instruction=cfg.data.instruction))
    return explorers
