"""Advantage normalisers: the whitening stage that runs after an estimator, never inside one.

Every normaliser has the signature ``fn(advantages, response_mask, *, group_ids=None) -> Tensor``
with advantages float (B, T), response_mask bool (B, T), group_ids long (B,); the output is
float (B, T) and exactly 0 where ``response_mask`` is 0. Statistics run over valid tokens only;
std is the sample standard deviation (n - 1) and ``EPS = 1e-6``, so a set of equal advantages
whitens to 0 and never to NaN.
"""

from collections.abc import Callable
from typing import Protocol

import torch
from torch import Tensor

from creditrl.credit.estimators import EPS, group_mean, group_std
from creditrl.credit.registry import check_float, check_group_ids, check_mask, lookup


class NormaliserFn(Protocol):
    """The one normaliser signature (see the module docstring for shapes and dtypes)."""

    def __call__(self, advantages: Tensor, response_mask: Tensor, *, group_ids: Tensor | None = None) -> Tensor: ...


NORMALISERS: dict[str, NormaliserFn] = {}


def register_normaliser(name: str) -> Callable[[NormaliserFn], NormaliserFn]:
    """Register a normaliser under ``name``; a name may be registered only once."""

    def decorator(fn: NormaliserFn) -> NormaliserFn:
        if name in NORMALISERS:
            raise ValueError(f"normaliser {name!r} is already registered")
        NORMALISERS[name] = fn
        return fn

    return decorator


def whiten(advantages: Tensor, response_mask: Tensor, group_ids: Tensor) -> Tensor:
    """``(A - mean_g) / (std_g + EPS)`` with mean and sample std over the valid tokens of each
    group g; 0 on masked tokens. advantages float (B, T), response_mask bool (B, T),
    group_ids long (B,) -> float (B, T)."""
    mean = group_mean(advantages, group_ids, response_mask)[:, None]  # (B, 1)
    std = group_std(advantages, group_ids, response_mask)[:, None]  # (B, 1)
    return torch.where(response_mask, (advantages - mean) / (std + EPS), 0)


@register_normaliser("none")
def no_normalisation(advantages: Tensor, response_mask: Tensor, *, group_ids: Tensor | None = None) -> Tensor:
    """Advantages unchanged on valid tokens and 0 on masked ones; ``group_ids`` is unused."""
    return torch.where(response_mask, advantages, 0)


@register_normaliser("batch")
def batch_whitening(advantages: Tensor, response_mask: Tensor, *, group_ids: Tensor | None = None) -> Tensor:
    """Whiten over every valid token of the batch: ``(A - mean) / (std + EPS)``, as in
    REINFORCE++ (Hu, 2025, arXiv:2501.03262). ``group_ids`` is unused."""
    one_group = torch.zeros(advantages.shape[0], dtype=torch.long, device=advantages.device)
    return whiten(advantages, response_mask, one_group)


@register_normaliser("group")
def group_whitening(advantages: Tensor, response_mask: Tensor, *, group_ids: Tensor | None = None) -> Tensor:
    """Whiten per group over that group's valid tokens: ``(A - mean_g) / (std_g + EPS)``.
    Statistics are over tokens, so a group of one response is whitened over its own tokens."""
    if group_ids is None:
        raise ValueError("normaliser 'group' needs group_ids (long tensor of shape (B,)); got None")
    return whiten(advantages, response_mask, group_ids)


def normalise(name: str, advantages: Tensor, response_mask: Tensor, *, group_ids: Tensor | None = None) -> Tensor:
    """Run the normaliser registered as ``name`` after checking its inputs.

    advantages float (B, T), response_mask bool (B, T), group_ids long (B,) or None -> float
    (B, T), 0 where ``response_mask`` is 0. Raises ValueError for an unknown name (listing the
    valid ones) or a tensor of the wrong shape or dtype.
    """
    fn = lookup(NORMALISERS, "normaliser", name)
    check_float("advantages", advantages)
    check_mask("response_mask", response_mask, tuple(advantages.shape))
    if group_ids is not None:
        check_group_ids(group_ids, advantages.shape[0])
    return fn(advantages, response_mask, group_ids=group_ids)
