"""Critic losses and diagnostics: the clipped value loss and explained variance.

The value loss follows PPO2 / verl (``compute_value_loss``): the new value may move at most
``clip_eps`` away from the value at rollout time, and the larger of the two squared errors is
kept, so the clip can only make the loss more pessimistic:

    V_clip = old + clamp(V - old, -clip_eps, clip_eps)
    loss   = 0.5 * max((V - R)^2, (V_clip - R)^2)          (0.5 * (V - R)^2 when clip_eps is None)

All tensors are float (B, T) with a bool (B, T) ``mask``; the per-token loss is 0 where ``mask``
is 0 and is reduced by :func:`creditrl.losses.aggregate.aggregate`.
"""

from __future__ import annotations

import torch
from torch import Tensor


def _clipped(values: Tensor, old_values: Tensor, clip_eps: float) -> Tensor:
    return old_values + (values - old_values).clamp(-clip_eps, clip_eps)


def clipped_value_loss(
    values: Tensor, old_values: Tensor, returns: Tensor, mask: Tensor, *, clip_eps: float | None
) -> Tensor:
    """Per-token clipped value loss (B, T) (formula in the module docstring); 0 where ``mask``
    is False, and masked entries get no gradient even when they hold inf or NaN."""
    # Zero masked entries before any arithmetic: where() alone would pass NaN * 0 gradients.
    values = torch.where(mask, values, 0)
    old_values = torch.where(mask, old_values, 0)
    returns = torch.where(mask, returns, 0)
    loss = (values - returns).square()
    if clip_eps is not None:
        loss = torch.maximum(loss, (_clipped(values, old_values, clip_eps) - returns).square())
    return torch.where(mask, 0.5 * loss, 0)


def value_clipfrac(
    values: Tensor, old_values: Tensor, returns: Tensor, mask: Tensor, *, clip_eps: float | None
) -> float:
    """Share of valid tokens whose clipped squared error is strictly larger than the unclipped
    one, i.e. where the clip decides the loss (verl's ``vf_clipfrac``); 0.0 when clip_eps is
    None or no token is valid."""
    if clip_eps is None:
        return 0.0
    with torch.no_grad():
        unclipped = (values - returns).square()
        clipped = (_clipped(values, old_values, clip_eps) - returns).square()
        hits = ((clipped > unclipped) & mask).sum()
        return float(hits / mask.sum().clamp(min=1))


def explained_variance(values: Tensor, returns: Tensor, mask: Tensor) -> float:
    """``1 - Var(R - V) / Var(R)`` over the valid tokens: 1 for a perfect critic, 0 for one that
    predicts the mean return, negative for one worse than that.

    Defined as 0.0 (never NaN) when the returns do not vary: fewer than two valid tokens, or a
    spread of the returns no larger than the float32 rounding of a sum along the response, where
    the ratio would be rounding noise. Returns ``A + V`` at lambda 1 are the rewards to go plus the
    rounding of ``T`` accumulated TD errors, so the bound is ``max(1e-6, T eps32)`` of the largest
    return or value, ``T`` the tokens per row (``mask``'s last dimension): with no reward in a
    batch of 860-token responses, a spread of about 1e-6 of the values is rounding, not a return.
    """
    with torch.no_grad():
        r = returns[mask].double()
        v = values[mask].double()
        if r.numel() < 2:
            return 0.0
        scale = max(float(r.abs().max()), float(v.abs().max()))
        rounding = max(1e-6, mask.shape[-1] * torch.finfo(torch.float32).eps)
        if float(r.max() - r.min()) <= rounding * scale:
            return 0.0
        return float(1.0 - (r - v).var() / r.var())
