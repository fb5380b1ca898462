"""Scheduled sampling for the supervised warm start (Bengio et al. 2015), and exposure bias.

Teacher forcing trains every token on the reference prefix, while generation runs on the model's
own; the gap is exposure bias. Scheduled sampling feeds, with a probability ``p`` that grows over
training, the model's own token in place of the reference token at each response position.

The mixing is the parallel form (Duckworth et al. 2019's one-pass approximation): one extra
forward pass without gradients on the teacher-forced batch gives the model's own tokens
(:func:`mix_inputs`); the training forward reads the mixed inputs while the labels stay the
reference.

Schedules of ``p`` over ``steps`` SFT steps (``p_max`` the largest probability):

* ``linear``: ``p = p_max * step / (steps - 1)``;
* ``inverse_sigmoid``: Bengio's ``eps = k / (k + exp(step / k))`` is the teacher-forcing
  probability and ``p = p_max * (1 - eps)``; ``k = 0`` picks the ``k`` whose midpoint
  (``eps = 1/2`` at ``step = k ln k``) is half of the steps.

:func:`creditrl.experiments.evaluate.exposure_bias` measures the gap.
"""

from __future__ import annotations

import math

import torch
from transformers import PreTrainedModel

__all__ = ["SCHEDULES", "sampling_probability", "midpoint_k", "mix_inputs"]

SCHEDULES = ("none", "linear", "inverse_sigmoid")


def midpoint_k(steps: int) -> float:
    """The inverse-sigmoid ``k`` whose midpoint ``k ln k`` is ``steps / 2`` (at least ``e``)."""
    target, k = max(steps / 2, math.e), math.e
    for _ in range(60):  # Newton on k ln k - target, convex and increasing for k >= 1
        k -= (k * math.log(k) - target) / (math.log(k) + 1)
    return k


def sampling_probability(schedule: str, step: int, steps: int, p_max: float, k: float = 0.0) -> float:
    """The probability of feeding the model's own token at SFT step ``step`` of ``steps``."""
    if schedule == "none" or p_max == 0:
        return 0.0
    if schedule == "linear":
        return p_max * step / max(1, steps - 1)
    if schedule == "inverse_sigmoid":
        k = k or midpoint_k(steps)
        teacher = k / (k + math.exp(min(step / k, 700.0)))
        return p_max * (1.0 - teacher)
    raise ValueError(f"sft.scheduled_sampling: unknown schedule {schedule!r}; schedules: {', '.join(SCHEDULES)}")


@torch.no_grad()
def mix_inputs(
    model: PreTrainedModel,
    ids: torch.Tensor,
    mask: torch.Tensor,
    labels: torch.Tensor,
    p: float,
    generator: torch.Generator,
    greedy: bool = False,
) -> tuple[torch.Tensor, float]:
    """``ids`` with each response input token (a position whose label is not -100) replaced by
    the model's own token for it -- its next token at the previous position, from the reference
    prefix -- with probability ``p``; returns (mixed ids, share of response tokens replaced).
    One forward pass."""
    eligible = labels != -100
    eligible[:, 0] = False  # nothing comes before position 0
    if p <= 0 or not bool(eligible.any()):
        return ids, 0.0
    logits = model(input_ids=ids, attention_mask=mask).logits.float()
    if greedy:
        nxt = logits.argmax(-1)
    else:
        probs = torch.softmax(logits, dim=-1).reshape(-1, logits.shape[-1])
        nxt = torch.multinomial(probs, 1, generator=generator).reshape(ids.shape)
    own = torch.cat([ids[:, :1], nxt[:, :-1]], dim=1)  # own[:, t]: the model's token for position t
    draw = torch.rand(ids.shape, generator=generator, device=ids.device) < p
    replace = eligible & draw
    mixed = torch.where(replace, own, ids)
    return mixed, float(replace.sum()) / max(1, int(eligible.sum()))
