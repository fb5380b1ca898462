"""Hybrid reward strategies as separate stages (docs/design.md, "Hybrid strategies"): filters
(``FILTERS``, :func:`apply_filter`: *filter then refine*), scheduled mixes of a sequence and a
dense reward (:func:`mix_weights`, :func:`mix_rewards`) and calibration of the dense weight
(:class:`Calibrator`, :func:`dense_verdict`). Each is a pure function, or for calibration a small
object with a checkpointable state.

Shapes: B responses, T padded response positions; ``outcome`` float (B,), ``group_ids`` long
(B,), rewards float (B, T), masks bool (B, T), ``keep`` bool (B,).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Protocol

import torch
from torch import Tensor

from creditrl.credit.estimators import group_mean
from creditrl.credit.registry import check_float, check_group_ids, check_mask, lookup, require_tensor

# A group mean that equals lo or hi up to rounding counts as inside [lo, hi].
BOUNDARY_TOL = 1e-9


def _check_outcome(outcome: object) -> Tensor:
    outcome = require_tensor("outcome", outcome)
    if not outcome.is_floating_point() or outcome.dim() != 1:
        raise ValueError(
            f"outcome must be a floating-point tensor of shape (B,); "
            f"got dtype {outcome.dtype}, shape {tuple(outcome.shape)}"
        )
    return outcome


def filter_top_q(outcome: Tensor, q: float, generator: torch.Generator | None) -> Tensor:
    """Keep the ``k = ceil(q * B)`` responses with the highest outcome (filter then refine).

    Responses are ranked by outcome, highest first; ties are broken uniformly at random with
    ``generator`` (a random permutation followed by a stable sort), so among equal outcomes at
    the cut every subset of the needed size is equally likely. ``q = 1`` keeps every response.
    ``q * B`` is rounded to 9 decimals before the ceiling so that e.g. q = 0.07, B = 100 keeps 7,
    not 8 (in floats 0.07 * 100 = 7.000000000000001).

    outcome float (B,), q in (0, 1] -> keep bool (B,) with exactly k True entries.
    """
    _check_outcome(outcome)
    if not 0.0 < q <= 1.0:
        raise ValueError(f"q must be in (0, 1], got {q}")
    b = outcome.shape[0]
    k = math.ceil(round(q * b, 9))
    perm = torch.randperm(b, generator=generator).to(outcome.device)
    order = torch.sort(outcome[perm], descending=True, stable=True).indices
    keep = torch.zeros(b, dtype=torch.bool, device=outcome.device)
    keep[perm[order[:k]]] = True
    return keep


def filter_group_accuracy(outcome: Tensor, group_ids: Tensor, lo: float, hi: float) -> Tensor:
    """Keep every response of a group whose mean outcome lies in ``[lo, hi]`` (both inclusive).

    PRIME (Cui et al., 2025, arXiv:2502.01456) keeps the prompts whose sampled accuracy lies in
    [0.2, 0.8]: a group that is all right or all wrong has no outcome contrast to learn from.
    ``acc_g = mean_{j in g} outcome_j``, computed in float64 (a float32 4/5 is above 0.8) and
    compared with a tolerance of ``BOUNDARY_TOL``.

    outcome float (B,), group_ids long (B,) -> keep bool (B,), equal within a group.
    """
    _check_outcome(outcome)
    check_group_ids(group_ids, outcome.shape[0])
    if lo > hi:
        raise ValueError(f"need lo <= hi, got lo={lo}, hi={hi}")
    acc = group_mean(outcome.double(), group_ids)  # (B,)
    return (acc >= lo - BOUNDARY_TOL) & (acc <= hi + BOUNDARY_TOL)


class FilterFn(Protocol):
    """The one filter signature: ``fn(outcome, group_ids, *, q, lo, hi, generator) -> keep``."""

    def __call__(
        self,
        outcome: Tensor,
        group_ids: Tensor,
        *,
        q: float,
        lo: float,
        hi: float,
        generator: torch.Generator | None,
    ) -> Tensor: ...


FILTERS: dict[str, FilterFn] = {}


def register_filter(name: str) -> Callable[[FilterFn], FilterFn]:
    """Register a filter under ``name``; a name may be registered only once."""

    def decorator(fn: FilterFn) -> FilterFn:
        if name in FILTERS:
            raise ValueError(f"filter {name!r} is already registered")
        FILTERS[name] = fn
        return fn

    return decorator


@register_filter("none")
def _keep_all(
    outcome: Tensor, group_ids: Tensor, *, q: float, lo: float, hi: float, generator: torch.Generator | None
) -> Tensor:
    """Keep every response."""
    return torch.ones(outcome.shape[0], dtype=torch.bool, device=outcome.device)


@register_filter("top_q")
def _top_q(
    outcome: Tensor, group_ids: Tensor, *, q: float, lo: float, hi: float, generator: torch.Generator | None
) -> Tensor:
    """:func:`filter_top_q` over the whole batch; ``group_ids``, ``lo`` and ``hi`` are unused."""
    return filter_top_q(outcome, q, generator)


@register_filter("group_accuracy")
def _group_accuracy(
    outcome: Tensor, group_ids: Tensor, *, q: float, lo: float, hi: float, generator: torch.Generator | None
) -> Tensor:
    """:func:`filter_group_accuracy`; ``q`` and ``generator`` are unused."""
    return filter_group_accuracy(outcome, group_ids, lo, hi)


def apply_filter(
    name: str,
    outcome: Tensor,
    group_ids: Tensor,
    *,
    q: float = 1.0,
    lo: float = 0.0,
    hi: float = 1.0,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Run the filter registered as ``name``: outcome float (B,), group_ids long (B,) -> keep
    bool (B,). Raises ValueError for an unknown name (listing the valid ones) or bad inputs."""
    fn = lookup(FILTERS, "filter", name)
    _check_outcome(outcome)
    check_group_ids(group_ids, outcome.shape[0])
    return fn(outcome, group_ids, q=q, lo=lo, hi=hi, generator=generator)


