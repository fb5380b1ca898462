"""The ``unit_tests`` reward source: the share of a task's unit tests a completion passes.

Sequence granularity: one score in [0, 1] per response. The task runs the tests (for the
``code`` task: in the sandbox, :mod:`creditrl.sandbox`) through its ``test_results_batch``
method, so a whole batch runs in parallel and its verdicts are shared with the task's outcome
check. A program that crashes, hangs, floods its output or tries to cheat simply passes fewer
tests; the harness never raises for a misbehaving program, so ``reward/errors`` counts only
failures of the harness itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from creditrl.rewards.sources import RewardSource, register_source_factory
from creditrl.tasks.base import Problem, Task


def unit_test_fractions(task: Task, problems: Sequence[Problem], completions: Sequence[str]) -> list[float]:
    """Per response, the fraction of its problem's unit tests passed.

    Raises:
        TypeError: If ``task`` has no unit tests (no ``test_results_batch``).
    """
    run = getattr(task, "test_results_batch", None)
    if run is None:
        raise TypeError(
            f"reward source 'unit_tests' needs a task with unit tests (e.g. 'code'); task '{task.name}' has none"
        )
    return [sum(r) / len(r) if r else 0.0 for r in run(problems, completions)]


def _score(task: Task, problem: Problem, completion: str, spans: Sequence[str]) -> list[float | None]:
    return [unit_test_fractions(task, [problem], [completion])[0]]


def _score_batch(
    task: Task, problems: Sequence[Problem], completions: Sequence[str], spans: Sequence[Sequence[str]]
) -> list[list[float | None]]:
    return [[f] for f in unit_test_fractions(task, problems, completions)]


# A factory (with no options) because register_source cannot attach a batch_fn.
@register_source_factory("unit_tests", granularities=("sequence",), default="sequence")
def _unit_tests_source(options: dict[str, Any]) -> RewardSource:
    return RewardSource("unit_tests", frozenset({"sequence"}), "sequence", _score, _score_batch)
