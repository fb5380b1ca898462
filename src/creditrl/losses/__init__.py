"""Losses: the PPO policy surrogate, KL estimators, the critic's value loss and loss aggregation
modes."""

from creditrl.losses.aggregate import AGGREGATIONS, aggregate, aggregation_count
from creditrl.losses.kl import KL_ESTIMATORS, kl_estimate
from creditrl.losses.policy import PolicyLossStats, ppo_clip_loss
from creditrl.losses.value import clipped_value_loss, explained_variance, value_clipfrac

__all__ = [
    "AGGREGATIONS",
    "aggregate",
    "aggregation_count",
    "KL_ESTIMATORS",
    "kl_estimate",
    "PolicyLossStats",
    "ppo_clip_loss",
    "clipped_value_loss",
    "explained_variance",
    "value_clipfrac",
]