# (progress, switch_at, weight) -> (w_seq, w_dense), as mix_weights documents them
_SCHEDULES: dict[str, Callable[[float, float, float], tuple[float, float]]] = {
    "constant": lambda p, s, w: (1.0, w),
    "switch": lambda p, s, w: (1.0, 0.0) if p < s else (0.0, w),
    "linear": lambda p, s, w: (1.0 - p, w * p),
    "decay": lambda p, s, w: (1.0, 0.0) if s == 0.0 else (1.0, w * max(0.0, 1.0 - p / s)),
}
SCHEDULES: tuple[str, ...] = tuple(_SCHEDULES)


def mix_weights(schedule: str, progress: float, *, switch_at: float = 0.8, weight: float = 1.0) -> tuple[float, float]:
    """Weights ``(w_seq, w_dense)`` of the reward ``w_seq * seq + w_dense * dense`` at training
    ``progress = iteration / total_iterations`` in [0, 1]:

    - ``constant``: ``(1, weight)`` throughout;
    - ``switch``: ``(1, 0)`` while ``progress < switch_at``, then ``(0, weight)``;
    - ``linear``: ``(1 - progress, weight * progress)``, a linear hand-over;
    - ``decay``: ``(1, weight * max(0, 1 - progress / switch_at))``: the dense source shapes the
      start of training and is annealed away by ``switch_at``, so a learned checker cannot be
      exploited once the policy has left the distribution it was trained on.

    Raises ValueError for an unknown schedule (listing ``SCHEDULES``) or ``progress`` or
    ``switch_at`` outside [0, 1] (a progress of 37 is an iteration passed by mistake).
    """
    fn = lookup(_SCHEDULES, "reward schedule", schedule)
    for label, x in (("progress", progress), ("switch_at", switch_at)):
        if not 0.0 <= x <= 1.0:
            raise ValueError(f"{label} must lie in [0, 1]; got {x}")
    return fn(progress, switch_at, weight)


