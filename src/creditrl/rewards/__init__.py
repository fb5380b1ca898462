"""Rewards: sources that score spans, placement of the scores into (B, T) tensors, shaping."""

from creditrl.rewards import reward_model as _reward_model  # noqa: F401  (registers "rm:PATH")
from creditrl.rewards import text_metrics as _text_metrics  # noqa: F401  (registers bleu, chrf, rouge)
from creditrl.rewards import unit_tests as _unit_tests  # noqa: F401  (registers "unit_tests")
from creditrl.rewards.functions import function_source
from creditrl.rewards.placement import (
    GRANULARITIES,
    Granularity,
    SegmenterOptions,
    get_granularity,
    make_segmenter,
    place,
    register_granularity,
)
from creditrl.rewards.shaping import add_shaping, kl_penalty, length_penalty, overlong_penalty
from creditrl.rewards.sources import (
    ERROR_POLICIES,
    REWARD_SOURCES,
    SOURCE_FACTORIES,
    RewardSource,
    ScoreResult,
    SourceFactory,
    check_granularity,
    get_source,
    make_source,
    register_source,
    register_source_factory,
    register_source_prefix,
    reward_function,
    score_batch,
    score_value,
    source_names,
)

__all__ = [
    "GRANULARITIES",
    "Granularity",
    "SegmenterOptions",
    "get_granularity",
    "make_segmenter",
    "place",
    "register_granularity",
    "add_shaping",
    "kl_penalty",
    "length_penalty",
    "overlong_penalty",
    "ERROR_POLICIES",
    "REWARD_SOURCES",
    "SOURCE_FACTORIES",
    "RewardSource",
    "ScoreResult",
    "SourceFactory",
    "check_granularity",
    "function_source",
    "get_source",
    "make_source",
    "register_source",
    "register_source_factory",
    "register_source_prefix",
    "reward_function",
    "score_batch",
    "score_value",
    "source_names",
]
