"""Placement: where a reward source's scores land in the (B, T) ``rewards`` tensor.

A *granularity* names how a response is cut into spans; every span's score lands on the span's
last token. The granularities differ only in their segmenter (see
:mod:`creditrl.rollout.segment`), so ONE placement function serves them all:

===========  ==========================================================  ======================
granularity  span ends (the tokens scores land on)                       options
===========  ==========================================================  ======================
sequence     the last valid token: one span, the whole response          --
step         tokens containing the step separator (e.g. ``;``), or the   step_separator, cut_fn
             ends a user cut function returns
segment      every K-th token (fixed blocks of K), or a user cut         segment_tokens, cut_fn
             function
token        every token                                                 --
key_token    tokens matching a predicate (default: the token after       key_after, key_fn
             ``=``); the sequence score is the fallback on the last
             token when no score lands there
===========  ==========================================================  ======================

The last valid token always closes the final span (:func:`creditrl.rollout.segment.segment`),
so every granularity can put something on it. ``reward_mask`` marks where a reward was placed,
including a placed 0.0; a ``None`` score places nothing (an unlabelled span).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from creditrl.rollout.segment import (
    SegmentFn,
    after_text,
    block_segmenter,
    key_token_segmenter,
    last_token_segmenter,
    load_callable,
    separator_segmenter,
    token_segmenter,
)


@dataclass(frozen=True)
class SegmenterOptions:
    """What a granularity may need to build its segmenter (each uses only its own fields)."""

    step_separator: str | None = None  # step: span ends on tokens containing it (the task's)
    cut_fn: str | None = None  # step / segment: "package.module:function", a SegmentFn
    segment_tokens: int = 8  # segment: block size K in tokens
    key_after: str = "="  # key_token: key token = the token after one ending with this text
    key_fn: str | None = None  # key_token: "package.module:function", a (texts, i) -> bool


SegmenterBuilder = Callable[[SegmenterOptions], SegmentFn]


@dataclass(frozen=True)
class Granularity:
    name: str
    build: SegmenterBuilder  # options -> the segmenter whose span ends the scores land on
    uses_fallback: bool  # place() should get the sequence score as fallback for the last token
    doc: str


GRANULARITIES: dict[str, Granularity] = {}


def register_granularity(name: str, *, uses_fallback: bool = False) -> Callable[[SegmenterBuilder], SegmenterBuilder]:
    """Decorator registering a segmenter builder as granularity ``name`` (duplicates rejected)."""

    def deco(build: SegmenterBuilder) -> SegmenterBuilder:
        if name in GRANULARITIES:
            raise ValueError(f"granularity '{name}' is already registered")
        GRANULARITIES[name] = Granularity(name, build, uses_fallback, (build.__doc__ or "").strip())
        return build

    return deco


def get_granularity(name: str) -> Granularity:
    if name not in GRANULARITIES:
        raise ValueError(f"unknown granularity '{name}'; valid: {', '.join(sorted(GRANULARITIES))}")
    return GRANULARITIES[name]


def make_segmenter(granularity: str, **options: Any) -> SegmentFn:
    """The segmenter of ``granularity`` built from the keyword ``options``, the fields of
    :class:`SegmenterOptions` (TypeError for any other)."""
    return get_granularity(granularity).build(SegmenterOptions(**options))


@register_granularity("sequence")
def _sequence(opts: SegmenterOptions) -> SegmentFn:
    """One span, the whole response: its score lands on the last valid token."""
    return last_token_segmenter()


@register_granularity("step")
def _step(opts: SegmenterOptions) -> SegmentFn:
    """Reasoning steps: a span ends on each token containing the separator (or where cut_fn says)."""
    if opts.cut_fn:
        return load_callable(opts.cut_fn)
    if opts.step_separator:
        return separator_segmenter(opts.step_separator)
    raise ValueError(
        "step granularity needs a separator (the task's step_separator) or a cut function "
        "(cut_fn='package.module:function'); got neither"
    )


@register_granularity("segment")
def _segment(opts: SegmenterOptions) -> SegmentFn:
    """Fixed blocks of segment_tokens tokens (or the spans of a user cut_fn)."""
    if opts.cut_fn:
        return load_callable(opts.cut_fn)
    if opts.segment_tokens < 1:
        raise ValueError(f"segment granularity needs segment_tokens >= 1, got {opts.segment_tokens}")
    return block_segmenter(opts.segment_tokens)


@register_granularity("token")
def _token(opts: SegmenterOptions) -> SegmentFn:
    """Every token is a span: a score on every token."""
    return token_segmenter()


@register_granularity("key_token", uses_fallback=True)
def _key_token(opts: SegmenterOptions) -> SegmentFn:
    """Spans end on key tokens (key_fn, or the token after key_after); sequence score as fallback."""
    return key_token_segmenter(load_callable(opts.key_fn) if opts.key_fn else after_text(opts.key_after))


def _check_bool_2d(name: str, mask: torch.Tensor, shape: torch.Size | None = None) -> None:
    if mask.dtype != torch.bool or mask.dim() != 2 or (shape is not None and mask.shape != shape):
        want = "(B, T)" if shape is None else str(tuple(shape))
        raise ValueError(f"{name} must be bool {want}, got {mask.dtype} {tuple(mask.shape)}")


def _last_valid(response_mask: torch.Tensor) -> torch.Tensor:
    """Index of the last valid token per row, -1 for an empty row. (B, T) -> (B,)"""
    t = response_mask.shape[1]
    idx = torch.arange(t, device=response_mask.device).expand_as(response_mask)
    return torch.where(response_mask, idx, torch.full_like(idx, -1)).max(dim=1).values


def place(
    scores: Sequence[Sequence[float | None]],
    *,
    end_mask: torch.Tensor,
    response_mask: torch.Tensor,
    fallback: Sequence[float | None] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Put span scores on span-end tokens: ``(rewards float32 (B, T), reward_mask bool (B, T))``.

    Score k of row b lands on the k-th True of ``end_mask[b] & response_mask[b]`` (span ends on
    masked tokens are ignored); row b must have exactly that many scores. A ``None`` score
    places nothing. ``fallback`` (B values, a ``None`` entry meaning none for that row) is
    placed on a row's last valid token when no score landed there: the sequence score of the
    ``key_token`` granularity. Nothing is ever placed outside ``response_mask``.

    end_mask, response_mask bool (B, T); ``len(scores) == B``.
    """
    _check_bool_2d("response_mask", response_mask)
    _check_bool_2d("end_mask", end_mask, response_mask.shape)
    n_rows = response_mask.shape[0]
    if len(scores) != n_rows:
        raise ValueError(f"got scores for {len(scores)} responses, response_mask has {n_rows} rows")
    if fallback is not None and len(fallback) != n_rows:
        raise ValueError(f"got {len(fallback)} fallback scores, response_mask has {n_rows} rows")
    ends = end_mask & response_mask
    for b, (row, n_ends) in enumerate(zip(scores, ends.sum(dim=1).tolist())):
        if len(row) != n_ends:
            raise ValueError(f"row {b}: {len(row)} scores for {n_ends} span ends")
    device = response_mask.device
    rows, cols = ends.nonzero(as_tuple=True)  # row-major: each row's ends in ascending order
    flat = [x for row in scores for x in row]
    given = torch.tensor([x is not None for x in flat], dtype=torch.bool, device=device)
    values = torch.tensor([0.0 if x is None else float(x) for x in flat], dtype=torch.float32, device=device)
    rewards = torch.zeros(response_mask.shape, dtype=torch.float32, device=device)
    reward_mask = torch.zeros_like(response_mask)
    rewards[rows[given], cols[given]] = values[given]
    reward_mask[rows[given], cols[given]] = True
    if fallback is not None:
        last = _last_valid(response_mask)  # (B,)
        has = torch.tensor([f is not None for f in fallback], dtype=torch.bool, device=device)
        fb = torch.tensor([0.0 if f is None else float(f) for f in fallback], dtype=torch.float32, device=device)
        b_idx = torch.arange(n_rows, device=device)
        free = has & (last >= 0) & ~reward_mask[b_idx, last.clamp(min=0)]  # (B,)
        rewards[b_idx[free], last[free]] = fb[free]
        reward_mask[b_idx[free], last[free]] = True
    return rewards, reward_mask
