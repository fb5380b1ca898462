"""Reading a run directory for the inspector: the saved iterations and ``metrics.jsonl``."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

from creditrl.errors import ConfigError
from creditrl.inspect.record import INSPECT_DIR

log = logging.getLogger("creditrl")

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
    """The rows of ``run_dir/metrics.jsonl`` (:func:`read_metrics`)."""
    return read_metrics(Path(run_dir) / "metrics.jsonl")


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The rows of a ``metrics.jsonl`` (empty when the file is missing). A last line that does not
    parse (a write cut by a kill) is dropped with a warning; a bad line before the last is a
    :class:`ConfigError` naming it."""
    path = Path(path)
    if not path.exists():
        return []
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    rows = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            if not isinstance(row, dict) or "iteration" not in row:
                raise ValueError("not a metrics row")
        except ValueError:
            if n == len(lines):
                log.warning("creditrl: %s line %d is a partial row (a write was cut); dropped", path, n)
                break
            raise ConfigError(f"{path} line {n}: not a metrics row (a JSON object with 'iteration')") from None
        rows.append(row)
    return rows


def spread(saved: list[int], keep: int, must: int | None = None) -> list[int]:
    """At most ``keep`` of ``saved``, evenly spaced, always with the first, the last and
    ``must`` (the iteration shown first)."""
    if len(saved) <= keep:
        return list(saved)
    picks = {saved[round(i * (len(saved) - 1) / max(1, keep - 1))] for i in range(keep)}
    if must is not None:
        picks.add(must)
    return sorted(picks)
