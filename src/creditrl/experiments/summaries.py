"""A finished run's summary: the kilobytes of it the findings need, committed under ``findings/``.

A run directory (checkpoints, the inspector's records, every metric) stays on the machine that
ran it; its summary travels with the repository, so ``creditrl findings`` rebuilds FINDINGS.md
on a fresh clone without training, and an interrupted grid resumes at the first run without one.

A summary (``findings/runs/<grid>/<arm>/seed<S>.json``) holds what identifies the run (its
overrides, budget and start), how it was launched, every iteration's ``time/iter_s``, and every
evaluation row restricted to :data:`EVAL_KEYS` (the per-problem outcomes ``eval/correct``
included). :func:`history` turns it back into the metrics rows the reports read.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

__all__ = ["EVAL_KEYS", "VERSION", "history", "read_summary", "run_summary", "summary_matches", "write_summary"]

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


def run_summary(rows: list[dict[str, Any]], identity: dict[str, Any], launch: dict[str, Any]) -> dict[str, Any]:
    """The summary of a finished run's metrics ``rows``; ``identity`` (overrides, budget, unit,
    init) says which run it is, ``launch`` how it ran (threads, jobs)."""
    return {
        "version": VERSION,
        **identity,
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "launch": {k: v for k, v in launch.items() if k != "load"},
        "load": launch.get("load"),  # the 15-minute load average at the run's end (None: not recorded)
        "iter_s": [[r["iteration"], round(r["time/iter_s"], 4)] for r in rows if "time/iter_s" in r],
        "evals": [{k: r[k] for k in EVAL_KEYS if k in r} for r in rows if "eval/accuracy" in r],
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
    return [rows[k] for k in sorted(rows)]
