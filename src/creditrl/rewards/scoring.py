"""The scoring stage: one reward source run over a batch under an explicit error policy.

A score is a real number, a bool or ``None`` (numpy scalars included, :func:`score_value`);
``None`` is "no label": nothing is placed on that span. A source that raises, returns NaN/inf,
a score of another type, the wrong number of scores, or runs over ``reward.timeout_s`` is never
silently used (``raise`` stops with one line naming it, ``zero`` scores it 0.0, ``skip`` drops
the response from the loss); each such response is counted in ``reward/errors`` and per source
in ``reward/errors/<source>`` / ``reward/timeouts/<source>``.
"""

from __future__ import annotations

import math
import numbers
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from creditrl.config.types import OnError
from creditrl.rewards.source_registry import RewardSource, check_granularity
from creditrl.tasks.base import Problem, Task
from creditrl.tasks.bounded import Outcome, UserFunctionError, shorten

ERROR_POLICIES = typing.get_args(OnError)


def score_value(value: Any) -> float | None:
    """One score as a float (``None`` stays ``None``): a real number or a bool, numpy scalars
    included. Anything else, text such as ``"1"`` included, is an error naming its type.

    Raises:
        ValueError: ``value`` is of another type (the message names it) or is NaN/inf.
    """
    if value is None:
        return None
    if isinstance(value, (bool, np.bool_, numbers.Real)) and not isinstance(value, np.ndarray):
        number = float(value)
        if not math.isfinite(number):
            raise ValueError(f"returned a non-finite score {number}")
        return number
    raise ValueError(
        f"returned a score of type {type(value).__name__} ({shorten(repr(value), 30)}); "
        "a score is a real number, a bool or None"
    )


def score_list(value: Any, expected: int, what: str) -> list[Any]:
    """``value`` as a list of ``expected`` items (a list, a tuple, or a 1-d numpy array or torch
    tensor, as TRL takes them); ``what`` names one item for the message (``"score"``, ``"span list"``).

    Raises:
        ValueError: ``value`` is of another type (the message names it) or of another length.
    """
    if getattr(value, "ndim", None) == 1 and callable(getattr(value, "tolist", None)):
        value = value.tolist()
    plural = what if expected == 1 else f"{what}s"
    if not isinstance(value, (list, tuple)):
        raise ValueError(
            f"returned a {type(value).__name__} ({shorten(repr(value), 30)}), expected a list of {expected} {plural}"
        )
    if len(value) != expected:
        raise ValueError(f"returned {len(value)} {what}s, expected {expected}")
    return list(value)


@dataclass
class ScoreResult:
    scores: list[list[float | None]]  # per response, ready for placement
    keep: list[bool]  # False for responses dropped by the ``skip`` policy
    errors: int  # failed responses, timeouts included
    first_error: str | None
    timeouts: int = 0  # of ``errors``, the calls over ``reward.timeout_s``
    nones: int = 0  # ``None`` scores ("does not apply": nothing placed) of responses that did not fail


# runs ``fn(problem, completion, spans)`` of a source on each argument tuple (a bounded worker), or
# a user source's ``user_fn(problems, completions, spans_list[, completion_ids])`` on one tuple
CallRunner = Callable[[Sequence[tuple[Any, ...]]], list[Outcome]]


def _check_arguments(
    source: RewardSource,
    granularity: str,
    on_error: str,
    problems: Sequence[Problem],
    completions: Sequence[str],
    spans: Sequence[Sequence[str]],
) -> None:
    """The errors of a call of :func:`score_batch` itself (whatever the policy)."""
    check_granularity(source, granularity)
    if on_error not in ERROR_POLICIES:
        raise ValueError(f"unknown reward error policy '{on_error}'; valid: {', '.join(ERROR_POLICIES)}")
    if not len(problems) == len(completions) == len(spans):
        raise ValueError(f"got {len(problems)} problems, {len(completions)} completions and {len(spans)} span lists")
    if granularity == "sequence":
        for i, row_spans in enumerate(spans):
            if len(row_spans) > 1:
                raise ValueError(
                    f"sequence granularity has one span per response (the last_token segmenter); "
                    f"response {i} has {len(row_spans)}"
                )


def _batch_scores(
    source: RewardSource,
    task: Task,
    problems: Sequence[Problem],
    completions: Sequence[str],
    spans: Sequence[Sequence[str]],
) -> list[list[float | None]] | None:
    """The source's ``batch_fn`` scores, or None (no batch_fn, or it failed: ``fn`` per response then)."""
    if source.batch_fn is None:
        return None
    try:
        batched = source.batch_fn(task, problems, completions, spans)
    except Exception:  # noqa: BLE001 - fall back to fn per response, under the error policy
        return None
    return batched if len(batched) == len(problems) else None


