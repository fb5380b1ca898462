"""The lines that end ``creditrl compare``'s output: per arm a verdict against the reference
(better, worse or no difference detectable, Holm over the arms judged) or the reason it gets none
(no learning signal, no arm moved from the start, one seed, no per-problem outcomes)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import numpy as np

from creditrl.experiments.report import eval_rows

NO_SIGNAL = 0.9  # an arm whose rewards had zero spread in at least this share of its groups gets no verdict


def moved(histories: list[list[dict[str, Any]]]) -> bool:
    """Whether some seed's held-out outcomes at its last evaluation differ from its start's (its
    accuracy where outcomes were not recorded)."""
    for h in histories:
        evals = eval_rows(h)
        key = "eval/correct" if all("eval/correct" in e for e in (evals[0], evals[-1])) else "eval/accuracy"
        if evals[0][key] != evals[-1][key]:
            return True
    return False


def verdict_rows(
    results: dict[str, list[list[dict[str, Any]]]], reference: str, seeds: dict[str, list[int]] | None = None
) -> list[dict[str, Any]]:
    """One row per arm against ``reference`` at the last evaluation: ``verdict`` is ``better``,
    ``worse`` or ``no difference detectable`` by the seed-level paired t over the seeds both ran
    (``seeds`` as in :func:`~creditrl.experiments.verdicts.shared_runs`), Holm-adjusted over the
    arms judged, or None with ``why`` it gets none (module docstring). ``zero_spread``: the share
    of its groups with zero reward spread (None: not logged); ``moved``: :func:`moved`."""
    from creditrl.experiments.summaries import run_mean
    from creditrl.experiments.verdicts import LEVEL, holm, outcome_matrix, paired_difference, shared_runs

    def paired(arm: str, level: float = LEVEL):  # the arm against the reference on the seeds both ran
        x, y, _ = shared_runs(results, seeds, arm, reference)
        return paired_difference(outcome_matrix(x), outcome_matrix(y), level=level)

    spread: dict[str, float | None] = {}
    for arm, hs in results.items():
        shares = [run_mean(h, "reward/zero_spread_groups") for h in hs]
        spread[arm] = None if None in shares else float(np.mean(shares))
    still = not any(moved(hs) for hs in results.values())  # then no difference says anything

    def outcomes(arm: str) -> bool:  # per-problem outcomes at every run's last evaluation
        return all("eval/correct" in eval_rows(h)[-1] for h in results[arm])

    def why(arm: str) -> str | None:  # the reason an arm gets no verdict
        if arm == reference:
            return "reference"
        if not (outcomes(arm) and outcomes(reference)):
            return "no outcomes"
        if spread[arm] is not None and spread[arm] >= NO_SIGNAL:
            return "no signal"
        if still:
            return "none moved"
        return "one seed" if len(shared_runs(results, seeds, arm, reference)[0]) < 2 else None

    rows = [
        {"arm": a, "verdict": None, "why": why(a), "zero_spread": spread[a], "moved": moved(hs), "difference": None}
        for a, hs in results.items()
    ]
    judged = [r for r in rows if r["why"] is None]
    if not judged:
        return rows
    adjusted, levels = holm([paired(r["arm"]).p for r in judged])
    for r, p, level in zip(judged, adjusted, levels):
        d = paired(r["arm"], level)
        r["verdict"] = "better" if d.lo > 0 else "worse" if d.hi < 0 else "no difference detectable"
        r["difference"] = {**asdict(d), "p_holm": p, "family": len(judged)}
    return rows


def verdict_lines(rows: list[dict[str, Any]], reference: str) -> list[str]:
    """One line per arm (:func:`verdict_rows`), and one when no arm moved from the start."""
    out = []
    for r in rows:
        share = r["zero_spread"]
        silent = share is not None and share >= NO_SIGNAL
        no_signal = f"no learning signal: its rewards had zero spread in {100 * (share or 0):.0f}% of its groups"
        if r["why"] == "reference":
            out.append(f"{r['arm']}: the reference" + (f"; {no_signal}" if silent else ""))
        elif r["why"] is not None:
            reason = {
                "no signal": no_signal,
                "none moved": "no arm moved from the start",
                "one seed": "one seed gives no interval",
                "no outcomes": "its runs or the reference's recorded no per-problem outcomes",
            }[r["why"]]
            out.append(f"{r['arm']}: no verdict, {reason}")
        else:
            out.append(f"{r['arm']}: {_judged(r, reference)}")
    if not any(r["moved"] for r in rows):
        out.append(
            "no verdict: no arm moved from the start (every seed's held-out outcomes at the last evaluation "
            "equal its start's)"
        )
    return out


def _signed(x: float) -> str:
    """Accuracy ``x`` in signed points, a rounding's ``-0.0`` written ``+0.0``."""
    text = f"{100 * x:+.1f}"
    return "+0.0" if text == "-0.0" else text


def _judged(row: dict[str, Any], reference: str) -> str:
    """A verdict line's text after the arm's name (``row`` of :func:`verdict_rows`)."""
    d, verdict = row["difference"], row["verdict"]
    level = f"{100 * d['level']:.1f}".rstrip("0").rstrip(".")
    method = (
        f"(held-out accuracy at the last evaluation; seed-level paired t, {level}% interval, Holm over "
        f"{d['family']} comparison{'s' if d['family'] > 1 else ''})"
    )
    if d["se"] == 0:  # every seed's difference the same: the t has no spread to size an interval with
        same = f"{_signed(d['mean'])} points on each of its {d['seeds']} seeds"
        what = "no difference from" if d["mean"] == 0 else f"{verdict} than"
        return f"{what} {reference}, {same}: no spread between seeds to size an interval {method}"
    ci = f"{_signed(d['mean'])} points [{_signed(d['lo'])}, {_signed(d['hi'])}]"
    if verdict == "no difference detectable":
        detect = f"; the smallest difference these {d['seeds']} seeds detect is {100 * d['mde']:.1f} points"
        return f"no difference detectable from {reference}, {ci}{detect} {method}"
    return f"{verdict} than {reference}, {ci} {method}"
