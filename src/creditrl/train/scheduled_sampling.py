"""Scheduled sampling for the supervised warm start (Bengio et al. 2015), and exposure bias.

Teacher forcing trains every token on the reference prefix, while generation runs on the model's
own; the gap is exposure bias. Scheduled sampling feeds, with a probability ``p`` that grows over
training, the model's own token in place of the reference token at each response position.

The mixing is the parallel form (Duckworth et al. 2019's one-pass approximation): one extra
forward pass without gradients on the teacher-forced batch gives, at every position ``t - 1``,
the model's next token (its argmax, or a sample); each response input token ``t`` is replaced
by it with probability ``p``; the training forward then reads the mixed inputs while the labels
stay the reference. A step costs one forward more than plain SFT, never a token-by-token loop.

Schedules of ``p`` over ``steps`` SFT steps (``p_max`` the largest probability):

* ``linear``: ``p = p_max * step / (steps - 1)``;
* ``inverse_sigmoid``: Bengio's ``eps = k / (k + exp(step / k))`` is the teacher-forcing
  probability and ``p = p_max * (1 - eps)``; ``k = 0`` picks the ``k`` whose midpoint
  (``eps = 1/2`` at ``step = k ln k``) is half of the steps.

:func:`exposure_bias` measures the gap the way the seed frames it: the share of a reference
solution's steps the model gets right under teacher forcing (every token of the step the argmax
given the reference prefix) against the share of steps right in its own greedy solution.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

__all__ = ["SCHEDULES", "sampling_probability", "midpoint_k", "mix_inputs", "exposure_bias"]

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


def exposure_bias(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    task: Any,
    problems: list,
    *,
    max_new_tokens: int,
    engine: str = "auto",
) -> dict[str, float]:
    """Teacher-forced against free-running step accuracy of ``model`` on ``problems``.

    ``tf_step_accuracy``: the mean over problems of the share of the reference solution's steps
    (split at ``task.step_separator``, the answer segment included) whose every token is the
    model's argmax given the reference prefix. ``free_step_accuracy``: the mean share of the
    reference's steps that the model's own greedy solution gets right (``task.label_completion``,
    stop at the first error), with ``accuracy`` its exact match. ``gap`` = teacher-forced minus
    free-running."""
    from creditrl.train.evaluate import evaluate
    from creditrl.train.sft import sft_batch

    ids, mask, labels = sft_batch(tokenizer, problems)
    with torch.no_grad():
        pred = model(input_ids=ids, attention_mask=mask).logits.argmax(-1)
    sep = task.step_separator or ""
    tf_shares, free_shares = [], []
    res = evaluate(model, tokenizer, task, problems, max_new_tokens=max_new_tokens, engine=engine)
    for i, (problem, completion) in enumerate(zip(problems, res.completions)):
        where = (labels[i] != -100).nonzero().flatten()
        right = (pred[i, where - 1] == labels[i, where]).tolist()[:-1]  # the eos left out
        steps = _step_tokens(tokenizer, problem.solution, sep)
        tf_shares.append(sum(all(right[a:b]) for a, b in steps) / len(steps))
        free = task.label_completion(problem, completion)
        free_shares.append(sum(free[: len(steps)]) / len(steps))
    tf, fr = sum(tf_shares) / len(problems), sum(free_shares) / len(problems)
    return {"tf_step_accuracy": tf, "free_step_accuracy": fr, "gap": tf - fr, "accuracy": res.accuracy}


def _step_tokens(tokenizer: PreTrainedTokenizerBase, solution: str, sep: str) -> list[tuple[int, int]]:
    """Token spans of a solution's steps (tokenized as SFT tokenizes it): a step ends after its
    separator; the answer segment (from the first ``#``) is the last. A token belongs to the step
    its first character lies in."""
    bounds, start = [], 0
    hash_at = solution.find("#")
    head = solution if hash_at < 0 else solution[:hash_at]
    for i, ch in enumerate(head):
        if sep and ch == sep:
            bounds.append((start, i + 1))
            start = i + 1
    if start < len(solution):
        bounds.append((start, len(solution)))
    offsets = tokenizer(solution, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    firsts = [a for a, _ in offsets]
    spans = []
    for a, b in bounds:
        toks = [j for j, f in enumerate(firsts) if a <= f < b]
        if toks:
            spans.append((toks[0], toks[-1] + 1))
    return spans
