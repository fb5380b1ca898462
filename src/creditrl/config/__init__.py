"""The typed configuration (:mod:`.schema`) and its loading from YAML + ``--set`` (:mod:`.loader`).

The bottom layer: it imports nothing else from creditrl. Registry names are checked, and
``auto`` values resolved, when a run is built (:mod:`creditrl.train.build`)."""

from creditrl.config.errors import ConfigError
from creditrl.config.loader import config_hash, load_config, merge, parse_overrides
from creditrl.config.schema import (
    SECTIONS,
    BackendConfig,
    Config,
    CreditConfig,
    HybridConfig,
    LossConfig,
    OptimConfig,
    PolicyConfig,
    PRMConfig,
    RewardConfig,
    RolloutConfig,
    SearchConfig,
    SFTConfig,
    ShapingConfig,
    TaskConfig,
    TrainConfig,
    ValueConfig,
)

__all__ = [
    "SECTIONS",
    "BackendConfig",
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
    "SearchConfig",
    "SFTConfig",
    "ShapingConfig",
    "TaskConfig",
    "TrainConfig",
    "ValueConfig",
    "config_hash",
    "load_config",
    "merge",
    "parse_overrides",
]
