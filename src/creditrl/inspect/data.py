"""Reading a run directory for the inspector: the saved iterations and ``metrics.jsonl``."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from creditrl.inspect.record import INSPECT_DIR

_NAME = re.compile(r"iter_(\d{6})\.json")


class InspectError(ValueError):
    """Bad input to the inspector; the message says what was expected."""


def saved_iterations(run_dir: Path) -> list[int]:
    """The iterations with inspector data in ``run_dir``, ascending; InspectError when none."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise InspectError(f"{run_dir}: no such run directory")
    folder = run_dir / INSPECT_DIR
    found = sorted(int(m.group(1)) for p in folder.glob("iter_*.json") if (m := _NAME.fullmatch(p.name)))
    if not found:
        raise InspectError(
            f"{run_dir}: no inspector data ({folder}/iter_NNNNNN.json); train with "
            "train.inspect_every > 0 (e.g. --set train.inspect_every=10) to record it"
        )
    return found


def load_iteration(run_dir: Path, iteration: int) -> dict[str, Any]:
    """The saved record of ``iteration``; InspectError (listing the saved ones) when absent."""
    saved = saved_iterations(run_dir)
    if iteration not in saved:
        raise InspectError(f"iteration {iteration} was not saved; saved iterations: {', '.join(map(str, saved))}")
    return json.loads((Path(run_dir) / INSPECT_DIR / f"iter_{iteration:06d}.json").read_text())


def load_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """The rows of ``metrics.jsonl`` (empty when the file is missing)."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def spread(saved: list[int], keep: int, must: int | None = None) -> list[int]:
    """At most ``keep`` of ``saved``, evenly spaced, always with the first, the last and
    ``must`` (the iteration shown first)."""
    if len(saved) <= keep:
        return list(saved)
    picks = {saved[round(i * (len(saved) - 1) / max(1, keep - 1))] for i in range(keep)}
    if must is not None:
        picks.add(must)
    return sorted(picks)
