"""Typed configs (:mod:`.schema`), YAML + ``--set`` loading (:mod:`.loader`) and validation of
names, ranges and combinations (:mod:`.validate`)."""

from creditrl.config.loader import config_hash, load_config, merge, parse_overrides
from creditrl.config.schema import (
    Config,
    ConfigError,
    CreditConfig,
    HybridConfig,
    LossConfig,
    OptimConfig,
    PolicyConfig,
    PRMConfig,
    RewardConfig,
    RolloutConfig,
    SFTConfig,
    ShapingConfig,
    TaskConfig,
    TrainConfig,
    ValueConfig,
)
from creditrl.config.validate import validate

__all__ = [
    "Config",
    "ConfigError",
    "CreditConfig",
    "HybridConfig",
    "LossConfig",
    "OptimConfig",
    "PolicyConfig",
    "PRMConfig",
    "RewardConfig",
    "RolloutConfig",
    "SFTConfig",
    "ShapingConfig",
    "TaskConfig",
    "TrainConfig",
    "ValueConfig",
    "config_hash",
    "load_config",
    "merge",
    "parse_overrides",
    "validate",
]
