"""How long the command line takes to report a misspelt config key, against ``creditrl --help``
(issue 60: under 1.5 s in a warm venv, where it once took 3.2 s because every command imported torch).

    .venv/bin/python benchmarks/cli_latency.py [--repeats 5]

Each command runs ``--repeats`` times, each time in a fresh process, the two interleaved (help,
misspelt, help, misspelt, ...) so that a change in the machine's load falls on both alike; one
unmeasured run of each first warms the file cache. The misspelt-key command is checked to fail
with the config error (exit code 2, "did you mean") before it is timed, so a typo that slipped
through never times a training run. Prints each command's median wall time, their ratio and
whether the misspelt key's median is under the target; exits 1 when it is not.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET_S = 1.5  # issue 60: a config error is reported in under 1.5 s


def creditrl_command() -> list[str]:
    """The ``creditrl`` console script of the running interpreter's environment (what a user runs),
    else ``python -m creditrl.cli``."""
    script = Path(sys.executable).parent / "creditrl"
    return [str(script)] if script.exists() else [sys.executable, "-m", "creditrl.cli"]


def measure(commands: dict[str, list[str]], repeats: int = 5, *, cwd: str | None = None) -> dict[str, list[float]]:
    """Wall seconds of ``repeats`` runs of each command, each in a fresh process, interleaved
    across the commands after one unmeasured run of each; name -> the runs' seconds."""
    times: dict[str, list[float]] = {name: [] for name in commands}
    for rep in range(repeats + 1):
        for name, argv in commands.items():
            start = time.perf_counter()
            subprocess.run(argv, cwd=cwd, capture_output=True, timeout=120)
            if rep:  # the first round only warms the file cache
                times[name].append(time.perf_counter() - start)
    return times


def summary(help_s: list[float], misspelt_s: list[float], target_s: float = TARGET_S) -> dict[str, float | bool]:
    """Medians of both commands, their ratio, and whether the misspelt key's median is under ``target_s``."""
    help_median, misspelt_median = statistics.median(help_s), statistics.median(misspelt_s)
    return {
        "help_s": help_median,
        "misspelt_s": misspelt_median,
        "ratio": misspelt_median / help_median,
        "passed": misspelt_median < target_s,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5, help="measured runs of each command")
    args = parser.parse_args()
    cli = creditrl_command()
    with tempfile.TemporaryDirectory() as tmp:
        misspelt = [*cli, "train", "--set", "train.iteratons=2", "--run-dir", "run"]
        commands = {"creditrl --help": [*cli, "--help"], "creditrl train --set train.iteratons=2": misspelt}
        check = subprocess.run(misspelt, cwd=tmp, capture_output=True, text=True, timeout=120)
        if check.returncode != 2 or "did you mean 'iterations'" not in check.stderr:
            print(f"the misspelt key was not reported as a config error (exit {check.returncode}):")
            print(check.stderr[-2000:])
            return 1
        times = measure(commands, args.repeats, cwd=tmp)
    help_name, misspelt_name = commands
    for name, runs in times.items():
        runs_text = ", ".join(f"{t:.3f}" for t in runs)
        print(f"{name:<40} median {statistics.median(runs):.3f} s  (runs: {runs_text})")
    s = summary(times[help_name], times[misspelt_name])
    print(f"ratio (misspelt key / --help): {s['ratio']:.2f}")
    verdict, n = "PASS" if s["passed"] else "FAIL", args.repeats
    print(f"misspelt key reported in {s['misspelt_s']:.3f} s (median of {n}): {verdict}, target {TARGET_S} s")
    return 0 if s["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
