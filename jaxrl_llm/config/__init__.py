"""Run configuration: frozen dataclasses, one per concern (sections.py), loaded from YAML with `a.b=c` overrides
(load.py), the values each field may take (choices.py), the checks across fields (checks.py) and the syntax of
reward.functions entries (reward_entries.py).

Unknown keys are refused with the closest known names; values are checked against their types and the choices
each field allows, and errors name the file and the dotted key at fault.
"""

from jaxrl_llm.config.choices import CHOICES, REFUSED
from jaxrl_llm.config.load import load_config
from jaxrl_llm.config.sections import (REVISE_TEMPLATE, AlgoSection, Config, ConfigError, DataSection, E3Section,
                                       EvalSection, ExploreSection, HeRLSection, LoggingSection, MeshSection,
                                       ModelSection, OptimSection, RewardSection, RolloutSection, RRLSection,
                                       SFTSection, TrainSection, is_key)

__all__ = ["CHOICES", "REFUSED", "REVISE_TEMPLATE", "AlgoSection", "Config", "ConfigError", "DataSection",
           "E3Section", "EvalSection", "ExploreSection", "HeRLSection", "LoggingSection", "MeshSection",
           "ModelSection", "OptimSection", "RewardSection", "RolloutSection", "RRLSection", "SFTSection",
           "TrainSection", "is_key", "load_config"]
