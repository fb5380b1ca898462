"""Loss aggregation: one function, named modes, each a registered reduction of a (B, T) loss.

- ``token-mean``: sum over all valid tokens / number of valid tokens (DAPO, verl default).
- ``seq-mean-token-mean``: mean over each response's valid tokens, then mean over responses
  with at least one valid token (the original GRPO paper).
- ``seq-mean-token-sum-norm``: sum over each response's tokens / a constant ``norm`` (default:
  the padded length T), then mean over responses -- Dr. GRPO's length-unbiased constant.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

AggregationFn = Callable[..., torch.Tensor]
AGGREGATIONS: dict[str, AggregationFn] = {}


def _register(name: str) -> Callable[[AggregationFn], AggregationFn]:
    def deco(fn: AggregationFn) -> AggregationFn:
        if name in AGGREGATIONS:
            raise ValueError(f"aggregation '{name}' is already registered")
        AGGREGATIONS[name] = fn
        return fn

    return deco


def aggregate(name: str, loss: torch.Tensor, mask: torch.Tensor, *, norm: float | None = None) -> torch.Tensor:
    """Reduce a per-token ``loss`` (B, T) over the bool ``mask`` (B, T) to a scalar."""
    if name not in AGGREGATIONS:
        raise ValueError(f"unknown loss aggregation '{name}'; valid: {', '.join(sorted(AGGREGATIONS))}")
    if loss.shape != mask.shape or mask.dtype != torch.bool:
        raise ValueError(f"loss {tuple(loss.shape)} and bool mask {tuple(mask.shape)} ({mask.dtype}) must match")
    return AGGREGATIONS[name](loss, mask, norm=norm)


@_register("token-mean")
def token_mean(loss: torch.Tensor, mask: torch.Tensor, *, norm: float | None = None) -> torch.Tensor:
    m = mask.to(loss.dtype)
    return (loss * m).sum() / m.sum().clamp(min=1.0)


@_register("seq-mean-token-mean")
def seq_mean_token_mean(loss: torch.Tensor, mask: torch.Tensor, *, norm: float | None = None) -> torch.Tensor:
    m = mask.to(loss.dtype)
    count = m.sum(-1)
    per_seq = (loss * m).sum(-1) / count.clamp(min=1.0)
    has = (count > 0).to(loss.dtype)
    return (per_seq * has).sum() / has.sum().clamp(min=1.0)


@_register("seq-mean-token-sum-norm")
def seq_mean_token_sum_norm(loss: torch.Tensor, mask: torch.Tensor, *, norm: float | None = None) -> torch.Tensor:
    m = mask.to(loss.dtype)
    constant = float(norm) if norm is not None else float(loss.shape[-1])
    return ((loss * m).sum(-1) / constant).mean()


def aggregation_count(name: str, mask: torch.Tensor) -> float:
    """The denominator of aggregation ``name`` over the rows of ``mask`` (B, T): its valid tokens
    (``token-mean``), its responses with a valid token (``seq-mean-token-mean``) or its responses
    (``seq-mean-token-sum-norm``). ``aggregate`` over rows split into parts equals the sum of each
    part's aggregate weighted by ``count(part) / count(all)``: gradient accumulation over
    micro-batches, and over data-parallel ranks with the count summed over ranks."""
    if name == "token-mean":
        return float(mask.sum())
    if name == "seq-mean-token-mean":
        return float(mask.any(-1).sum())
    if name == "seq-mean-token-sum-norm":
        return float(mask.shape[0])
    raise ValueError(f"unknown loss aggregation '{name}'; valid: {', '.join(sorted(AGGREGATIONS))}")
