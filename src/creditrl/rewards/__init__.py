"""Rewards: sources that score responses, and placement of the scores into (B, T) tensors."""

from creditrl.rewards.placement import PLACEMENTS, place, register_placement
from creditrl.rewards.sources import REWARD_SOURCES, RewardSource, get_source, register_source, score_batch

__all__ = [
    "PLACEMENTS",
    "place",
    "register_placement",
    "REWARD_SOURCES",
    "RewardSource",
    "get_source",
    "register_source",
    "score_batch",
]
