"""``creditrl compare GRID --timing``: a controlled timing of a grid's arms.

Wall times of a grid's runs depend on what else the machine ran meanwhile, so no claim about time
is read from them. The timing runs, in each of ``rounds`` rounds, every arm once for a few
``iterations`` from the grid's start with its first seed, each in a fresh ``creditrl train``
subprocess, one at a time, the arms' order rotated from round to round (:func:`rotation`) so that
a drift of the machine's speed falls on every arm alike. Per run it records the wall and CPU
seconds of the subprocess and its children, the RL seconds per iteration the run logged
(``time/total_s`` over its iterations, evaluations left out) and the 1-minute load average before
it (a load above :data:`LOAD_PER_CORE` per core is warned about). A run evaluates only
:data:`EVAL_SIZE` held-out problems (at its start and end): the timing measures training, and a
grid's full evaluation at 500 tokens would take longer than the iterations timed.

Per arm (:func:`timing_summary`): medians over rounds, and the ratio to the reference arm's
seconds per iteration with its spread over rounds. A PRM's one-off labelling and training
(``time/prm_s``) is listed apart, not in the ratio.
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from creditrl.experiments.report import cpu_kind

LOAD_PER_CORE = 0.5  # above this 1-minute load per core before a run, the machine is not idle
EVAL_SIZE = 16  # held-out problems per evaluation of a timed run
ABOUT = 1.5  # "about c x" is read as within a factor 1.5 of c


@dataclass
class TimingRun:
    """One timed run: ``arm`` in ``round`` (0-based), ``iterations`` RL iterations."""

    arm: str
    round: int
    iterations: int
    wall_s: float  # the subprocess, start to end
    cpu_s: float  # user + system of the subprocess and its waited-for children
    iter_s: float  # the run's logged RL seconds per iteration (time/total_s / iterations)
    load1: float  # 1-minute load average before the run
    prm_s: float = 0.0  # the PRM's recorded labelling and training seconds (0: no PRM)


def rotation(arms: list[str], rounds: int) -> list[list[str]]:
    """The order of the arms in each round: round r starts at arm ``r mod len(arms)`` (A B C, B C A, ...)."""
    if not arms or rounds < 1:
        raise ValueError(f"rotation: needs at least one arm and one round, got {len(arms)} arms, {rounds} rounds")
    n = len(arms)
    return [[arms[(r + i) % n] for i in range(n)] for r in range(rounds)]


def timing_summary(runs: list[TimingRun], reference: str) -> dict[str, dict[str, Any]]:
    """Per arm: medians over rounds of ``iter_s``, ``wall_s`` and ``cpu_s``, and ``ratio``: the
    median, ``lo`` and ``hi`` of its per-round ``iter_s`` over the reference's in the same round."""
    ref = {r.round: r.iter_s for r in runs if r.arm == reference}
    if not ref:
        raise ValueError(f"timing: no run of the reference arm '{reference}'")
    out: dict[str, dict[str, Any]] = {}
    for arm in dict.fromkeys(r.arm for r in runs):
        mine = [r for r in runs if r.arm == arm]
        ratios = [r.iter_s / ref[r.round] for r in mine if r.round in ref and ref[r.round] > 0]
        out[arm] = {
            "rounds": len(mine),
            "iter_s": statistics.median(r.iter_s for r in mine),
            "wall_s": statistics.median(r.wall_s for r in mine),
            "cpu_s": statistics.median(r.cpu_s for r in mine),
            "prm_s": max(r.prm_s for r in mine),
            "ratio": {"median": statistics.median(ratios), "lo": min(ratios), "hi": max(ratios)} if ratios else None,
        }
    return out


def time_verdict(ratio: dict[str, float], claimed: float) -> str:
    """Whether a ratio's spread (lo-hi) bears out "about ``claimed`` x", i.e. within a factor
    :data:`ABOUT` of it: supported when wholly inside, contradicted when wholly outside."""
    low, high = claimed / ABOUT, claimed * ABOUT
    if low <= ratio["lo"] and ratio["hi"] <= high:
        return "supported"
    if ratio["hi"] < low or ratio["lo"] > high:
        return "contradicted"
    return "inconclusive"


def timing_markdown(result: dict[str, Any]) -> str:
    """The per-arm table of a timing result (:func:`run_timing`'s JSON)."""
    lines = [
        f"| arm | rounds | RL s / iteration | ratio to {result['reference']} [lo, hi] | process wall s | "
        "process CPU s | PRM one-off s |",
        "|---|---|---|---|---|---|---|",
    ]
    for arm, a in result["arms"].items():
        r = a["ratio"]
        ratio = "–" if r is None else f"{r['median']:.2f}x [{r['lo']:.2f}, {r['hi']:.2f}]"
        prm = f"{a['prm_s']:,.0f}" if a["prm_s"] else "–"
        lines.append(
            f"| {arm} | {a['rounds']} | {a['iter_s']:.3f} | {ratio} | {a['wall_s']:.1f} | {a['cpu_s']:.1f} | {prm} |"
        )
    return "\n".join(lines) + "\n"


