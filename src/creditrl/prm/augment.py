"""Negative augmentation for the arithmetic step format: corrupted steps as labelled negatives.

A PRM trained only on the errors a policy happens to make can learn what those errors look
like (longer, rarer operands, late in a solution) instead of checking the step. Corrupting
one correct step of a correct prefix gives minimal pairs -- same prefix, same step shape, only
the result differs -- whose label is known without running anything: the corrupted step is
wrong by :meth:`creditrl.tasks.arithmetic.ArithmeticTask.check_steps`.

Corruptions keep the surface of a real step: the result is a canonical integer (no leading
zeros, no ``+``, ``-`` only for negatives) of the same sign as the true result and, where
possible, the same number of characters, so neither a sign nor a length gives it away.
"""

from __future__ import annotations

import dataclasses
import random
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from creditrl.prm.data import StepwiseExample

__all__ = ["corrupt_step", "augment_negatives"]

# [0-9], not \d: \d also matches non-ASCII digits, which the task's checker rejects anyway.
_STEP_RE = re.compile(r"(-?[0-9]+)([+\-*])([0-9]+)=(-?[0-9]+)(;?)")
_ANSWER_RE = re.compile(r"#(-?[0-9]+)")
_DELTAS = (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 20)


def _apply(a: int, op: str, b: int) -> int:
    return a * b if op == "*" else a + b if op == "+" else a - b


def _digit_swaps(value: int) -> list[int]:
    """Values with two adjacent different digits of ``value`` swapped (no leading zero)."""
    sign, digits = ("-", str(-value)) if value < 0 else ("", str(value))
    out = []
    for i in range(len(digits) - 1):
        if digits[i] != digits[i + 1]:
            swapped = digits[:i] + digits[i + 1] + digits[i] + digits[i + 2 :]
            if swapped[0] != "0":
                out.append(int(sign + swapped))
    return out


def _wrong_value(true: int, avoid: int, rng: random.Random) -> int:
    """A value != ``true`` and != ``avoid``: ``true`` +- a small delta or with two digits
    swapped, of the same sign as ``true`` and preferably the same written length."""
    candidates = {true + d for d in _DELTAS} | {true - d for d in _DELTAS} | set(_digit_swaps(true))
    candidates = {c for c in candidates if c not in (true, avoid) and (c < 0) == (true < 0)}
    same_length = sorted(c for c in candidates if len(str(c)) == len(str(true)))
    return rng.choice(same_length or sorted(candidates))


def corrupt_step(step: str, rng: random.Random) -> str | None:
    """A wrong version of one arithmetic step, or None when the text is not a step it knows.

    - ``"a{op}b=c"`` (optionally with its trailing ``";"``, which is kept): ``c`` becomes a
      canonical integer different from the true ``a op b`` (and from ``c``), so the result is
      wrong whatever ``c`` was.
    - ``"#x"`` (the answer step): ``x`` becomes a different integer. Whether ``#x`` was right
      depends on the problem, so the result is certainly wrong only when ``x`` was the right
      answer -- as in :func:`augment_negatives`, which corrupts only positive steps.

    Anything else (no match of the canonical pattern) gives None.
    """
    m = _STEP_RE.fullmatch(step)
    if m is not None:
        a, op, b, c, sep = int(m[1]), m[2], int(m[3]), int(m[4]), m[5]
        wrong = _wrong_value(_apply(a, op, b), c, rng)
        return f"{m[1]}{op}{m[3]}={wrong}{sep}"  # operands verbatim: only the result changes
    m = _ANSWER_RE.fullmatch(step)
    if m is not None:
        x = int(m[1])
        return f"#{_wrong_value(x, x, rng)}"
    return None


def _candidates(example: StepwiseExample, rng: random.Random) -> list[tuple[int, str]]:
    """(index, corrupted text) of every step that makes ``example`` eligible (:func:`augment_negatives`)."""
    out = []
    for k, (step, label) in enumerate(zip(example.completions, example.labels)):
        if label is not None and label < 0.5:
            break  # first error: nothing after it is a correct step in a correct prefix
        if label is None:
            continue
        corrupted = corrupt_step(step, rng)
        if corrupted is not None:
            out.append((k, corrupted))
    return out


def augment_negatives(examples: Sequence[StepwiseExample], *, rate: float, rng: random.Random) -> list[StepwiseExample]:
    """``examples`` followed by corrupted copies of a ``rate`` share of the eligible ones.

    An example is eligible when some step k is labelled positive (>= 0.5), no step before k
    is labelled negative (unlabelled ``None`` steps are allowed) and :func:`corrupt_step`
    can corrupt step k. ``round(rate * n_eligible)`` eligible examples are drawn with ``rng``;
    each gets one copy in which a uniformly drawn such step k is corrupted and labelled 0.0,
    steps before k keep their texts and labels, and steps after k are dropped (the
    first-error convention of PRM800K: after a wrong step, later steps carry no label).
    ``meta`` of a copy adds ``augmented="corrupt_step"``, ``corrupted_step=k`` and
    ``source_index`` (the original's index in ``examples``).
    """
    if not 0.0 <= rate <= 1.0:
        raise ValueError(f"rate must be in [0, 1], got {rate}")
    eligible = [(i, options) for i, ex in enumerate(examples) if (options := _candidates(ex, rng))]
    chosen = rng.sample(eligible, round(rate * len(eligible)))
    chosen.sort(key=lambda item: item[0])
    negatives = []
    for i, options in chosen:
        ex = examples[i]
        k, corrupted = rng.choice(options)
        negatives.append(
            dataclasses.replace(
                ex,
                completions=[*ex.completions[:k], corrupted],
                labels=[*ex.labels[:k], 0.0],
                meta={**ex.meta, "augmented": "corrupt_step", "corrupted_step": k, "source_index": i},
            )
        )
    return [*examples, *negatives]
