"""Schedules of estimator hyper-parameters over training (e.g. the GAE lambda)."""

from __future__ import annotations


def linear_schedule(start: float, end: float | None, progress: float) -> float:
    """``start + (end - start) * clamp(progress, 0, 1)``; ``end = None`` keeps ``start``.

    ``progress = iteration / total_iterations``. Used for the GAE ``lam`` schedule of
    DESIGN.md ("Value sources", e.g. lam 0.5 -> 0.95 over training): a lower lambda bootstraps
    more on V (less variance, more of the critic's bias), a higher one leans on sampled rewards.
    Clamping makes a progress past either end give that end's value rather than an
    extrapolation (a lambda above 1 would be invalid).
    """
    if end is None:
        return start
    p = min(1.0, max(0.0, progress))
    return start + (end - start) * p
