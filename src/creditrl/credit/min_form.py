"""Min-form credit assignment (PURE; Cheng et al., 2025, arXiv:2504.15275).

Sum-form credit (every other estimator here) gives a token the *sum* of the rewards after it, so a
policy trained on a learned process reward can raise its return by adding steps the PRM likes,
right or not: the length growth and accuracy loss of the reward-hacking findings. Min-form
credit gives a token the *worst* reward after it instead, which no added step can raise:

    P_b      = {valid s : reward_mask[b, s]}                     (placed rewards of response b)
    M[b, t]  = min_{s in P_b, s >= t} rewards[b, s]              (valid t with such an s; else 0)
    M_b      = min_{s in P_b} rewards[b, s]                      (0 when P_b is empty)
    A[b, t]  = M[b, t] - mean_{j in group(b), j != b} M_j        (leave-one-out baseline, as PURE)

on every valid t; a group of one response gets 0, as for ``rloo``. ``returns = M`` (the min-form
return a critic would be trained on), not the reward-to-go G. There is no discount: ``gamma`` and
``lam`` are unused, and the config check refuses ``credit.gamma != 1`` with this estimator. With
exactly one placed reward per response (outcome supervision) ``M = G`` and this is ``rloo``.
"""

import torch
from torch import Tensor

from creditrl.credit.estimators import leave_one_out_mean, require_groups
from creditrl.credit.registry import register_estimator


def min_to_go(rewards: Tensor, reward_mask: Tensor, response_mask: Tensor) -> tuple[Tensor, Tensor]:
    """(M, M_seq): the min-form return per token, float (B, T), 0 on masked tokens and where no
    reward is placed from t on; and the per-response minimum M_b, float (B,), 0 when none.

    rewards float (B, T), reward_mask and response_mask bool (B, T). A placed reward on a masked
    position is ignored.
    """
    placed = reward_mask & response_mask
    rows, length = rewards.shape
    if length == 0:
        return torch.zeros_like(rewards), rewards.new_zeros(rows)
    # +inf where nothing is placed never wins a min; whether a finite reward lies ahead is
    # tracked by a count, so an actual +inf reward is not mistaken for "none".
    ahead = torch.where(placed, rewards, torch.inf).flip(1).cummin(1).values.flip(1)  # (B, T)
    some_ahead = placed.flip(1).cumsum(1).flip(1) > 0  # (B, T)
    m = torch.where(response_mask & some_ahead, ahead, 0)
    m_seq = torch.where(some_ahead[:, 0], ahead[:, 0], 0)  # column 0 sees every placed reward
    return m, m_seq


@register_estimator("min_form", needs={"group_ids"})
def min_form(
    rewards: Tensor,
    reward_mask: Tensor,
    response_mask: Tensor,
    *,
    group_ids: Tensor | None = None,
    values: Tensor | None = None,
    gamma: float = 1.0,
    lam: float | Tensor = 1.0,
) -> tuple[Tensor, Tensor]:
    """Min-form credit (see the module docstring): ``A[b, t] = M[b, t] - mean_{j != b} M_j``.

    rewards float (B, T), masks bool (B, T), group_ids long (B,) -> (advantages, returns) float
    (B, T), ``returns = M``. ``values``, ``gamma`` and ``lam`` are unused.
    """
    groups = require_groups(group_ids, "min_form")
    m, m_seq = min_to_go(rewards, reward_mask, response_mask)
    baseline, shared = leave_one_out_mean(m_seq, groups)  # (B,)
    return torch.where(response_mask & shared[:, None], m - baseline[:, None], 0), m
