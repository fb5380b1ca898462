"""Rollout: sampling groups of responses and laying them out as (B, T) tensors with step ends."""

from creditrl.rollout.batch import TrajectoryBatch, batch_from_generation, response_logits, token_logprobs
from creditrl.rollout.segment import Segmentation, TokenTexts, segment, separator_segmenter

__all__ = [
    "TrajectoryBatch",
    "batch_from_generation",
    "response_logits",
    "token_logprobs",
    "Segmentation",
    "TokenTexts",
    "segment",
    "separator_segmenter",
]
