"""Batched generation under a per-problem token budget: every search method's only path to the engine.

Budget rule. Problem p may generate at most ``budget`` tokens in total; every token the engine
returns for p counts (kept, discarded, rollout or final completion alike). Before each engine
call, the requests of problem p (each wanting at most ``want_i`` new tokens, the room left under
the response length cap) share ``available_p = budget - used_p - reserve_p`` by water-filling
(:func:`water_fill`), and each request's ``cap_i`` is passed to the engine as its ``budgets=``
entry. The engine never returns more than ``cap_i`` tokens for a request, so ``used_p <= budget``
always holds. A request with cap 0 is not sent (its result is None). ``reserve_p`` lets a method
hold tokens back for a final greedy completion.

All problems' requests go to the engine in one call (split into chunks of at most ``max_rows``
requests only to bound the KV cache), as ``n = 1`` requests whose prompts are the problem's prompt
tokens followed by the partial response; the engine prefills identical prompts once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from creditrl.policy.engines import GenerationEngine, SamplingParams


def water_fill(wants: Sequence[int], available: int, floor: int = 1) -> list[int]:
    """New-token caps for requests wanting ``wants`` tokens that together fit in ``available``.

    The requests kept are the longest prefix whose minimum shares ``min(want_i, floor)`` fit in
    ``available``; the others get 0 (a request that cannot get ``floor`` tokens, or all it wants
    if that is less, is not worth sending). The kept requests get ``cap_i = min(want_i, c)`` with
    ``c`` the largest level such that ``sum_i cap_i <= available``: every request the same share,
    a request wanting less leaves the rest to the others. With ``floor = 1`` and more requests
    than tokens, the first ``available`` requests get one token each.

    Raises:
        ValueError: On a want < 0 or a floor < 1.
    """
    if any(w < 0 for w in wants):
        raise ValueError(f"water_fill: every want must be >= 0, got {list(wants)}")
    if floor < 1:
        raise ValueError(f"water_fill: floor must be >= 1, got {floor}")
    available = max(0, available)
    kept, need = 0, 0
    for w in wants:
        if need + min(w, floor) > available:
            break
        need += min(w, floor)
        kept += 1
    head = list(wants[:kept])
    if sum(head) <= available:
        return head + [0] * (len(wants) - kept)
    lo, hi = min(floor, max(head)), max(head)  # invariant: level lo fits, level hi does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if sum(min(w, mid) for w in head) <= available:
            lo = mid
        else:
            hi = mid
    return [min(w, lo) for w in head] + [0] * (len(wants) - kept)


@dataclass(frozen=True)
class Request:
    """Continue problem ``problem``'s partial ``response`` by at most ``want`` new tokens."""

    problem: int
    response: tuple[int, ...]
    want: int


@dataclass(frozen=True)
class Continuation:
    """What the engine returned for one request."""

    tokens: tuple[int, ...]  # new tokens; with stop ids, the last one is the separator (or eos)
    logprob: float  # sum of the tokens' log-probs under the raw policy (temperature 1)
    finished: bool  # ended with eos


class BudgetedGenerator:
    """The engine behind per-problem token accounting (module docstring).

    Args:
        engine: any :class:`~creditrl.policy.engines.base.GenerationEngine`.
        prompts: per problem, its prompt token ids (bos + prompt).
        budget: generated tokens allowed per problem (>= 1).
        stop_ids: token ids that end a step (``step_stop_ids``), used by ``step=True`` calls.
        temperature, top_p: sampling of non-greedy calls.
        seed: seeds the one ``torch.Generator`` all calls draw from.
        max_rows: most requests per engine call.
    """

    def __init__(
        self,
        engine: GenerationEngine,
        prompts: Sequence[Sequence[int]],
        budget: int,
        *,
        stop_ids: tuple[int, ...] = (),
        temperature: float = 1.0,
        top_p: float = 1.0,
        seed: int = 0,
        max_rows: int = 1024,
    ) -> None:
        if budget < 1:
            raise ValueError(f"budget must be >= 1 generated token per problem, got {budget}")
        self.engine = engine
        self.prompts = [list(p) for p in prompts]
        self.budget = budget
        self.stop_ids = tuple(stop_ids)
        self.temperature = temperature
        self.top_p = top_p
        self.max_rows = max_rows
        self.generator = torch.Generator().manual_seed(seed)
        self.used = [0] * len(self.prompts)
        self.calls = 0

    def generate(
        self,
        requests: Sequence[Request],
        *,
        step: bool,
        greedy: bool = False,
        reserve: Sequence[int] | None = None,
        floor: int = 1,
    ) -> list[Continuation | None]:
        """Serve ``requests`` in one batched engine call; None for a request left without budget.

        ``step``: stop each continuation after one step (the engine's ``stop_ids``); otherwise run
        to eos. ``greedy``: temperature 0. ``reserve[p]``: tokens of problem p not to be spent here.
        ``floor``: a request that cannot get ``min(want, floor)`` tokens is not sent (:func:`water_fill`).
        """
        caps = [0] * len(requests)
        by_problem: dict[int, list[int]] = {}
        for i, r in enumerate(requests):
            by_problem.setdefault(r.problem, []).append(i)
        for p, idx in by_problem.items():
            available = self.budget - self.used[p] - (reserve[p] if reserve is not None else 0)
            for i, cap in zip(idx, water_fill([max(0, requests[i].want) for i in idx], available, floor)):
                caps[i] = cap
        served = [i for i, cap in enumerate(caps) if cap > 0]
        out: list[Continuation | None] = [None] * len(requests)
        for start in range(0, len(served), self.max_rows):
            chunk = served[start : start + self.max_rows]
            params = SamplingParams(
                max_new_tokens=max(caps[i] for i in chunk),
                temperature=0.0 if greedy else self.temperature,
                top_p=self.top_p,
                stop_ids=self.stop_ids if step else (),
            )
            gen = self.engine.generate(
                [self.prompts[requests[i].problem] + list(requests[i].response) for i in chunk],
                1,
                params,
                generator=self.generator,
                budgets=[caps[i] for i in chunk],
            )
            self.calls += 1
            for i, tokens, logprobs, finished in zip(chunk, gen.tokens, gen.logprobs, gen.finished):
                if len(tokens) > caps[i]:
                    raise RuntimeError(f"the engine returned {len(tokens)} tokens for a request capped at {caps[i]}")
                self.used[requests[i].problem] += len(tokens)
                out[i] = Continuation(tuple(tokens), float(sum(logprobs)), bool(finished))
        return out
