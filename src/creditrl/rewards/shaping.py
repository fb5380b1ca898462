"""Shaping terms: rewards added on top of a source's placed scores.

Each term is a pure function over (B, T) tensors returning ``(delta, mask)``: ``delta`` float32
(B, T) is the reward it adds and ``mask`` bool (B, T) the tokens where it applies; both are
0 / False wherever ``response_mask`` is 0. :func:`add_shaping` adds terms onto ``rewards`` and
ORs their masks into ``reward_mask``.

A shaping term is a *placed* reward like any other, so ``grpo_process`` pools it with the
source's scores when it normalises a group's placed rewards (a term on every token, such as the
KL penalty, then weighs heavily in that pool); the summing estimators (``grpo``, ``rloo``,
``reinforce``, ``gae``) simply add it into the return.

Time index: token ranks count valid tokens only (rank r = the number of valid tokens before
it), and the response length is ``L = sum_t response_mask[b, t]``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from creditrl.losses.kl import kl_estimate

ShapingTerm = tuple[torch.Tensor, torch.Tensor]  # (delta float (B, T), mask bool (B, T))


def _check_mask(response_mask: torch.Tensor) -> None:
    if response_mask.dtype != torch.bool or response_mask.dim() != 2:
        raise ValueError(f"response_mask must be bool (B, T), got {response_mask.dtype} {tuple(response_mask.shape)}")


def _last_valid_mask(response_mask: torch.Tensor) -> torch.Tensor:
    """True on each row's last valid token (nothing on an empty row), bool (B, T)."""
    rank = response_mask.long().cumsum(dim=1)  # (B, T): valid tokens up to and including t
    return response_mask & (rank == rank[:, -1:])


def length_penalty(response_mask: torch.Tensor, *, budget: int, coef: float) -> ShapingTerm:
    """``-coef`` on every valid token beyond a budget of ``budget`` tokens.

    ``delta[b, t] = -coef`` where token t is valid and its rank among row b's valid tokens is
    ``>= budget``; so the response's return falls by ``coef * max(0, L - budget)``, a linear
    length cost that leaves responses within budget untouched.
    """
    _check_mask(response_mask)
    if budget < 0:
        raise ValueError(f"length penalty budget must be >= 0, got {budget}")
    rank = response_mask.long().cumsum(dim=1) - 1  # (B, T) rank of each valid token
    mask = response_mask & (rank >= budget)
    delta = torch.where(mask, -float(coef), 0.0).to(torch.float32)
    return delta, mask


def overlong_penalty(response_mask: torch.Tensor, *, max_len: int, cache: int, coef: float = 1.0) -> ShapingTerm:
    """DAPO's soft overlong punishment on each response's last valid token.

    Yu et al. 2025, "DAPO", arXiv:2503.14476, sec. 3.4, with L the number of valid tokens::

        R(L) = 0                                   if L <= max_len - cache
             = ((max_len - cache) - L) / cache     if max_len - cache < L <= max_len
             = -1                                  if L > max_len

    ``delta`` is ``coef * R(L)`` on the last valid token; ``mask`` marks it only where
    ``L > max_len - cache`` (where the penalty applies). ``cache`` is the length of the soft
    zone (0 gives a hard cut at ``max_len``).
    """
    _check_mask(response_mask)
    if max_len < 1 or not 0 <= cache <= max_len:
        raise ValueError(f"overlong penalty needs max_len >= 1 and 0 <= cache <= max_len, got {max_len}, {cache}")
    length = response_mask.sum(dim=1).to(torch.float32)  # (B,)
    soft_start = max_len - cache
    soft = (soft_start - length) / max(cache, 1)  # only used where cache >= 1 (soft zone non-empty)
    r = torch.where(length <= soft_start, 0.0, torch.where(length <= max_len, soft, -1.0))  # (B,)
    mask = _last_valid_mask(response_mask) & (length > soft_start)[:, None]
    delta = torch.where(mask, float(coef) * r[:, None], 0.0).to(torch.float32)
    return delta, mask


def kl_penalty(
    logp: torch.Tensor, ref_logp: torch.Tensor, response_mask: torch.Tensor, *, beta: float, estimator: str = "k3"
) -> ShapingTerm:
    """KL-in-reward: ``delta[b, t] = -beta * KL_t`` on every valid token.

    ``KL_t`` is :func:`creditrl.losses.kl.kl_estimate` (Schulman's k1 / k2 / k3 of
    ``log pi(y_t) - log pi_ref(y_t)``), as in the per-token KL reward of Ouyang et al. 2022
    (InstructGPT, arXiv:2203.02155) and Stiennon et al. 2020. The delta is detached: a reward
    carries no gradient. logp, ref_logp float (B, T); values on masked tokens are ignored.
    """
    _check_mask(response_mask)
    if logp.shape != response_mask.shape or ref_logp.shape != response_mask.shape:
        raise ValueError(
            f"logp and ref_logp must have the shape of response_mask {tuple(response_mask.shape)}, "
            f"got {tuple(logp.shape)} and {tuple(ref_logp.shape)}"
        )
    kl = kl_estimate(logp.detach().float(), ref_logp.detach().float(), estimator)
    delta = torch.where(response_mask, -float(beta) * kl, 0.0)
    return delta, response_mask.clone()


def add_shaping(
    rewards: torch.Tensor, reward_mask: torch.Tensor, terms: Sequence[ShapingTerm]
) -> tuple[torch.Tensor, torch.Tensor]:
    """``rewards + sum(deltas)`` and ``reward_mask | any(masks)``; new tensors, inputs untouched."""
    rewards, reward_mask = rewards.clone(), reward_mask.clone()
    for i, (delta, mask) in enumerate(terms):
        if delta.shape != rewards.shape or mask.shape != rewards.shape or mask.dtype != torch.bool:
            raise ValueError(
                f"shaping term {i}: expected delta float and mask bool of shape {tuple(rewards.shape)}, "
                f"got {tuple(delta.shape)} and {mask.dtype} {tuple(mask.shape)}"
            )
        rewards += delta
        reward_mask |= mask
    return rewards, reward_mask
