"""Verdicts on the claims: paired differences to a reference arm, their intervals, and the rule.

The primary metric is held-out greedy exact match on one fixed set of problems (the same for
every arm and seed: ``train.eval_size`` problems drawn with the evaluation seed). Every run
records each problem's outcome at every evaluation (``eval/correct``), so an arm and the
reference are compared problem by problem, seed by seed (seed ``s`` of both arms starts from
the same policy and draws the same prompts).

**The interval.** ``d`` = the arm's accuracy minus the reference's. Its 95% interval is a
two-level paired bootstrap: each round draws the seeds with replacement (an arm's seed ``s``
stays paired with the reference's seed ``s``) and, independently, the problems with replacement
(the same problems for every seed and both arms), and takes the mean of the paired differences
over the drawn seeds and problems; the interval is the 2.5th and 97.5th percentiles of
:data:`ROUNDS` rounds (seeded, so a rebuild gives the same digits). Seeds carry the training
noise, problems the evaluation noise; resampling both respects both.

**The minimum detectable effect** the run could have seen: ``(z_0.975 + z_0.8) x SE`` with SE
the bootstrap standard deviation of ``d`` (a two-sided 5% test with 80% power).

**The verdict** of an arm against the claim's prediction for it (``better``, ``worse`` or
``same`` as the reference; optionally by a claimed size in points):

- ``better``: **supported** when the interval lies above 0 (and, with a claimed size, reaches it);
  **contradicted** when it lies below 0, or lies wholly below a claimed size; else
  **inconclusive**;
- ``worse``: the mirror image;
- ``same``: **supported** when the interval lies within ``±margin`` points; **contradicted**
  when it excludes 0; else inconclusive;
- ``no better`` (the claim says the arm does not beat the reference): **supported** when the
  interval's upper end is at most ``margin``; **contradicted** when it lies above 0; else
  inconclusive. ``no worse`` is the mirror image.

**Still improving**: an arm's last evaluation against its own evaluation at about two thirds of
the budget, the same paired bootstrap; improving when that interval lies above 0.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

import numpy as np

from creditrl.train.metrics import unpack_outcomes

__all__ = [
    "EXPECTATIONS",
    "ROUNDS",
    "Difference",
    "outcome_matrix",
    "paired_difference",
    "still_improving",
    "verdict",
]

ROUNDS = 10_000
EXPECTATIONS = ("better", "worse", "same", "no better", "no worse")
_Z = NormalDist().inv_cdf(0.975) + NormalDist().inv_cdf(0.8)  # 1.96 + 0.84


@dataclass(frozen=True)
class Difference:
    """``arm - reference`` in accuracy (fractions): the paired mean, its 95% interval, the
    bootstrap standard error and the minimum detectable effect."""

    mean: float
    lo: float
    hi: float
    se: float
    mde: float
    seeds: int
    problems: int


def outcome_matrix(histories: list[list[dict[str, Any]]], index: int = -1) -> np.ndarray:
    """``(seeds, problems)`` booleans: every seed's per-problem outcomes at its evaluation
    ``index`` (default the last).

    Raises:
        ValueError: A run without per-problem outcomes, or runs evaluated on different numbers
            of problems.
    """
    rows = []
    for h in histories:
        evals = [r for r in h if "eval/accuracy" in r]
        if "eval/correct" not in evals[index]:
            raise ValueError("a run has no per-problem outcomes (eval/correct); rerun it with this version")
        rows.append(unpack_outcomes(evals[index]["eval/correct"]))
    if len({len(r) for r in rows}) != 1:
        raise ValueError(f"the runs were evaluated on different numbers of problems: {sorted({len(r) for r in rows})}")
    return np.array(rows, dtype=bool)


_CHUNK = 1000  # bootstrap rounds drawn and reduced at a time
_KEEP = 1 << 24  # rounds x problems up to which the draws are kept for the next pairing (128 MB)


def _rounds(seeds: int, problems: int, rounds: int, seed: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """The bootstrap's draws, which depend only on the shape and the seed, ``_CHUNK`` rounds at a
    time: each round's seed weights ``(n, seeds)`` and its drawn problems as flat indices into the
    chunk's ``(n, problems)`` matrix (``take_along_axis``'s values, gathered faster)."""
    rng = np.random.default_rng(seed)
    seed_w = rng.multinomial(seeds, np.full(seeds, 1 / seeds), size=rounds) / seeds
    for start in range(0, rounds, _CHUNK):
        n = min(rounds, start + _CHUNK) - start
        drawn = rng.integers(0, problems, size=(n, problems))  # the problems of each round
        drawn += np.arange(0, n * problems, problems)[:, None]
        yield seed_w[start : start + n], drawn


@functools.lru_cache(maxsize=2)  # a report pairs many arms of one shape: one set of draws serves them all
def _kept_rounds(seeds: int, problems: int, rounds: int, seed: int) -> tuple[tuple[np.ndarray, np.ndarray], ...]:
    chunks = tuple(_rounds(seeds, problems, rounds, seed))
    for w, drawn in chunks:
        w.setflags(write=False)
        drawn.setflags(write=False)
    return chunks


def paired_difference(arm: np.ndarray, reference: np.ndarray, *, rounds: int = ROUNDS, seed: int = 0) -> Difference:
    """The two-level paired bootstrap of ``mean(arm) - mean(reference)`` (module docstring);
    ``arm`` and ``reference`` are ``(seeds, problems)`` outcome matrices, seeds paired by row."""
    if arm.shape != reference.shape:
        raise ValueError(f"paired outcomes need equal shapes, got {arm.shape} and {reference.shape}")
    d = arm.astype(np.float64) - reference.astype(np.float64)
    seeds, problems = d.shape
    draws = (_kept_rounds if rounds * problems <= _KEEP else _rounds)(seeds, problems, rounds, seed)
    # each round's seed-weighted difference of every problem, averaged over its drawn problems
    boot = np.concatenate([(w @ d).ravel()[drawn].mean(axis=1) for w, drawn in draws])
    lo, hi = np.percentile(boot, [2.5, 97.5])
    se = float(boot.std(ddof=1))
    return Difference(float(d.mean()), float(lo), float(hi), se, _Z * se, seeds, problems)


def verdict(diff: Difference, expect: str, *, size: float | None = None, margin: float = 0.02) -> str:
    """``supported``, ``contradicted`` or ``inconclusive`` (module docstring); ``size`` and
    ``margin`` in accuracy fractions."""
    if expect not in EXPECTATIONS:
        raise ValueError(f"expect must be one of {', '.join(EXPECTATIONS)}, got {expect!r}")
    if expect == "same":
        if diff.lo > 0 or diff.hi < 0:
            return "contradicted"
        return "supported" if -margin <= diff.lo and diff.hi <= margin else "inconclusive"
    if expect in ("no better", "no worse"):
        lo, hi = (diff.lo, diff.hi) if expect == "no better" else (-diff.hi, -diff.lo)
        return "contradicted" if lo > 0 else "supported" if hi <= margin else "inconclusive"
    lo, hi = (diff.lo, diff.hi) if expect == "better" else (-diff.hi, -diff.lo)
    if hi < 0 or (size is not None and hi < size):
        return "contradicted"
    if lo > 0 and (size is None or hi >= size):
        return "supported"
    return "inconclusive"


def still_improving(histories: list[list[dict[str, Any]]]) -> Difference | None:
    """The last evaluation against the one at about two thirds of the run (None with fewer than
    three evaluations); improving when its interval lies above 0."""
    evals = [r for r in histories[0] if "eval/accuracy" in r]
    if len(evals) < 3:
        return None
    earlier = max(1, round(2 * (len(evals) - 1) / 3))
    if earlier >= len(evals) - 1:
        earlier = len(evals) - 2
    return paired_difference(outcome_matrix(histories, -1), outcome_matrix(histories, earlier))
