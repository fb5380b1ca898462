"""Generalised advantage estimation (Schulman et al., 2016, arXiv:1506.02438) over masked tokens.

Index convention. For response b, time runs only over its valid positions (``response_mask``
1), renumbered k = 0..L_b-1 in order, as in ``estimators``. A masked position inside a response
(an observation or tool token) is skipped, as in verl's masked GAE (``compute_gae_advantage_return``
with ``response_mask``): it receives no credit, its reward and value are ignored, and the
recursion runs straight across it, so V_{k+1} is the value at the next *valid* position.

    delta_k = r_k + gamma * V_{k+1} - V_k          with V_{L_b} = 0 (nothing after the last token)
    A_k     = sum_{l >= 0} (gamma * lam)^l delta_{k+l}      i.e.  A_k = delta_k + gamma*lam*A_{k+1}
    returns = A + V                                  (the critic's lambda-return target)

With lam = 1, A_k = G_k - V_k (reward-to-go minus the baseline); with lam = 0, A_k = delta_k
(one-step TD error). ``lam`` may also be one value per response, a float (B,) tensor: row b then
runs the recursion with lam_b (VAPO's length-adaptive lambda, :mod:`creditrl.credit.lambdas`).
"""

import torch
from torch import Tensor

from creditrl.credit.estimators import compact, discounted_cumsum, expand
from creditrl.credit.registry import missing_input_error, register_estimator


@register_estimator("gae", needs={"values"})
def gae(
    rewards: Tensor,
    reward_mask: Tensor,
    response_mask: Tensor,
    *,
    group_ids: Tensor | None = None,
    values: Tensor | None = None,
    gamma: float = 1.0,
    lam: float | Tensor = 1.0,
) -> tuple[Tensor, Tensor]:
    """GAE(gamma, lam) over each response's valid tokens (see the module docstring).

    rewards float (B, T), reward_mask and response_mask bool (B, T), values float (B, T) V(s_t),
    the value of the state before token t, lam a float or float (B,) (row b's lambda) ->
    (advantages, returns) float (B, T), both exactly 0 where ``response_mask`` is 0; ``returns =
    A + V`` on valid tokens. Every reward on a valid token counts (``reward_mask`` is unused, so
    shaping terms on unplaced tokens count too); ``group_ids`` is unused.
    """
    if values is None:
        raise missing_input_error("gae", "values")
    # Pack each row's valid tokens to the front (column k = rank k); the padding after L_b is 0,
    # so shifting the packed values left by one gives V_{k+1} with V_{L_b} = 0 for free.
    r, order = compact(rewards, response_mask)  # (B, T)
    v = torch.where(response_mask, values, 0).gather(1, order)  # (B, T), same packing
    v_next = torch.nn.functional.pad(v[:, 1:], (0, 1))  # (B, T)
    delta = r + gamma * v_next - v  # (B, T), 0 for k >= L_b
    adv = discounted_cumsum(delta, gamma * lam)  # (B, T); a (B,) lam decays each row by its own gamma * lam_b
    returns = adv + v
    return expand(adv, order, response_mask), expand(returns, order, response_mask)
