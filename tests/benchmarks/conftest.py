"""The speed benchmarks are scripts in benchmarks/ that import each other by name: their folder goes on
sys.path, as it is when one of them runs."""

from __future__ import annotations

import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
if str(BENCHMARKS) not in sys.path:
    sys.path.insert(0, str(BENCHMARKS))
