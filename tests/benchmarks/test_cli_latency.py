"""benchmarks/cli_latency.py's measuring and verdict (the benchmark itself runs by hand, outside the suite)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _script():
    spec = importlib.util.spec_from_file_location("cli_latency", ROOT / "benchmarks" / "cli_latency.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_measure_times_each_run_of_each_command_in_a_fresh_process() -> None:
    bench = _script()
    times = bench.measure({"a": [sys.executable, "-c", "pass"], "b": [sys.executable, "-c", "pass"]}, repeats=2)
    assert set(times) == {"a", "b"}
    assert all(len(runs) == 2 and all(0 < t < 60 for t in runs) for runs in times.values())


def test_summary_takes_medians_and_holds_the_misspelt_key_to_the_target() -> None:
    bench = _script()
    s = bench.summary([0.1, 0.5, 0.2], [0.4, 9.0, 0.3])
    assert (s["help_s"], s["misspelt_s"], s["ratio"], s["passed"]) == (0.2, 0.4, 2.0, True)
    assert bench.summary([0.1], [1.5])["passed"] is False  # the target is strict: under 1.5 s
