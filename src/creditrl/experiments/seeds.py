"""Statistics over a grid's seeds: mean and Student-t interval, and the per-arm seeds table."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import stats

from creditrl.experiments.report import eval_rows


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


@dataclass
class SeedSummary:
    arm: str
    seeds: int
    start: float  # held-out exact match before RL (the same SFT start for every seed)
    final: tuple[float, float]  # mean, 95% half-width over seeds
    best: tuple[float, float]
    step_final: tuple[float, float]
    tokens: float  # mean generated tokens at the end
    samples: float
    iterations: float
    wall_s: float  # mean RL wall time per run (evaluations excluded)


def summarise_seeds(arm: str, histories: list[list[dict[str, Any]]]) -> SeedSummary:
    evals = [eval_rows(h) for h in histories]
    last = [h[-1] for h in histories]
    return SeedSummary(
        arm=arm,
        seeds=len(histories),
        start=evals[0][0]["eval/accuracy"],
        final=mean_ci95([e[-1]["eval/accuracy"] for e in evals]),
        best=mean_ci95([max(r["eval/accuracy"] for r in e) for e in evals]),
        step_final=mean_ci95([e[-1]["eval/step_accuracy"] for e in evals]),
        tokens=float(np.mean([r["tokens/total"] for r in last])),
        samples=float(np.mean([r["samples/total"] for r in last])),
        iterations=float(np.mean([r["iteration"] for r in last])),
        wall_s=float(np.mean([r["time/total_s"] for r in last])),
    )


def seeds_table(rows: list[SeedSummary]) -> str:
    pct = lambda m: f"{100 * m[0]:.1f} ± {100 * m[1]:.1f}%"  # noqa: E731
    head = (
        "| arm | seeds | exact match start | final (mean ± 95% CI) | best | step acc final | generated tokens "
        "| samples | iterations | RL wall time / run |\n|---|---|---|---|---|---|---|---|---|---|\n"
    )
    return head + "".join(
        f"| {r.arm} | {r.seeds} | {100 * r.start:.1f}% | {pct(r.final)} | {pct(r.best)} | {pct(r.step_final)} "
        f"| {r.tokens:,.0f} | {r.samples:,.0f} | {r.iterations:.0f} | {r.wall_s:.0f} s |\n"
        for r in rows
    )
