"""Credit precision: how much of the negative credit lands on steps that are truly wrong.

For one response with oracle step labels (the task's step checker, one label per step) and
advantages ``A_t`` over its tokens, write ``n_t = max(0, -A_t)`` for the negative credit on token
t, ``W`` for the tokens of the steps labelled wrong and ``S`` for the tokens of all labelled steps.
Then

    credit_precision = sum_{t in W} n_t / sum_{t in S} n_t

in [0, 1]: 1 when every push-down hits a wrong step, 0 when it hits only correct ones; undefined
(None) when no negative credit falls on a labelled token. For a group, an estimator or an
iteration the numerator and denominator are summed over the responses first (a ratio of sums, so
a response weighs by the negative credit it carries). Tokens outside ``response_mask`` carry
``A_t = 0``; responses without labels (a task without a step checker) are skipped.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class NegativeCredit:
    """Negative credit on wrong steps (``wrong``) and on all labelled steps (``labelled``)."""

    wrong: float = 0.0
    labelled: float = 0.0

    def __add__(self, other: NegativeCredit) -> NegativeCredit:
        return NegativeCredit(self.wrong + other.wrong, self.labelled + other.labelled)

    @property
    def precision(self) -> float | None:
        """``wrong / labelled``, or None when no negative credit fell on a labelled token."""
        return self.wrong / self.labelled if self.labelled > 0 else None


def negative_credit(
    advantages: Sequence[float], steps: Sequence[Sequence[int]], labels: Sequence[bool | None]
) -> NegativeCredit:
    """Sums of ``max(0, -A_t)`` for one response: ``advantages`` (L,), ``steps`` the
    ``[start, end]`` (inclusive) token span of each step, ``labels`` one per step (True =
    correct, False = wrong, None = unlabelled, skipped)."""
    if len(steps) != len(labels):
        raise ValueError(f"{len(steps)} steps but {len(labels)} labels; expected one label per step")
    wrong = labelled = 0.0
    for (start, end), label in zip(steps, labels):
        if label is None:
            continue
        n = sum(max(0.0, -a) for a in advantages[start : end + 1])
        labelled += n
        if not label:
            wrong += n
    return NegativeCredit(wrong, labelled)


def pooled(parts: Iterable[NegativeCredit]) -> NegativeCredit:
    """The sum of several responses' negative credit (the ratio of sums above)."""
    return sum(parts, NegativeCredit())


def percent(value: float | None) -> str:
    """How the report prints a precision: ``"73.4%"``, or ``"n/a"`` when undefined."""
    return "n/a" if value is None else f"{100 * value:.1f}%"
