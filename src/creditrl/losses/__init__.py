"""Losses: the PPO policy surrogate, KL estimators and loss aggregation modes."""

from creditrl.losses.aggregate import AGGREGATIONS, aggregate
from creditrl.losses.kl import KL_ESTIMATORS, kl_estimate
from creditrl.losses.policy import PolicyLossStats, ppo_clip_loss

__all__ = ["AGGREGATIONS", "aggregate", "KL_ESTIMATORS", "kl_estimate", "PolicyLossStats", "ppo_clip_loss"]
