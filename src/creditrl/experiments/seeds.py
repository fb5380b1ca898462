"""Statistics over a grid's seeds: the mean and its Student-t interval."""

from __future__ import annotations

import numpy as np
from scipy import stats


def mean_ci95(xs: list[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95% Student-t interval (0 for a single value)."""
    if len(xs) == 0:
        raise ValueError("mean_ci95 needs at least one value")
    return float(np.mean(xs)), float(ci95_half(np.asarray(xs, dtype=np.float64)))


def ci95_half(values: np.ndarray) -> np.ndarray:
    """The half-width of the 95% Student-t interval of the mean over axis 0 of ``values`` (each
    column's, for a matrix: one call for a whole curve); 0 with a single row."""
    n = values.shape[0]
    if n < 2:
        return np.zeros(values.shape[1:])
    return stats.t.ppf(0.975, n - 1) * stats.sem(values, axis=0)
