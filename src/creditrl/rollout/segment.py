"""Segmenters: find reasoning steps in generated token sequences (``step_ends``).

A step ends on the token whose text contains the separator (e.g. ``;``); the last valid token
of a response always ends its final step. Segment texts are returned alongside, decoded without
special tokens, so a step checker judges exactly the spans that rewards will land on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch
from transformers import PreTrainedTokenizerBase

# A user segmenter maps the per-token texts of one response to the indices of step-end tokens.
SegmentFn = Callable[[Sequence[str]], list[int]]


@dataclass
class Segmentation:
    step_ends: torch.Tensor  # bool (B, T)
    ends: list[list[int]]  # per response, indices of step-end tokens (ascending)
    texts: list[list[str]]  # per response, the text of each step


class TokenTexts:
    """Cached per-id decoding (special tokens decode to the empty string)."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self.tokenizer = tokenizer
        self.special = set(tokenizer.all_special_ids)
        self._cache: dict[int, str] = {}

    def __call__(self, token_id: int) -> str:
        text = self._cache.get(token_id)
        if text is None:
            text = "" if token_id in self.special else self.tokenizer.decode([token_id])
            self._cache[token_id] = text
        return text


def separator_segmenter(separator: str) -> SegmentFn:
    """Step ends = tokens whose text contains ``separator``."""
    if not separator:
        raise ValueError("separator must be a non-empty string")
    return lambda texts: [i for i, t in enumerate(texts) if separator in t]


def segment(
    response_ids: torch.Tensor,
    response_lengths: torch.Tensor,
    texts_of: TokenTexts,
    segment_fn: SegmentFn,
) -> Segmentation:
    """Split every response (B, T) into steps; the last valid token always closes a step."""
    b, t = response_ids.shape
    step_ends = torch.zeros((b, t), dtype=torch.bool)
    all_ends: list[list[int]] = []
    all_texts: list[list[str]] = []
    for row, length in zip(response_ids.tolist(), response_lengths.tolist()):
        tok_texts = [texts_of(i) for i in row[:length]]
        ends = sorted({e for e in segment_fn(tok_texts) if 0 <= e < length})
        if length and (not ends or ends[-1] != length - 1):
            ends.append(length - 1)
        starts = [0] + [e + 1 for e in ends[:-1]]
        all_ends.append(ends)
        all_texts.append(["".join(tok_texts[s : e + 1]) for s, e in zip(starts, ends)])
    for i, ends in enumerate(all_ends):
        if ends:
            step_ends[i, ends] = True
    return Segmentation(step_ends=step_ends, ends=all_ends, texts=all_texts)
