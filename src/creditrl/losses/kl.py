"""KL between the policy and a reference policy from sampled tokens (Schulman, "Approximating
KL divergence", 2020). With ``log_ratio = logp - ref_logp`` on tokens sampled from the policy:

- ``k1 = log_ratio`` (unbiased, high variance, can be negative);
- ``k2 = log_ratio**2 / 2`` (biased, low variance);
- ``k3 = exp(-log_ratio) - 1 + log_ratio`` (unbiased, always >= 0; GRPO's choice).
"""

from __future__ import annotations

import typing

import torch

from creditrl.config.types import KLEstimator

KL_ESTIMATORS = typing.get_args(KLEstimator)


def kl_estimate(logp: torch.Tensor, ref_logp: torch.Tensor, kind: str = "k3") -> torch.Tensor:
    """Per-token KL(pi || pi_ref) estimate, (B, T) -> (B, T)."""
    log_ratio = logp - ref_logp
    if kind == "k1":
        return log_ratio
    if kind == "k2":
        return 0.5 * log_ratio**2
    if kind == "k3":
        # clamp only guards exp() against overflow on wildly off-policy tokens
        return torch.exp(-log_ratio.clamp(-20.0, 20.0)) - 1.0 + log_ratio
    raise ValueError(f"unknown KL estimator '{kind}'; valid: {', '.join(KL_ESTIMATORS)}")
