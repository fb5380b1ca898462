"""A separate outcome term of the advantages: the verifiable reward beside a learned dense one.

A process reward model's step rewards and the task's verifiable outcome are two credit channels.
Summed into one reward tensor, the outcome lands on the last token and is folded into the last
step's PRM reward before the estimator sees it: a min-form estimator then takes
``min(r_1, ..., r_K + w o)``, in which the outcome counts only when the last step is the worst. PURE
(Cheng et al., 2025, arXiv:2504.15275; "PURE-PRM+VR") and PRIME (Cui et al., 2025,
arXiv:2502.01456) instead add the two channels' advantages, each with its own leave-one-out
baseline over the group:

    A[b, t] = A_dense[b, t] + w * (o_b - mean_{j in group(b), j != b} o_j)      on every valid t

with ``A_dense`` the configured estimator's advantage (``min_form`` on the PRM's step rewards, for
PURE), o_b the outcome of response b (1.0 when the task's checker accepts it) and w
``credit.outcome_coef``. The outcome term is RLOO on a sequence reward, so with ``min_form`` the
sum is PURE's RLOO on ``M[b, t] + w o_b``: the baseline of a sum is the sum of the baselines.
"""

import torch
from torch import Tensor

from creditrl.credit.estimators import leave_one_out_mean
from creditrl.credit.registry import check_group_ids, check_mask


def outcome_advantage(outcome: Tensor, response_mask: Tensor, group_ids: Tensor) -> Tensor:
    """``A_o[b, t] = o_b - mean_{j in group(b), j != b} o_j`` on every valid token, 0 on masked
    tokens and for a group of one response.

    outcome float (B,), response_mask bool (B, T), group_ids long (B,) -> float (B, T) in the dtype
    of ``outcome``.
    """
    if not isinstance(outcome, Tensor) or not outcome.is_floating_point() or outcome.dim() != 1:
        shape = getattr(outcome, "shape", type(outcome).__name__)
        raise ValueError(f"outcome must be a floating-point tensor of shape (B,); got {shape}")
    check_mask("response_mask", response_mask, (outcome.shape[0], response_mask.shape[-1]))
    check_group_ids(group_ids, outcome.shape[0])
    baseline, shared = leave_one_out_mean(outcome, group_ids)  # (B,)
    return torch.where(response_mask & shared[:, None], (outcome - baseline)[:, None], 0)
