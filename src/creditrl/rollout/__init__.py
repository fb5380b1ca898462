"""Rollout: sampling groups of responses and laying them out as (B, T) tensors with span ends."""

from creditrl.rollout.batch import TrajectoryBatch, batch_from_generation, response_logits, token_logprobs
from creditrl.rollout.segment import (
    KeyPredicate,
    Segmentation,
    SegmentFn,
    TokenTexts,
    after_text,
    block_segmenter,
    key_token_segmenter,
    last_token_segmenter,
    load_callable,
    segment,
    separator_segmenter,
    token_segmenter,
)

__all__ = [
    "TrajectoryBatch",
    "batch_from_generation",
    "response_logits",
    "token_logprobs",
    "KeyPredicate",
    "SegmentFn",
    "Segmentation",
    "TokenTexts",
    "after_text",
    "block_segmenter",
    "key_token_segmenter",
    "last_token_segmenter",
    "load_callable",
    "segment",
    "separator_segmenter",
    "token_segmenter",
]
