"""Monte-Carlo state values at step boundaries (VinePPO: Kazemnejad et al., 2024, arXiv:2410.01679).

VinePPO replaces the learned critic by unbiased Monte-Carlo estimates: a language model can be
rolled out again from any prefix of its own response, so the value of the state reached after
some steps is the average outcome of K fresh continuations of that prefix under the current policy.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from creditrl.policy.engines import GenerationEngine, SamplingParams
from creditrl.rollout.batch import TrajectoryBatch
from creditrl.rollout.continuations import PrefixSet, continue_prefixes

OutcomeFn = Callable[[int, str], float]
"""``outcome_fn(b, completion) -> float``: the outcome of a full completion of row b's prompt
(e.g. 1.0 when the task's outcome checker accepts it)."""


@dataclass
class MCValues:
    values: Tensor  # float (B, T): V(s_k) on every valid token of step k, 0 on masked tokens
    n_states: int  # distinct prefixes estimated (each once, however many rows share it)
    n_continuations: int  # continuations sampled: samples x states that had a budget left
    n_tokens: int  # tokens the engine returned for them (an engine that ignores budgets returns more)


def step_spans(step_ends: list[bool], length: int) -> list[tuple[int, int]]:
    """``[(start, end), ...]`` (end exclusive) of the steps of one response of ``length`` tokens.

    A step ends on each ``step_ends`` token before ``length``; the last token always ends the
    final step, so the spans tile ``0..length-1``. An empty response has no steps.
    """
    ends = [t for t in range(length) if step_ends[t]]
    if length and (not ends or ends[-1] != length - 1):
        ends.append(length - 1)
    starts = [0] + [e + 1 for e in ends[:-1]]
    return [(s, e + 1) for s, e in zip(starts, ends)]


def mc_values(
    engine: GenerationEngine,
    batch: TrajectoryBatch,
    step_ends: Tensor,
    outcome_fn: OutcomeFn,
    *,
    samples: int,
    params: SamplingParams,
    generator: torch.Generator | None,
    decode: Callable[[list[int]], str],
    max_rows: int | None = None,
    max_positions: int | None = None,
) -> MCValues:
    """Monte-Carlo values V(s_k) of the state before each step of each response (VinePPO).

    For row b with response y cut into steps k = 0..n_b-1 by ``step_ends`` (bool (B, T), True on
    the last token of a step; the last valid token always ends the final step), the state before
    step k is ``s_k = (x, y_{<start_k})``, the prompt x plus the tokens of steps 0..k-1, and::

        V(s_k) = (1/K) sum_{j=1..K} outcome_fn(b, decode(y_{<start_k} + c_j)),
        c_j ~ pi( . | s_k),  K = samples

    with the continuations c_j sampled by ``engine`` under ``params``. ``values[b, t] = V(s_k)``
    on every valid token t of step k, 0 elsewhere. The state after the final step is terminal and
    not estimated (V = 0 there; VinePPO's step advantage is ``A_k = r_k + V(s_{k+1}) - V(s_k)``).

    States are keyed by (prompt ids without padding, response prefix): a state several rows reach
    (s_0 of one prompt's G responses) is estimated once, judged by ``outcome_fn`` of the first row
    that reached it. A continuation of a prefix of p tokens may add at most
    ``params.max_new_tokens - p`` tokens; a prefix with no room left is not sampled, and its value
    is ``outcome_fn`` of the prefix itself. Sampling is
    :func:`creditrl.rollout.continuations.continue_prefixes`; ``max_rows`` and ``max_positions``
    bound one engine call without changing the samples (``generate_chunked``; in-process engines
    only). ``values`` is float32 (B, T) on the device of ``batch.response_ids``.
    """
    shape = tuple(batch.response_ids.shape)
    if not isinstance(step_ends, Tensor):
        raise TypeError(f"step_ends must be a torch.Tensor; got {type(step_ends).__name__}")
    if step_ends.dtype != torch.bool or tuple(step_ends.shape) != shape:
        raise ValueError(
            f"step_ends must be a bool tensor of shape (B, T) = {shape}; "
            f"got dtype {step_ends.dtype}, shape {tuple(step_ends.shape)}"
        )
    if samples < 1:
        raise ValueError(f"samples must be >= 1, got {samples}")
    prompt_ids, prompt_mask = batch.prompt_ids.tolist(), batch.prompt_mask.bool().tolist()
    response_ids, lengths, ends = batch.response_ids.tolist(), batch.response_lengths.tolist(), step_ends.tolist()
    states = PrefixSet()
    spans: list[tuple[int, int, int, int]] = []  # (row, start, end, state)
    for b in range(shape[0]):
        prompt = [t for t, m in zip(prompt_ids[b], prompt_mask[b]) if m]
        response = response_ids[b][: lengths[b]]
        for start, end in step_spans(ends[b], lengths[b]):
            spans.append(
                (b, start, end, states.add((tuple(prompt), tuple(response[:start])), prompt, response[:start], b))
            )
    out = continue_prefixes(
        engine,
        states.prefixes,
        lambda row, tokens: outcome_fn(row, decode(tokens)),
        n=samples,
        params=params,
        generator=generator,
        budget_total=params.max_new_tokens,
        max_rows=max_rows,
        max_positions=max_positions,
    )
    state_values = out.means()
    values = torch.zeros(shape, dtype=torch.float32)
    for b, start, end, i in spans:
        values[b, start:end] = state_values[i]
    values = torch.where(batch.response_mask.cpu(), values, 0.0)
    return MCValues(
        values=values.to(batch.response_ids.device),
        n_states=len(states),
        n_continuations=out.sampled * samples,
        n_tokens=out.n_tokens,
    )
