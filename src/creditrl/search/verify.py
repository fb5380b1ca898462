"""Judging partial and complete responses: PRM step scores, ORM scores and the task's checker.

A response text is split into steps with :func:`creditrl.prm.pipeline.to_steps` (each step keeps
its separator; a trailing piece without one, e.g. ``"#8"``, is a step too). The PRM gives a
probability per step; a step that did not fit the PRM's context scores NaN, read as 0.0 (no
evidence the step is right). An ORM is a PRM trained on outcome labels: its solution score is the
score of the last step. A response without any step (empty text) scores ``()`` / 0.0 without a
model call. Scores are cached by ``(problem, text)``: the PRM is causal, so a prefix's scores
never change, and each round's new texts go to the model in one batched ``score`` call. A task
without a step separator can be judged only by its outcome checker (greedy, majority vote).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from transformers import PreTrainedTokenizerBase

from creditrl.prm.metrics import aggregate_steps
from creditrl.prm.pipeline import to_steps
from creditrl.prm.public import StepScorer
from creditrl.tasks.base import Problem, Task

ScoredModel = tuple[StepScorer, PreTrainedTokenizerBase]
"""A PRM / ORM and its tokenizer: creditrl's :class:`~creditrl.prm.model.ProcessRewardModel` or a
public PRM (:class:`~creditrl.prm.public.PublicPRM`), as :func:`creditrl.prm.source.load_prm` gives."""


def prefix_score(aggregation: str, step_scores: Sequence[float]) -> float:
    """A partial solution's score: ``aggregate_steps(aggregation, step_scores)``; 0.0 without steps."""
    return aggregate_steps(aggregation, step_scores) if step_scores else 0.0


class Verifier:
    """Scores responses to ``problems`` with an optional PRM and ORM (``(model, tokenizer)`` pairs)."""

    def __init__(
        self,
        task: Task,
        problems: Sequence[Problem],
        *,
        prm: ScoredModel | None = None,
        orm: ScoredModel | None = None,
        batch_size: int = 64,
    ) -> None:
        self.task = task
        self.problems = list(problems)
        self.prm = prm
        self.orm = orm
        self.batch_size = batch_size
        self._cache: dict[tuple[str, int, str], tuple[float, ...]] = {}

    def _scores(self, which: str, items: Sequence[tuple[int, str]]) -> list[tuple[float, ...]]:
        pair = self.prm if which == "prm" else self.orm
        if pair is None:
            raise ValueError(f"no {which.upper()} was given, but a score from one was asked for")
        model, tokenizer = pair
        sep = self.task.step_separator
        if sep is None:
            raise ValueError(f"task '{self.task.name}' has no step separator; a {which.upper()} scores steps")
        todo: dict[tuple[str, int, str], list[str]] = {}
        for p, text in items:
            key = (which, p, text)
            if key not in self._cache and key not in todo:
                steps = to_steps(text, sep)
                if steps:
                    todo[key] = steps
                else:
                    self._cache[key] = ()
        if todo:
            keys = list(todo)
            rows = model.score(
                tokenizer, [(self.problems[p].prompt, todo[(w, p, t)]) for w, p, t in keys], batch_size=self.batch_size
            )
            for key, row in zip(keys, rows):
                self._cache[key] = tuple(0.0 if math.isnan(x) else float(x) for x in row)
        return [self._cache[(which, p, text)] for p, text in items]

    def prm_steps(self, items: Sequence[tuple[int, str]]) -> list[tuple[float, ...]]:
        """Per ``(problem index, response text)``: the PRM's probability of each step."""
        return self._scores("prm", items)

    def orm_scores(self, items: Sequence[tuple[int, str]]) -> list[float]:
        """Per ``(problem index, response text)``: the ORM's score of the last step (0.0 without steps)."""
        return [row[-1] if row else 0.0 for row in self._scores("orm", items)]

    def outcome(self, problem: int, text: str) -> bool:
        """The task's outcome checker (uses the answer key)."""
        return bool(self.task.check_outcome(self.problems[problem], text))
