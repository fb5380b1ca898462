"""Monte-Carlo continuations of prefixes: the one routine behind VinePPO values
(:func:`creditrl.values.mc.mc_values`) and Math-Shepherd step labels
(:func:`creditrl.prm.labels.mc_labels`).

Both estimate, for a state ``s`` = (prompt, response so far), the mean outcome of ``n`` fresh
continuations sampled from a policy::

    f(s) = (1/n) sum_{j=1..n} judge(owner(s), response(s) + c_j),   c_j ~ engine( . | s)

Identical states are estimated once (:class:`PrefixSet` keys them; a caller chooses the key), all
in one engine call (or in calls of at most ``max_prefixes_per_call`` prefixes, each holding at most
``max_rows`` rows and ``max_positions`` padded cache positions at once); outcomes keep sampling order.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from creditrl.policy.engines import GenerationEngine, SamplingParams, generate_chunked

Judge = Callable[[Any, list[int]], float]
"""``judge(owner, response_tokens) -> outcome`` of a whole response (prefix + continuation)."""


@dataclass
class Prefix:
    prompt: list[int]  # prompt token ids (no padding)
    response: list[int]  # response tokens before the continuation
    owner: Any  # what judges the continuations: the first row / problem that reached this state


@dataclass
class PrefixSet:
    """Distinct prefixes in order of first appearance; :meth:`add` returns a prefix's index."""

    prefixes: list[Prefix] = field(default_factory=list)
    _index: dict[Hashable, int] = field(default_factory=dict)

    def add(self, key: Hashable, prompt: Sequence[int], response: Sequence[int], owner: Any) -> int:
        if key not in self._index:
            self._index[key] = len(self.prefixes)
            self.prefixes.append(Prefix(list(prompt), list(response), owner))
        return self._index[key]

    def __len__(self) -> int:
        return len(self.prefixes)


@dataclass
class Continued:
    outcomes: list[list[float]]  # per prefix: each continuation's outcome in sampling order
    sampled: int  # prefixes that were continued (the others had no budget left)
    n_tokens: int  # tokens the engine returned for them (an engine that ignores budgets returns more)

    def means(self) -> list[float]:
        return [sum(o) / len(o) for o in self.outcomes]


def continue_prefixes(
    engine: GenerationEngine,
    prefixes: Sequence[Prefix],
    judge: Judge,
    *,
    n: int,
    params: SamplingParams,
    generator: torch.Generator | None,
    budget_total: int | None = None,
    max_prefixes_per_call: int | None = None,
    max_rows: int | None = None,
    max_positions: int | None = None,
) -> Continued:
    """Sample ``n`` continuations of every prefix and judge each whole response.

    ``budget_total``: the responses could hold this many tokens, so a prefix of p response tokens
    is continued by at most ``budget_total - p`` (the engine is told each budget and every
    continuation is also cut to it, for engines that ignore budgets: the first k tokens of a longer
    sample have the distribution of a k-token sample); a prefix with no budget left is not sampled
    and its one outcome is ``judge`` of the prefix itself. Without it every continuation may take
    ``params.max_new_tokens``.

    Raises:
        ValueError: On ``n < 1``, ``max_prefixes_per_call < 1`` or ``max_rows < 1``.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if max_prefixes_per_call is not None and max_prefixes_per_call < 1:
        raise ValueError(f"max_prefixes_per_call must be >= 1 or None, got {max_prefixes_per_call}")
    if max_rows is not None and max_rows < 1:
        raise ValueError(f"max_rows must be >= 1 or None, got {max_rows}")
    outcomes: list[list[float]] = [[] for _ in prefixes]
    todo = list(range(len(prefixes)))
    if budget_total is not None:
        todo = [i for i in todo if len(prefixes[i].response) < budget_total]
        for i in sorted(set(range(len(prefixes))) - set(todo)):
            outcomes[i] = [float(judge(prefixes[i].owner, prefixes[i].response))]
    n_tokens = 0
    chunk = max_prefixes_per_call or max(1, len(todo))
    for start in range(0, len(todo), chunk):
        part = todo[start : start + chunk]
        requests = [prefixes[i].prompt + prefixes[i].response for i in part]
        budgets = None if budget_total is None else [budget_total - len(prefixes[i].response) for i in part]
        kwargs = {} if budgets is None else {"budgets": budgets}
        if max_rows is None and max_positions is None:
            gen = engine.generate(requests, n, params, generator=generator, **kwargs)
        else:
            rows = max_rows or n * len(requests)
            gen = generate_chunked(
                engine, requests, n, params, generator=generator, max_rows=rows, max_positions=max_positions, **kwargs
            )
        for request, tokens in zip(gen.prompt_index, gen.tokens):
            prefix = prefixes[part[request]]
            kept = list(tokens) if budgets is None else list(tokens)[: budgets[request]]
            outcomes[part[request]].append(float(judge(prefix.owner, prefix.response + kept)))
            n_tokens += len(tokens)
    return Continued(outcomes, len(todo), n_tokens)
