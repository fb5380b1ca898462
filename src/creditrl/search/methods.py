"""Test-time search methods by name, and :func:`search`, the one entry point.

Every method has one signature, ``fn(ctx: SearchContext) -> [response tokens per problem]``, runs
all problems in lockstep and generates only through ``ctx.gen`` (the budgeted engine, see
:mod:`.expand`), so the tokens charged to a problem are exactly the tokens the engine returned
for it, and never more than ``budget``.

* ``greedy``: one greedy completion (``min(max_new_tokens, budget)`` new tokens at most).
* ``best_of_n``: N completions sampled at ``temperature`` in one call, water-filled into the
  budget (each gets ``min(max_new_tokens, ~budget / N)``; with N > budget only the first
  ``budget`` samples are drawn, one token each); the pick is ``creditrl.prm.metrics.select(selector, ...)``
  (``prm_min|prm_product|prm_last|prm_mean|orm|majority``). A completion without any step has
  PRM step scores ``(0.0,)`` and ORM score 0.0; majority votes on the task's answers
  (:func:`creditrl.tasks.base.answer_of`), grouped by the task's ``same_answer``
  (:func:`creditrl.tasks.base.same_answer`).
* ``beam``: :mod:`.beam`. ``mcts``: :mod:`.mcts`.

Beam search, MCTS and the PRM / ORM selectors need a task with a step separator; greedy and
majority vote run on any task (:func:`require_steps`).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from transformers import PreTrainedTokenizerBase

from creditrl.config import SearchConfig
from creditrl.errors import ConfigError, unknown_choice
from creditrl.policy.engines import GenerationEngine
from creditrl.policy.tokenizer import encode_problem
from creditrl.prm.metrics import AGGREGATIONS, SELECTORS, Candidate, select
from creditrl.rollout.segment import step_stop_ids
from creditrl.search.beam import run_beam
from creditrl.search.context import SearchContext
from creditrl.search.expand import BudgetedGenerator
from creditrl.search.mcts import run_mcts
from creditrl.search.verify import ScoredModel, Verifier
from creditrl.tasks.base import Problem, Task, answer_of, majority_note, same_answer


@dataclass(frozen=True)
class Sampled:
    """One best-of-N sample: what a selector sees, its text and its generated tokens."""

    candidate: Candidate
    completion: str
    tokens: tuple[int, ...]


def sample_candidates(ctx: SearchContext, n: int, *, prm: bool, orm: bool) -> list[list[Sampled]]:
    """Per problem, its (up to) ``n`` sampled completions in sampling order, scored by the PRM
    and/or ORM when asked. Samples the budget could not pay for are left out (at least one per
    problem is always paid for, since budget >= 1)."""
    requests = [ctx.request(p, ()) for p in range(len(ctx.problems)) for _ in range(n)]
    conts = ctx.gen.generate(requests, step=False)
    kept = [(r.problem, c, ctx.text(c.tokens)) for r, c in zip(requests, conts) if c is not None]
    items = [(p, text) for p, _, text in kept]
    steps = ctx.verify.prm_steps(items) if prm else [None] * len(kept)
    orms = ctx.verify.orm_scores(items) if orm else [None] * len(kept)
    groups: list[list[Sampled]] = [[] for _ in ctx.problems]
    for (p, c, text), s, o in zip(kept, steps, orms):
        candidate = Candidate(
            correct=ctx.verify.outcome(p, text),
            step_scores=(s or (0.0,)) if prm else (),
            orm_score=o,
            answer=answer_of(ctx.verify.task, text),
        )
        groups[p].append(Sampled(candidate, text, c.tokens))
    return groups


def run_greedy(ctx: SearchContext) -> list[tuple[int, ...]]:
    return ctx.complete_greedily([(p, ()) for p in range(len(ctx.problems))])


def run_best_of_n(ctx: SearchContext) -> list[tuple[int, ...]]:
    cfg = ctx.cfg
    groups = sample_candidates(ctx, cfg.n, prm=cfg.selector.startswith("prm_"), orm=cfg.selector == "orm")
    same = functools.partial(same_answer, ctx.verify.task)
    picks = [group[select(cfg.selector, [s.candidate for s in group], same=same)] for group in groups]
    return [s.tokens for s in picks]


METHODS: dict[str, Callable[[SearchContext], list[tuple[int, ...]]]] = {
    "greedy": run_greedy,
    "best_of_n": run_best_of_n,
    "beam": run_beam,
    "mcts": run_mcts,
}
"""Search methods by name (the keys are ``config.METHOD_NAMES``)."""


@dataclass
class ProblemResult:
    prompt: str
    completion: str
    correct: bool
    tokens: int  # generated tokens charged to this problem (all engine output for it)


@dataclass
class SearchResult:
    config: SearchConfig
    problems: list[ProblemResult]
    engine_calls: int
    wall_s: float
    note: str = ""  # e.g. that majority voted on whole completions (a task without extract_answer)

    @property
    def accuracy(self) -> float:
        return sum(r.correct for r in self.problems) / max(1, len(self.problems))

    @property
    def tokens_total(self) -> int:
        return sum(r.tokens for r in self.problems)

    @property
    def tokens_mean(self) -> float:
        return self.tokens_total / max(1, len(self.problems))

    def summary(self) -> dict[str, Any]:
        return {
            "method": self.config.method,
            "setting": self.config.describe(),
            "budget": self.config.budget,
            "problems": len(self.problems),
            "accuracy": self.accuracy,
            "tokens_total": self.tokens_total,
            "tokens_per_problem": self.tokens_mean,
            "tokens_max": max((r.tokens for r in self.problems), default=0),
            "engine_calls": self.engine_calls,
            "wall_s": self.wall_s,
        }


def require_models(config: SearchConfig, *, has_prm: bool, has_orm: bool) -> None:
    """Check the registry names of ``config`` (``search.selector``, ``search.aggregation``) and
    that the PRM / ORM it needs are given.

    Raises:
        ConfigError (a ValueError): On an unknown name (listing the valid ones), or a missing model
            (the message names the method, its settings and the missing model).
    """
    if config.selector not in SELECTORS:
        raise unknown_choice("search.selector", config.selector, SELECTORS)
    if config.aggregation not in AGGREGATIONS:
        raise unknown_choice("search.aggregation", config.aggregation, AGGREGATIONS)
    if config.needs_prm and not has_prm:
        raise ConfigError(
            f"method '{config.method}' ({config.describe()}) needs a PRM to score steps: "
            "pass prm=(model, tokenizer) (CLI: search.prm=DIR or reward.prm=DIR)"
        )
    if config.needs_orm and not has_orm:
        raise ConfigError(
            f"method '{config.method}' ({config.describe()}) needs an ORM to judge solutions: "
            "pass orm=(model, tokenizer) (CLI: search.orm=DIR)"
        )


def require_steps(config: SearchConfig, task: Task) -> None:
    """Check that ``task`` has the steps ``config`` needs: beam search and MCTS expand steps and
    the PRM / ORM selectors score them; greedy and majority vote run on any task.

    Raises:
        ConfigError (a ValueError): Naming the method or selector, when the task has no step separator.
    """
    if task.step_separator is not None:
        return
    if config.method in ("beam", "mcts"):
        raise ConfigError(
            f"search.method: '{config.method}' expands reasoning steps, but task '{task.name}' has no step separator"
        )
    if config.needs_prm or config.needs_orm:
        raise ConfigError(
            f"search.selector: '{config.selector}' scores steps with a model, but task '{task.name}' "
            "has no step separator; use majority"
        )


def make_context(
    problems: Sequence[Problem],
    *,
    engine: GenerationEngine,
    tokenizer: PreTrainedTokenizerBase,
    task: Task,
    config: SearchConfig,
    prm: ScoredModel | None = None,
    orm: ScoredModel | None = None,
) -> SearchContext:
    """Validate ``config`` against what was given (:func:`require_models`, :func:`require_steps`)
    and build the shared search state; ValueError without problems."""
    require_models(config, has_prm=prm is not None, has_orm=orm is not None)
    require_steps(config, task)
    if not problems:
        raise ValueError("search needs at least one problem")
    verify = Verifier(task, problems, prm=prm, orm=orm)
    gen = BudgetedGenerator(
        engine,
        [encode_problem(tokenizer, p) for p in problems],
        config.budget,
        stop_ids=step_stop_ids(tokenizer, task.step_separator) if task.step_separator else (),
        temperature=config.temperature,
        top_p=config.top_p,
        seed=config.seed,
    )
    return SearchContext(list(problems), config, tokenizer, gen, verify)


def search(
    problems: Sequence[Problem],
    *,
    engine: GenerationEngine,
    tokenizer: PreTrainedTokenizerBase,
    task: Task,
    config: SearchConfig,
    prm: ScoredModel | None = None,
    orm: ScoredModel | None = None,
) -> SearchResult:
    """Run ``config.method`` on ``problems``; accuracy is the task's outcome check of each answer.

    ``prm`` / ``orm``: ``(scorer, tokenizer)`` pairs (a creditrl or public PRM), e.g. from
    :func:`creditrl.prm.source.load_prm`.
    """
    start = time.time()
    ctx = make_context(problems, engine=engine, tokenizer=tokenizer, task=task, config=config, prm=prm, orm=orm)
    answers = METHODS[config.method](ctx)
    rows = []
    for p, (problem, tokens) in enumerate(zip(ctx.problems, answers)):
        text = ctx.text(tokens)
        rows.append(ProblemResult(problem.prompt, text, ctx.verify.outcome(p, text), ctx.gen.used[p]))
    note = majority_note(task) if config.method == "best_of_n" and config.selector == "majority" else ""
    return SearchResult(config, rows, ctx.gen.calls, time.time() - start, note)
