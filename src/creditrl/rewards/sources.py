"""Reward sources and the scoring stage.

A reward source scores one response and declares its granularity (the placement its scores
need)::

    fn(task, problem, completion, segments) -> list[float | None]

``segments`` are the response's step texts from the segmenter; a ``step`` source returns one
score per segment (``None`` = no label: nothing is placed there), a ``sequence`` source one
float. The scoring stage runs a source over a batch
under an explicit error policy: a source that raises, returns NaN/inf, or the wrong number of
scores is never silently used (``raise`` stops, ``zero`` scores it 0.0, ``skip`` drops the
response from the loss); each such response is counted in ``reward/errors``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

from creditrl.tasks.base import Problem, Task

SourceFn = Callable[[Task, Problem, str, Sequence[str]], list[float | None]]
ERROR_POLICIES = ("raise", "zero", "skip")


@dataclass(frozen=True)
class RewardSource:
    name: str
    granularity: str  # a placement name: "sequence" or "step"
    fn: SourceFn


REWARD_SOURCES: dict[str, RewardSource] = {}


def register_source(name: str, granularity: str) -> Callable[[SourceFn], SourceFn]:
    def deco(fn: SourceFn) -> SourceFn:
        if name in REWARD_SOURCES:
            raise ValueError(f"reward source '{name}' is already registered")
        REWARD_SOURCES[name] = RewardSource(name, granularity, fn)
        return fn

    return deco


def get_source(name: str) -> RewardSource:
    if name not in REWARD_SOURCES:
        raise ValueError(f"unknown reward source '{name}'; valid: {', '.join(sorted(REWARD_SOURCES))}")
    return REWARD_SOURCES[name]


@register_source("outcome", granularity="sequence")
def outcome_reward(task: Task, problem: Problem, completion: str, segments: Sequence[str]) -> list[float]:
    """1.0 when the task's outcome checker accepts the completion, else 0.0."""
    return [1.0 if task.check_outcome(problem, completion) else 0.0]


@register_source("oracle_steps", granularity="step")
def oracle_step_reward(
    task: Task, problem: Problem, completion: str, segments: Sequence[str]
) -> list[float | None]:
    """1.0 / 0.0 per step from the task's step checker, up to and including the first error.

    Steps after the first incorrect one carry no label (``None``), as in PRM800K and
    Math-Shepherd: once a solution has gone wrong, later steps are not evidence about the
    policy's step quality, and labelling the whole cascade wrong would pile negative credit onto
    the correct steps before the error. The answer step's label is the outcome.
    """
    scores: list[float | None] = []
    for ok in task.check_steps(problem, list(segments)):
        scores.append(1.0 if ok else 0.0)
        if not ok:
            break
    return scores + [None] * (len(segments) - len(scores))


@dataclass
class ScoreResult:
    scores: list[list[float | None]]  # per response, ready for placement
    keep: list[bool]  # False for responses dropped by the ``skip`` policy
    errors: int
    first_error: str | None


def score_batch(
    source: RewardSource,
    task: Task,
    problems: Sequence[Problem],
    completions: Sequence[str],
    segments: Sequence[Sequence[str]],
    *,
    on_error: str = "raise",
) -> ScoreResult:
    """Score every response with ``source`` under the ``on_error`` policy (see module doc)."""
    if on_error not in ERROR_POLICIES:
        raise ValueError(f"unknown reward error policy '{on_error}'; valid: {', '.join(ERROR_POLICIES)}")
    scores: list[list[float | None]] = []
    keep: list[bool] = []
    errors, first = 0, None
    for i, (prob, comp, segs) in enumerate(zip(problems, completions, segments)):
        expected = 1 if source.granularity == "sequence" else len(segs)
        try:
            out = [None if x is None else float(x) for x in source.fn(task, prob, comp, segs)]
            if len(out) != expected:
                raise ValueError(f"returned {len(out)} scores, expected {expected}")
            if source.granularity == "sequence" and out[0] is None:
                raise ValueError("a sequence-level source must return a score, got None")
            if not all(x is None or math.isfinite(x) for x in out):
                raise ValueError(f"returned a non-finite score {out}")
        except Exception as exc:  # noqa: BLE001 - any failure of user code is subject to the policy
            msg = f"reward source '{source.name}' failed on response {i} (prompt {prob.prompt!r}): {exc}"
            if on_error == "raise":
                raise RuntimeError(msg) from exc
            errors += 1
            first = first or msg
            out = [0.0] * expected
            keep.append(on_error != "skip")
        else:
            keep.append(True)
        scores.append(out)
    return ScoreResult(scores=scores, keep=keep, errors=errors, first_error=first)
