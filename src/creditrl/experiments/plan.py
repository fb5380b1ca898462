"""A grid's runs, planned: each (arm, seed) run's overrides, stopping rule, run directory and summary.

Every arm of a grid starts from the same SFT checkpoint and stops at the first iteration whose
generated tokens reach the budget (``train.max_tokens``), or after the iterations a samples budget
buys, so arms that spend tokens differently are compared at equal generation cost. A run is
finished when its committed summary matches its plan, or when its run directory's last metrics
row reached the budget and was evaluated.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from creditrl.config import load_config
from creditrl.experiments.grid import Grid, run_common
from creditrl.experiments.summaries import history, read_summary, run_summary, summary_matches, write_summary
from creditrl.inspect.data import load_metrics


def slug(name: str) -> str:
    return re.sub(r"[^0-9a-zA-Z]+", "_", name).strip("_")


def samples_iterations(cfg, samples: int) -> int:
    """Iterations for a budget of generated samples: ``ceil(samples / (prompts_per_iter x group_size))``."""
    return max(1, math.ceil(samples / (cfg.rollout.prompts_per_iter * cfg.rollout.group_size)))


@dataclass
class PlannedRun:
    arm: str
    seed: int
    overrides: list[str]
    where: Path  # the run directory
    summary: Path | None  # its committed summary (None: no summaries kept)
    identity: dict[str, Any]
    resume: int | None = None  # an interrupted run of this very plan: the iteration it continues from


PLAN_FILE = "grid_run.json"  # the run's identity: a rerun continues only an interrupted run of the same plan
RUN_FILES = ("launch.json", "cost.json")


def plan_text(run: PlannedRun) -> str:
    return json.dumps(run.identity, sort_keys=True)


def plan_runs(grid: Grid, run_dir: Path, init_path: str, summaries: Path | None) -> list[PlannedRun]:
    """Every (arm, seed) run of the grid in ``run_dir/<arm>/seed<s>``, its overrides being
    :func:`~creditrl.experiments.grid.run_common`, the arm's, its ``sft.seed`` (``sft_seeds``), its
    seed and the budget's stopping rule."""
    base, budget, unit, sft_seeds = grid.base, grid.budget, grid.unit, grid.sft_seeds
    common = run_common(grid)
    runs = []
    for name, over in grid.arms.items():
        if unit == "tokens":
            extra = [f"train.max_tokens={budget}"]
        else:
            stop = samples_iterations(load_config(base, common + over), budget)
            extra = [f"train.iterations={stop}", "train.max_tokens=0"]
        for seed in grid.seeds_of(name):
            start = [f"sft.seed={sft_seeds[seed]}"] if seed in sft_seeds else []
            overrides = common + over + start + [f"train.seed={seed}"] + extra
            identity = {
                "arm": name,
                "seed": seed,
                "base": base.name,
                "overrides": overrides,
                "budget": budget,
                "unit": unit,
                "init": init_path,
            }
            where = run_dir / slug(name) / f"seed{seed}"
            summary = _summary_path(summaries, slug(name), seed, identity) if summaries else None
            runs.append(PlannedRun(name, seed, overrides, where, summary, identity))
    return runs


def _summary_path(summaries: Path, arm: str, seed: int, identity: dict[str, Any]) -> Path:
    """Where the run's summary is: in the grid's own folder, or in another grid's folder beside it
    that holds the very same run (two claims with one reference arm share its runs)."""
    own = summaries / arm / f"seed{seed}.json"
    if own.is_file() or not summaries.parent.is_dir():
        return own
    for other in sorted(summaries.parent.glob(f"*/{arm}/seed{seed}.json")):
        if summary_matches(read_summary(other), identity):
            return other
    return own


def _finished(path: Path, budget: int, key: str = "tokens/total") -> list[dict[str, Any]] | None:
    """The run's metrics rows if it ran to exactly this ``budget`` of ``key`` (a run made for a
    larger budget is not reused) and was evaluated at the end; else None."""
    rows = load_metrics(path.parent)
    if not rows or rows[-1].get(key, 0) < budget or "eval/accuracy" not in rows[-1]:
        return None
    if key == "iteration":
        return rows if rows[-1][key] == budget else None
    before = [r[key] for r in rows[:-1] if key in r]
    return rows if not before or before[-1] < budget else None


def finished_history(run: PlannedRun, budget: int, unit: str) -> list[dict[str, Any]] | None:
    """The run's history when it is finished, from its summary or else its run directory."""
    if run.summary is not None:
        found = read_summary(run.summary)
        if summary_matches(found, run.identity):
            return history(found)
    key, stop = ("tokens/total", budget) if unit == "tokens" else ("iteration", _stop(run.overrides))
    rows = _finished(run.where / "metrics.jsonl", stop, key)
    if rows is not None and run.summary is not None:
        summarise_run(run, rows)
    return rows


def _stop(overrides: list[str]) -> int:
    """The ``train.iterations`` a samples budget set (the last such override)."""
    return int([o for o in overrides if o.startswith("train.iterations=")][-1].split("=", 1)[1])


def summarise_run(run: PlannedRun, rows: list[dict[str, Any]] | None = None) -> None:
    rows = rows if rows is not None else load_metrics(run.where)
    if (run.where / "config.yaml").is_file():  # the start the run resolved (the SFT cache's path)
        run.identity["init"] = load_config(run.where / "config.yaml").train.init
    launch, cost = (json.loads(f.read_text()) if f.is_file() else {} for f in (run.where / n for n in RUN_FILES))
    write_summary(run.summary, run_summary(rows, run.identity, launch, cost))


def summarised_arms(grid: Grid, summaries: Path) -> dict[str, int]:
    """Per arm, how many of its seeds' runs have a matching committed summary (nothing runs)."""
    done = dict.fromkeys(grid.arms, 0)
    for run, _ in summarised_runs(grid, summaries):
        done[run.arm] += 1
    return done


def summarised_runs(grid: Grid, summaries: Path) -> list[tuple[PlannedRun, dict[str, Any]]]:
    """The grid's runs that have a matching committed summary, each with it, in plan order."""
    found = []
    for r in plan_runs(grid, Path("."), "sft", summaries):
        summary = read_summary(r.summary)
        if summary_matches(summary, r.identity):
            found.append((r, summary))
    return found


def summary_files(grid: Grid, summaries: Path) -> list[Path]:
    """Each run's summary file, in the grid's own folder or in the grid it shares the run with."""
    return [r.summary for r in plan_runs(grid, Path("."), "sft", summaries)]
