"""A finished run's summary: the kilobytes of it the findings need, committed under ``findings/``.

A run directory stays on the machine that ran it; its summary travels with the repository, so
``creditrl findings`` rebuilds FINDINGS.md on a fresh clone without training.

A summary (``findings/runs/<grid>/<arm>/seed<S>.json``) holds what identifies the run (its
overrides, budget and start), how it was launched, every iteration's ``time/iter_s``, every
evaluation row restricted to :data:`EVAL_KEYS`, the diagnostics of :data:`WINDOW_KEYS` averaged
over each evaluation's window of iterations (``windows``, optional), and what the run cost
(``cost``: generated tokens, trained token positions, CPU seconds; optional). :func:`history`
turns it back into metrics rows, a window's means as ``window/<key>`` on its evaluation's row.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

__all__ = [
    "EVAL_KEYS",
    "VERSION",
    "WINDOW_KEYS",
    "diagnostic_windows",
    "history",
    "read_summary",
    "run_mean",
    "run_summary",
    "summary_matches",
    "write_summary",
]

VERSION = 1
EVAL_KEYS = (
    "iteration",
    "samples/total",
    "tokens/total",
    "time/total_s",
    "time/eval_s",
    "time/prm_s",
    "prm/label_agreement",
    "prm/label_coverage",
    "prm/label_fpr",
    "prm/heldout_auroc",
    "prm/generated_tokens",
    "prm/trained_positions",
    "reward/mean",
    "train/accuracy",
    "eval/accuracy",
    "eval/step_accuracy",
    "eval/length",
    "eval/reward",
    "eval/errors",
    "eval/timeouts",
    "eval/correct",
)
WINDOW_KEYS = (
    "value/explained_variance",
    "loss/value",
    "response/length",
    "reward/zero_spread_groups",
    "kl/ref",
    "policy/entropy",
)
DIGITS = 6  # significant digits a window's means keep (kilobytes, not a metrics file)


def diagnostic_windows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per evaluation after the start, the mean of each of :data:`WINDOW_KEYS` the run logged over
    the iterations since the previous evaluation: ``{"iteration", "iterations": how many, key: mean}``."""
    out, window = [], []
    for r in rows:
        if "time/iter_s" in r:
            window.append(r)
        if "eval/accuracy" not in r or not window:
            continue
        means = {
            k: float(f"{sum(w[k] for w in window if k in w) / sum(k in w for w in window):.{DIGITS}g}")
            for k in WINDOW_KEYS
            if any(k in w for w in window)
        }
        out.append({"iteration": r["iteration"], "iterations": len(window), **means})
        window = []
    return out


def run_summary(
    rows: list[dict[str, Any]], identity: dict[str, Any], launch: dict[str, Any], cost: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The summary of a finished run's metrics ``rows``, with its ``identity``, ``launch`` and ``cost``."""
    spent = {"generated_tokens": rows[-1]["tokens/total"]} if rows and "tokens/total" in rows[-1] else {}
    if any("update/positions" in r for r in rows):
        spent["trained_positions"] = int(sum(r.get("update/positions", 0) for r in rows))
    return {
        "version": VERSION,
        **identity,
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "launch": {k: v for k, v in launch.items() if k != "load"},
        "load": launch.get("load"),  # the 15-minute load average at the run's end (None: not recorded)
        "iter_s": [[r["iteration"], round(r["time/iter_s"], 4)] for r in rows if "time/iter_s" in r],
        "evals": [{k: r[k] for k in EVAL_KEYS if k in r} for r in rows if "eval/accuracy" in r],
        "windows": diagnostic_windows(rows),
        "cost": {**spent, **(cost or {})},
    }


def write_summary(path: Path, summary: dict[str, Any]) -> None:
    """Write ``summary`` as JSON, atomically (a cut write leaves the old file or none)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(summary, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, path)


def read_summary(path: Path) -> dict[str, Any] | None:
    """The summary at ``path``; None when there is none or it is of another version."""
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    return data if data.get("version") == VERSION else None


def summary_matches(summary: dict[str, Any] | None, identity: dict[str, Any]) -> bool:
    """Whether ``summary`` is of the run ``identity`` describes (overrides, budget, unit)."""
    return summary is not None and all(summary.get(k) == v for k, v in identity.items() if k != "init")


def history(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """The metrics rows a summary keeps: one per iteration (its ``time/iter_s``) with the
    evaluation rows' keys merged in, in iteration order."""
    rows: dict[int, dict[str, Any]] = {it: {"iteration": it, "time/iter_s": t} for it, t in summary["iter_s"]}
    for ev in summary["evals"]:
        rows.setdefault(ev["iteration"], {"iteration": ev["iteration"]}).update(ev)
    for w in summary.get("windows", []):
        rows.setdefault(w["iteration"], {"iteration": w["iteration"]}).update(
            {f"window/{k}": v for k, v in w.items() if k != "iteration"}
        )
    return [rows[k] for k in sorted(rows)]


def run_mean(rows: list[dict[str, Any]], key: str) -> float | None:
    """The mean of ``key`` over a run's iterations, from its rows or else from a summary's windows
    (weighted by their iterations); None when neither holds it."""
    if logged := [r[key] for r in rows if key in r]:
        return sum(logged) / len(logged)
    windows = [(r[f"window/{key}"], r["window/iterations"]) for r in rows if f"window/{key}" in r]
    total = sum(n for _, n in windows)
    return sum(v * n for v, n in windows) / total if total else None