def timing_text(result: dict[str, Any] | None, arm: str, reference: str, claimed: float | None = None) -> str:
    """A reading's clause on ``arm``'s time against ``reference`` from a committed timing result
    (None: none committed), with the verdict on "about ``claimed`` x" when one is given."""
    if result is None:
        return "no controlled timing yet, so no time verdict"
    arms = result["arms"]
    if arm not in arms or reference != result["reference"] or arms[arm]["ratio"] is None:
        return f"no controlled timing of {arm} against {reference} yet, so no time verdict"
    r = arms[arm]["ratio"]
    text = (
        f"{r['median']:.2f}x [{r['lo']:.2f}, {r['hi']:.2f}] the seconds per iteration in a controlled timing "
        f"({result['rounds']} interleaved rounds of {result['iterations']} iterations, the PRM's one-off "
        "labelling and training apart)"
    )
    return text if claimed is None else f"{text}; against about {claimed:g}x: {time_verdict(r, claimed)}"


def _one_run(base: Path, overrides: list[str], where: Path) -> tuple[float, float, dict[str, Any]]:
    """``creditrl train`` in a fresh subprocess: its wall and CPU seconds and its last metrics row."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    cmd = [sys.executable, "-m", "creditrl.cli", "train", str(base), "--run-dir", str(where)]
    cmd += [x for o in overrides for x in ("--set", o)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"timing run in {where} failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    rows = [json.loads(x) for x in (where / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return wall, cpu, rows[-1] | {"prm_s": next((r["time/prm_s"] for r in rows if "time/prm_s" in r), 0.0)}


def run_timing(
    grid_path: str | Path,
    out: str | Path | None = None,
    *,
    rounds: int = 3,
    iterations: int = 3,
    quick: bool = False,
    results: str | Path | None = None,
    threads: int = 0,
    log=print,
) -> dict[str, Any]:
    """Time the grid's arms and write ``timing.json`` and ``timing.md`` to ``out`` (default
    runs/timing-<grid name>) and a results page to ``results``; ``threads``: each run's
    ``train.threads`` (0: torch's default). Returns what timing.json holds."""
    from creditrl.config import load_config
    from creditrl.experiments.grid import load_grid
    from creditrl.experiments.report import write_results
    from creditrl.experiments.starts import any_start, known_starts

    if rounds < 1 or iterations < 1:
        raise ValueError(f"timing: rounds and iterations must be >= 1, got {rounds} and {iterations}")
    grid = load_grid(grid_path, quick=quick)
    out = Path(out or Path("runs") / f"timing-{grid.name}")
    out.mkdir(parents=True, exist_ok=True)
    reference = grid.reference or next(iter(grid.arms))
    if grid.init == "sft":
        init = any_start(grid.base, grid.common, known_starts(Path(grid_path).parent), log)
    else:  # policy (its model as it is) or a checkpoint directory
        init = grid.init
        load_config(grid.base, grid.common + [f"train.init={init}"])  # a bad start fails before any run
    fixed = [
        f"train.init={init}",
        f"train.seed={grid.seeds[0]}",
        f"train.iterations={iterations}",
        "train.max_tokens=0",
        f"train.eval_size={EVAL_SIZE}",
        f"train.checkpoint_every={iterations}",
        "train.progress=false",
    ] + ([f"train.threads={threads}"] if threads else [])
    cores = os.cpu_count() or 1
    runs: list[TimingRun] = []
    with tempfile.TemporaryDirectory(prefix="creditrl-timing-", dir=out) as tmp:
        for r, order in enumerate(rotation(list(grid.arms), rounds)):
            for arm in order:
                load1 = os.getloadavg()[0]
                if load1 > LOAD_PER_CORE * cores:
                    log(f"warning: 1-minute load {load1:.2f} on {cores} cores before '{arm}' round {r}: not idle")
                where = Path(tmp) / f"r{r}-{len(runs)}"
                wall, cpu, last = _one_run(grid.base, grid.common + grid.arms[arm] + fixed, where)
                it_s = last["time/total_s"] / iterations
                runs.append(TimingRun(arm, r, iterations, wall, cpu, it_s, load1, last["prm_s"]))
                log(f"round {r} '{arm}': {it_s:.3f} s/iteration, {wall:.1f} s wall, {cpu:.1f} CPU s")
    result = {
        "grid": str(grid_path),
        "reference": reference,
        "rounds": rounds,
        "iterations": iterations,
        "seed": grid.seeds[0],
        "cpu": cpu_kind(),
        "max_load1": max(r.load1 for r in runs),
        "arms": timing_summary(runs, reference),
        "runs": [asdict(r) for r in runs],
    }
    (out / "timing.json").write_text(json.dumps(result, indent=2))
    table = timing_markdown(result)
    (out / "timing.md").write_text(table)
    print("\n" + table, flush=True)
    body = (
        f"Grid {grid_path}; {rounds} rounds of {iterations} iterations per arm from the grid's start, seed "
        f"{grid.seeds[0]}, one run at a time in a fresh process, the arms' order rotated each round; highest "
        f"1-minute load before a run {result['max_load1']:.2f} on {cores} cores. Ratios: the median and range "
        f"over rounds of each round's ratio to {reference}'s RL seconds per iteration.\n\n{table}"
    )
    write_results(results, f"Controlled timing: {grid.name}", body)
    return result
