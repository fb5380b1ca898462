"""Step resolution: run any estimator with one time step per reasoning step instead of per token.

VinePPO (Kazemnejad et al., 2024, arXiv:2410.01679) assigns credit per reasoning step: every token
of step k shares the step's advantage ``A_k = r_k + V(s_{k+1}) - V(s_k)``. Rather than a second
family of step estimators, the token tensors are compressed to one column per step, the ordinary
registered estimator runs on those (B, K) tensors, and its output is broadcast back to the tokens:

    tokens (B, T) --step_view--> steps (B, K) --estimate(name)--> (B, K) --from_steps--> (B, T)

Steps. A step ends on a valid token (``response_mask`` 1) where ``step_ends`` is 1; the valid
tokens after a row's last step end form one final step; ``step_ends`` on masked positions are
ignored, and masked tokens belong to no step. K is the largest number of steps in any row; the
columns k >= (steps of row b) are padding, masked out by ``step_mask``.
"""

import typing
from dataclasses import dataclass

import torch
from torch import Tensor

from creditrl.config.types import Resolution
from creditrl.credit.lambdas import length_adaptive_lam
from creditrl.credit.registry import check_inputs, check_mask, estimate, require_tensor

RESOLUTIONS = tuple(r for r in typing.get_args(Resolution) if r != "auto")


@dataclass(frozen=True)
class StepView:
    """Which step each token belongs to; built by ``step_view``.

    - ``step_index``: long (B, T), the step (0, 1, ...) of each valid token, -1 on masked tokens;
    - ``num_steps``: long (B,), the number of steps of each row (0 for an all-masked row);
    - ``max_steps``: int, K = the largest ``num_steps`` (0 for an empty batch);
    - ``slot``: long (B, T), ``step_index`` with masked tokens sent to the spare column K, the
      index the helpers scatter into and gather from (B, K + 1) tensors with.
    """

    step_index: Tensor
    num_steps: Tensor
    max_steps: int
    slot: Tensor


def step_view(step_ends: Tensor, response_mask: Tensor) -> StepView:
    """Number the steps of each row; step_ends and response_mask bool (B, T) -> ``StepView``."""
    if require_tensor("response_mask", response_mask).dim() != 2:
        raise ValueError(f"response_mask must be a bool tensor of shape (B, T); got shape {tuple(response_mask.shape)}")
    check_mask("response_mask", response_mask, tuple(response_mask.shape))
    check_mask("step_ends", step_ends, tuple(response_mask.shape))
    # Counting in float32 is exact below 2^24 and its cumsum is vectorised on CPU, where an
    # integer cumsum is several times slower.
    ends = (step_ends & response_mask).float()  # (B, T)
    before = ends.cumsum(1).sub_(ends).long()  # (B, T): step ends strictly before t = its step
    completed = ends.sum(1).long()  # (B,)
    # Valid tokens after the last step end form one more step.
    open_tail = (response_mask & (before == completed[:, None])).any(1)  # (B,)
    num_steps = completed + open_tail
    max_steps = int(num_steps.max()) if num_steps.numel() else 0
    return StepView(
        step_index=torch.where(response_mask, before, -1),
        num_steps=num_steps,
        max_steps=max_steps,
        # One scatter into (B, K + 1) then handles valid and masked tokens alike; the spare
        # column is dropped afterwards.
        slot=torch.where(response_mask, before, max_steps),
    )


def step_mask(view: StepView) -> Tensor:
    """bool (B, K): True for the steps that exist (k < number of steps of the row)."""
    steps = torch.arange(view.max_steps, device=view.num_steps.device)
    return steps < view.num_steps[:, None]


def sum_to_steps(x: Tensor, view: StepView) -> Tensor:
    """out[b, k] = sum of x[b, t] over the valid tokens t of step k; x (B, T) -> (B, K), 0 on
    padding steps. Values at masked tokens are ignored (even NaN)."""
    valid = view.step_index >= 0
    total = x.new_zeros(x.shape[0], view.max_steps + 1)
    return total.scatter_add_(1, view.slot, torch.where(valid, x, 0))[:, : view.max_steps]


def any_to_steps(mask: Tensor, view: StepView) -> Tensor:
    """out[b, k] = whether ``mask`` is 1 on any valid token of step k; bool (B, T) -> (B, K)."""
    return sum_to_steps(mask.to(torch.int32), view) > 0


def first_to_steps(x: Tensor, view: StepView) -> Tensor:
    """out[b, k] = x at the first valid token of step k; x (B, T) -> (B, K), 0 on padding steps.

    For values V(s_t) this is V of the state at the start of the step, the state a step-level
    critic (or a VinePPO Monte-Carlo estimate) scores.
    """
    rows, length = view.step_index.shape
    positions = torch.arange(length, device=x.device).expand(rows, length)  # (B, T)
    first = torch.full((rows, view.max_steps + 1), length, dtype=torch.long, device=x.device)
    first = first.scatter_reduce_(1, view.slot, positions, "amin")[:, : view.max_steps]
    exists = step_mask(view)  # (B, K)
    # Padding steps hold ``length`` (no token): point them anywhere valid, then zero them.
    return torch.where(exists, x.gather(1, torch.where(exists, first, 0)), 0)


