"""PPO clipped surrogate on token-level importance ratios (Schulman et al. 2017).

``ratio = exp(logp - old_logp)``; per token
``loss = -min(ratio * A, clip(ratio, 1 - eps_low, 1 + eps_high) * A)``.
With ``dual_clip = c > 1`` (Ye et al. 2020) the loss of a negative-advantage token is further
bounded by ``-c * A``. Returns the per-token loss for :func:`creditrl.losses.aggregate.aggregate`
and the diagnostics every run logs (clip fraction, approximate KL to the old policy).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class PolicyLossStats:
    clipfrac: float  # share of valid tokens whose ratio was clipped
    approx_kl: float  # mean of k3(old || new) over valid tokens
    ratio_max: float


def ppo_clip_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_eps: float = 0.2,
    clip_eps_high: float | None = None,
    dual_clip: float | None = None,
) -> tuple[torch.Tensor, PolicyLossStats]:
    """Per-token PPO-clip loss (B, T); 0 where ``mask`` is False."""
    high = clip_eps if clip_eps_high is None else clip_eps_high
    log_ratio = (logp - old_logp).masked_fill(~mask, 0.0)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_eps, 1.0 + high)
    loss = torch.maximum(unclipped, clipped)
    if dual_clip is not None:
        loss = torch.where(advantages < 0, torch.minimum(loss, -advantages * dual_clip), loss)
    loss = loss.masked_fill(~mask, 0.0)
    with torch.no_grad():
        n = mask.sum().clamp(min=1)
        stats = PolicyLossStats(
            clipfrac=float(((clipped > unclipped) & mask).sum() / n),
            approx_kl=float(((torch.exp(-log_ratio) - 1 + log_ratio) * mask).sum() / n),
            ratio_max=float(ratio.masked_fill(~mask, 0.0).max()) if mask.any() else 1.0,
        )
    return loss, stats