def _user_call(
    source: RewardSource,
    task: Task,
    rows: list[int],
    args: tuple[Any, ...],
    run: CallRunner | None,
) -> dict[int, Outcome]:
    """One call of a user source's ``user_fn`` on the ``rows`` that have spans (``args``: their
    problems, completions, spans and completion ids): each row's outcome, the call's error for
    every row when the call failed or returned a list of another length."""
    if not rows:
        return {}
    if run is not None:
        (outcome,) = run([args])
    else:
        try:
            outcome = Outcome(value=source.user_fn(task, *args))  # type: ignore[misc]
        except Exception as exc:  # noqa: BLE001 - under the error policy, like a bounded call's
            outcome = Outcome(error=f"{type(exc).__name__}: {exc}")
    if outcome.error is None:
        try:
            values = score_list(outcome.value, len(rows), "score")
        except ValueError as exc:
            outcome = Outcome(error=str(exc))
        else:
            return {i: Outcome(value=v) for i, v in zip(rows, values)}
    return dict.fromkeys(rows, outcome)


def score_batch(
    source: RewardSource,
    task: Task,
    problems: Sequence[Problem],
    completions: Sequence[str],
    spans: Sequence[Sequence[str]],
    *,
    granularity: str | None = None,
    on_error: str = "raise",
    first_index: int = 0,
    run: CallRunner | None = None,
    completion_ids: Sequence[Sequence[int]] | None = None,
) -> ScoreResult:
    """Score every response's spans with ``source`` under the ``on_error`` policy (module doc).

    ``granularity`` (default: the source's default) must be one the source supports
    (ValueError otherwise, whatever the policy). Every response needs ``len(spans[i])`` scores,
    each checked by :func:`score_value`. A response without spans (empty) has nothing to place:
    its score list is empty and the source is not called for it. ``first_index``: the index of
    ``problems[0]`` in a larger batch split among workers (error messages name the response by
    its index in that batch). ``run``: where the user's calls run (a
    :class:`~creditrl.tasks.bounded.BoundedCalls` worker bounded by ``reward.timeout_s``: a call
    over it is an error of its responses); default here, unbounded. A user source
    (``user_fn``) is called once for all responses with spans, with their ``completion_ids``
    when given; its failure is an error of each of them.
    """
    granularity = granularity or source.default_granularity
    _check_arguments(source, granularity, on_error, problems, completions, spans)
    rows = [i for i, row_spans in enumerate(spans) if len(row_spans)]
    called: dict[int, Outcome] = {}
    batched = None
    if source.user_fn is not None:
        ids = None if completion_ids is None else [list(completion_ids[i]) for i in rows]
        picked = ([problems[i] for i in rows], [completions[i] for i in rows], [list(spans[i]) for i in rows], ids)
        called = _user_call(source, task, rows, picked, run)
    else:
        batched = _batch_scores(source, task, problems, completions, spans)
        if batched is None and run is not None:
            called = dict(zip(rows, run([(problems[i], completions[i], spans[i]) for i in rows])))
    scores: list[list[float | None]] = []
    keep: list[bool] = []
    errors, timeouts, nones, first = 0, 0, 0, None
    for i, (prob, comp, row_spans) in enumerate(zip(problems, completions, spans)):
        expected = len(row_spans)
        if expected == 0:
            scores.append([])
            keep.append(True)
            continue
        timed_out = i in called and called[i].timed_out
        try:
            if i in called and called[i].error is not None:
                raise ValueError(called[i].error + (" (reward.timeout_s)" if timed_out else ""))
            raw = (
                batched[i]
                if batched is not None
                else called[i].value
                if i in called
                else source.fn(task, prob, comp, row_spans)
            )
            out = [score_value(x) for x in score_list(raw, expected, "score")]
        except Exception as exc:  # noqa: BLE001 - any failure of user code is subject to the policy
            msg = (
                f"reward source '{source.name}' failed on response {first_index + i} "
                f"({shorten(comp)!r}, prompt {shorten(prob.prompt)!r}): {exc}"
            )
            if on_error == "raise":
                raise UserFunctionError(msg) from exc
            errors += 1
            timeouts += int(timed_out)
            first = first or msg
            out = [0.0] * expected
            keep.append(on_error != "skip")
        else:
            nones += out.count(None)
            keep.append(True)
        scores.append(out)
    return ScoreResult(scores=scores, keep=keep, errors=errors, first_error=first, timeouts=timeouts, nones=nones)