def from_steps(x_steps: Tensor, view: StepView) -> Tensor:
    """Broadcast each step's entry to its valid tokens: x_steps (B, K) -> (B, T), 0 on masked
    tokens; padding steps of ``x_steps`` are never read."""
    spare = torch.nn.functional.pad(x_steps, (0, 1))  # (B, K + 1): masked tokens read the 0
    return spare.gather(1, view.slot)


def credit_lengths(resolution: str, response_mask: Tensor, step_ends: Tensor | None = None) -> Tensor:
    """l_b, each row's number of credit time steps: its valid tokens (``"token"``) or its steps
    (``"step"``, by the rule of the module docstring; needs ``step_ends``); response_mask and
    step_ends bool (B, T) -> long (B,). The length VAPO's lambda reads (:mod:`creditrl.credit.lambdas`)."""
    if resolution not in RESOLUTIONS:
        raise ValueError(f"unknown resolution {resolution!r}; valid: {', '.join(RESOLUTIONS)}")
    if resolution == "token":
        return response_mask.sum(1)
    if step_ends is None:
        raise ValueError("resolution 'step' needs step_ends (a bool (B, T) tensor); got None")
    return step_view(step_ends, response_mask).num_steps


def estimate_at(
    resolution: str,
    name: str,
    rewards: Tensor,
    reward_mask: Tensor,
    response_mask: Tensor,
    *,
    step_ends: Tensor | None = None,
    group_ids: Tensor | None = None,
    values: Tensor | None = None,
    gamma: float = 1.0,
    lam: float | Tensor = 1.0,
    lam_alpha: float = 0.0,
    lam_critic: float | None = None,
) -> tuple[Tensor, Tensor]:
    """Run estimator ``name`` with one time step per token (``"token"``) or per reasoning step
    (``"step"``); returns ``(advantages, returns)`` float (B, T), 0 where ``response_mask`` is 0.

    ``"token"`` is ``estimate(name, ...)`` itself (``step_ends`` is ignored). ``"step"`` needs
    ``step_ends`` bool (B, T) and compresses each step to one column: its rewards summed, its
    ``reward_mask`` or-ed, its value the value at its first valid token (V(s_k), the state before
    the step), then runs ``estimate`` on the (B, K) tensors and gives every token of step k the
    step's advantage and return. gamma and lam then discount per *step*, not per token. With
    ``gae``, values V(s_k), gamma = 1 and lam = 0 this is VinePPO's step advantage
    ``A_k = r_k + V(s_{k+1}) - V(s_k)`` (V after the last step = 0); with lam = 1 it is
    ``sum_{j >= k} r_j - V(s_k)``. A learned critic at step resolution is trained on these
    returns at every token of the step: all of them share the step's target, the return from
    the state V(s_k) scores.

    The lambdas (:mod:`creditrl.credit.lambdas`): ``lam_alpha > 0`` gives the *advantages*
    VAPO's per-response ``lam_b = clamp(1 - 1 / (lam_alpha * l_b), 0, 1)`` in place of ``lam``,
    l_b the row's number of time steps at this resolution (valid tokens, or steps);
    ``lam_critic`` is the lambda of the *returns* (the critic's targets; None = ``lam``). When the
    returns' lambda differs from the advantages' the estimator runs a second time on the same
    inputs and only its returns are kept (VC-PPO's decoupled GAE); otherwise it runs once, so
    ``lam_alpha = 0`` with ``lam_critic`` None is exactly the single estimate.

    Raises ValueError for an unknown resolution, a missing ``step_ends`` at step resolution, a
    negative ``lam_alpha``, or any input ``estimate`` refuses.
    """
    if resolution not in RESOLUTIONS:
        raise ValueError(f"unknown resolution {resolution!r}; valid: {', '.join(RESOLUTIONS)}")
    if lam_alpha < 0:
        raise ValueError(f"lam_alpha must be >= 0 (0 = off); got {lam_alpha}")
    options = {"group_ids": group_ids, "gamma": gamma}
    if resolution == "token":
        inputs, lengths, view = (rewards, reward_mask, response_mask, values), response_mask.sum(1), None
    else:
        if step_ends is None:
            raise ValueError("resolution 'step' needs step_ends (a bool (B, T) tensor); got None")
        # Check the token tensors here: a shape error must name them, not their step compressions.
        check_inputs(rewards, reward_mask, response_mask, values=values, lam=lam, **options)
        view = step_view(step_ends, response_mask)
        inputs = (
            sum_to_steps(rewards, view),  # (B, K)
            any_to_steps(reward_mask & response_mask, view),  # (B, K)
            step_mask(view),  # (B, K)
            None if values is None else first_to_steps(values, view),  # (B, K)
        )
        lengths = view.num_steps

    def run(lam_: float | Tensor) -> tuple[Tensor, Tensor]:
        return estimate(name, *inputs[:3], values=inputs[3], lam=lam_, **options)

    policy_lam = length_adaptive_lam(lengths, lam_alpha) if lam_alpha > 0 else lam
    adv, ret = run(policy_lam)
    critic_lam = lam if lam_critic is None else lam_critic
    if critic_lam is not policy_lam and (
        isinstance(policy_lam, Tensor) or isinstance(critic_lam, Tensor) or critic_lam != policy_lam
    ):
        ret = run(critic_lam)[1]
    if view is None:
        return adv, ret
    return from_steps(adv, view), from_steps(ret, view)
