"""Schedules over training: of estimator hyper-parameters (the GAE lambda) and of the learning
rate of the supervised stages (SFT, PRM training)."""

from __future__ import annotations

import math


def linear_schedule(start: float, end: float | None, progress: float) -> float:
    """``start + (end - start) * clamp(progress, 0, 1)``; ``end = None`` keeps ``start``.

    ``progress = iteration / total_iterations``. Used for the GAE ``lam`` schedule of
    docs/design.md ("Value sources", e.g. lam 0.5 -> 0.95 over training). A progress past either
    end gives that end's value, never an extrapolation (a lambda above 1 would be invalid).
    """
    if end is None:
        return start
    return start + (end - start) * min(1.0, max(0.0, progress))


def lr_at(step: int, total: int, warmup: int, peak: float) -> float:
    """Linear warm-up to ``peak`` then cosine decay to 10% of it."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))