def mix_rewards(
    seq_rewards: Tensor,
    seq_mask: Tensor,
    dense_rewards: Tensor,
    dense_mask: Tensor,
    w_seq: float,
    w_dense: float,
) -> tuple[Tensor, Tensor]:
    """``rewards = w_seq * seq_rewards + w_dense * dense_rewards`` (each term 0 where its mask
    is 0); ``reward_mask`` = the OR of the masks of the terms with a non-zero weight, so a term
    switched off places nothing. All inputs (B, T): rewards float, masks bool."""
    check_float("seq_rewards", seq_rewards)
    shape = tuple(seq_rewards.shape)
    check_mask("seq_mask", seq_mask, shape)
    check_float("dense_rewards", dense_rewards, shape)
    check_mask("dense_mask", dense_mask, shape)
    rewards = w_seq * torch.where(seq_mask, seq_rewards, 0) + w_dense * torch.where(dense_mask, dense_rewards, 0)
    reward_mask = torch.zeros_like(seq_mask)
    if w_seq != 0:
        reward_mask = reward_mask | seq_mask
    if w_dense != 0:
        reward_mask = reward_mask | dense_mask
    return rewards, reward_mask


def dense_verdict(
    rewards: Tensor, reward_mask: Tensor, response_mask: Tensor, threshold: float = 0.5
) -> tuple[Tensor, Tensor]:
    """What a dense (step) source says about each whole response.

    ``verdict[b]`` = every reward placed on a valid token of b is >= ``threshold`` (the source
    calls the response correct when it accepts every step); ``valid[b]`` = at least one reward
    was placed there. verdict is False where valid is False.

    rewards float (B, T), reward_mask bool (B, T), response_mask bool (B, T) -> (bool (B,),
    bool (B,)).
    """
    check_float("rewards", rewards)
    shape = tuple(rewards.shape)
    check_mask("reward_mask", reward_mask, shape)
    check_mask("response_mask", response_mask, shape)
    placed = reward_mask & response_mask
    valid = placed.any(dim=1)
    verdict = valid & ((rewards >= threshold) | ~placed).all(dim=1)
    return verdict, valid


class Calibrator:
    """The weight of a dense reward source follows its running agreement with the outcome checker.

    After each batch, ``a = mean_{valid b} [verdict_b == outcome_b]`` and the running agreement
    is the exponential moving average ``A <- momentum * A + (1 - momentum) * a``; a batch with no
    valid response leaves A unchanged. ``weight = base * clamp((A - 0.5) / 0.5, 0, 1)``: a
    source that always agrees keeps the base weight, one at chance level (A = 0.5) gets 0.

    A starts at 1.0 (trusted until shown otherwise), so a schedule takes effect from the first
    iteration rather than after ~1 / (1 - momentum) batches of EMA warm-up.
    """

    def __init__(self, momentum: float = 0.9, weight: float = 1.0) -> None:
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"momentum must lie in [0, 1); got {momentum}")
        if weight < 0:
            raise ValueError(f"weight must be >= 0; got {weight}")
        self.momentum = momentum
        self.base_weight = weight
        self.agreement = 1.0
        self.updates = 0

    def update(self, verdicts: Tensor, outcome: Tensor, valid: Tensor) -> float:
        """Fold one batch into the running agreement and return it. All inputs bool (B,)."""
        shape = tuple(verdicts.shape) if isinstance(verdicts, Tensor) else None
        for label, x in (("verdicts", verdicts), ("outcome", outcome), ("valid", valid)):
            require_tensor(label, x)
            if x.dtype != torch.bool or x.dim() != 1 or tuple(x.shape) != shape:
                raise ValueError(
                    f"{label} must be a bool tensor of shape (B,) = {shape}; "
                    f"got dtype {x.dtype}, shape {tuple(x.shape)}"
                )
        n = int(valid.sum())
        if n:
            agree = float(((verdicts == outcome) & valid).sum()) / n
            # written as a step towards `agree` so that agree == A leaves A exactly unchanged
            self.agreement += (1.0 - self.momentum) * (agree - self.agreement)
        self.updates += 1
        return self.agreement

    @property
    def weight(self) -> float:
        return self.base_weight * min(1.0, max(0.0, (self.agreement - 0.5) / 0.5))

    def state_dict(self) -> dict[str, float | int]:
        return {"agreement": self.agreement, "updates": self.updates}

    def load_state_dict(self, state: dict[str, float | int]) -> None:
        missing = {"agreement", "updates"} - set(state)
        if missing:
            raise KeyError(f"calibrator state is missing {sorted(missing)}")
        self.agreement = float(state["agreement"])
        self.updates = int(state["updates"])
