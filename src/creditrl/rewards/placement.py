"""Placement: where a reward source's scores land in the (B, T) ``rewards`` tensor.

Every placement has one signature::

    place(scores, *, response_mask, step_ends) -> (rewards, reward_mask)

``scores[b]`` is a list of floats for response b: one score for ``sequence`` (put on the last
valid token), one per step for ``step`` (the k-th score on the k-th ``step_ends`` token).
``reward_mask`` marks where a reward was placed, including a placed 0.0; a ``None`` step score
places nothing (an unlabelled step).
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch

PlacementFn = Callable[..., tuple[torch.Tensor, torch.Tensor]]
PLACEMENTS: dict[str, PlacementFn] = {}


def register_placement(name: str) -> Callable[[PlacementFn], PlacementFn]:
    def deco(fn: PlacementFn) -> PlacementFn:
        if name in PLACEMENTS:
            raise ValueError(f"placement '{name}' is already registered")
        PLACEMENTS[name] = fn
        return fn

    return deco


def place(
    name: str,
    scores: Sequence[Sequence[float | None]],
    *,
    response_mask: torch.Tensor,
    step_ends: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Place ``scores`` with the named placement; see the module docstring."""
    if name not in PLACEMENTS:
        raise ValueError(f"unknown placement '{name}'; valid: {', '.join(sorted(PLACEMENTS))}")
    if response_mask.dtype != torch.bool or response_mask.dim() != 2:
        raise ValueError(f"response_mask must be bool (B, T), got {response_mask.dtype} {tuple(response_mask.shape)}")
    if len(scores) != response_mask.shape[0]:
        raise ValueError(f"got scores for {len(scores)} responses, response_mask has {response_mask.shape[0]} rows")
    return PLACEMENTS[name](scores, response_mask=response_mask, step_ends=step_ends)


def _last_valid(response_mask: torch.Tensor) -> torch.Tensor:
    """Index of the last valid token per row, -1 for an empty row. (B, T) -> (B,)"""
    t = response_mask.shape[1]
    idx = torch.arange(t).expand_as(response_mask)
    return torch.where(response_mask, idx, torch.full_like(idx, -1)).max(dim=1).values


@register_placement("sequence")
def place_sequence(
    scores: Sequence[Sequence[float]], *, response_mask: torch.Tensor, step_ends: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The single score of each response on its last valid token (nothing for an empty row)."""
    rewards = torch.zeros(response_mask.shape, dtype=torch.float32)
    reward_mask = torch.zeros_like(response_mask)
    for b, (s, last) in enumerate(zip(scores, _last_valid(response_mask).tolist())):
        if len(s) != 1:
            raise ValueError(f"sequence placement needs exactly one score per response; row {b} has {len(s)}")
        if last >= 0:
            rewards[b, last] = float(s[0])
            reward_mask[b, last] = True
    return rewards, reward_mask


@register_placement("step")
def place_step(
    scores: Sequence[Sequence[float | None]], *, response_mask: torch.Tensor, step_ends: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Score k of response b on the k-th True of ``step_ends[b]`` (valid tokens only); None skips."""
    if step_ends is None or step_ends.shape != response_mask.shape:
        raise ValueError("step placement needs step_ends with the shape of response_mask (run a segmenter)")
    ends = step_ends & response_mask
    rewards = torch.zeros(response_mask.shape, dtype=torch.float32)
    reward_mask = torch.zeros_like(response_mask)
    for b, s in enumerate(scores):
        cols = ends[b].nonzero().squeeze(-1)
        if len(s) != len(cols):
            raise ValueError(f"row {b}: {len(s)} step scores for {len(cols)} step ends")
        for col, value in zip(cols.tolist(), s):
            if value is not None:
                rewards[b, col] = float(value)
                reward_mask[b, col] = True
    return rewards, reward_mask
