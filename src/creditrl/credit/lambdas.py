"""The GAE lambdas of long outputs: length-adaptive for the policy, decoupled for the critic.

PPO's per-token GAE with lambda = 0.95 looks about 1 / (1 - 0.95) = 20 tokens ahead: on a
500-token answer rewarded only at its end the advantage of the early tokens is mostly the
critic's (biased) bootstrap, 0.95^500 ~ 7e-12 of the outcome reaches the first token.

- **Decoupled lambda** (VC-PPO, Yuan et al., 2025, arXiv:2503.01491): the critic's
  targets use their own lambda, ``returns = A(lam_critic) + V`` with ``lam_critic = 1`` (the
  Monte-Carlo return, no bootstrap bias in what the critic learns), while the policy's
  advantages keep a lower lambda for less variance. Config: ``credit.lam_critic``.
- **Length-adaptive lambda** (VAPO, Yue et al., 2025, arXiv:2504.05118): response b of
  length l_b gets ``lam_b = 1 - 1 / (alpha * l_b)``, so that the sum of the GAE weights,
  1 / (1 - lam_b) = alpha * l_b, grows in proportion to the length: a short answer bootstraps
  more, a long one leans on the sampled return. VAPO uses alpha = 0.05. Config:
  ``credit.lam_alpha``.

Both apply wherever GAE runs; :func:`creditrl.credit.estimate_at` takes them as ``lam_critic``
and ``lam_alpha``.
"""

import torch
from torch import Tensor


def length_adaptive_lam(lengths: Tensor, alpha: float) -> Tensor:
    """VAPO's per-response lambda: ``lam_b = clamp(1 - 1 / (alpha * l_b), 0, 1)``.

    lengths long or float (B,), l_b the response's length in credit time steps (its valid tokens
    at token resolution, its steps at step resolution); alpha > 0 -> lam float64 (B,). The clamp
    keeps lambda a weight: responses with ``alpha * l_b <= 1`` (shorter than 1 / alpha = 20 steps
    at alpha 0.05) get lambda 0, the one-step TD error, where the formula would go negative, and
    an empty response (l_b = 0) gets 0 too. Lambda reaches 1 only in the limit of long responses.
    """
    if not isinstance(lengths, Tensor) or lengths.dim() != 1:
        raise ValueError(f"lengths must be a tensor of shape (B,); got {getattr(lengths, 'shape', type(lengths))}")
    if not alpha > 0:
        raise ValueError(f"alpha must be > 0; got {alpha}")
    scaled = alpha * lengths.to(torch.float64)  # (B,)
    # l = 0 divides by zero: 1 - inf = -inf, which the clamp turns into 0.
    lam = 1.0 - 1.0 / scaled
    return lam.clamp(0.0, 1.0)
