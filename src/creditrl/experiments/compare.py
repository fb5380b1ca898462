"""``creditrl compare GRID.yaml``: a grid of arms x seeds at a fixed generation budget per run.

The grid file's keys are :data:`creditrl.experiments.grid_keys.KEY_HELP` (``creditrl compare
--help`` prints them); docs/compare.md is the user's reference, with a worked example.

Budgets: ``tokens`` sets ``train.max_tokens`` (and, before ``set``, ``train.iterations`` to
1,000,000 so that the budget ends a run: a schedule over training such as ``credit.lam_end``
follows ``train.iterations``, so set it in ``set`` to about the budget's iteration count, large
enough for the budget to be reached); ``samples`` sets ``train.iterations = ceil(samples /
(prompts_per_iter x group_size))`` per arm. A finished run in the output directory is read back,
not rerun (:func:`creditrl.experiments.launch.run_arms`; an arm is keyed by its name).

The output ends with one line per arm against the reference
(:func:`creditrl.experiments.compare_verdicts.verdict_lines`).
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from creditrl.config import load_config
from creditrl.experiments.compare_report import (
    cost_rows,
    costs_markdown,
    cpu_hours,
    difference_rows,
    differences_markdown,
    launch_text,
    prm_markdown,
    prm_rows,
    results_csv,
    results_markdown,
    summarise_arm,
    verdict_lines,
    verdict_rows,
)
from creditrl.experiments.curves import plot_seed_curves
from creditrl.experiments.grid import load_grid, run_common
from creditrl.experiments.launch import launch_settings, run_arms, run_launch
from creditrl.experiments.plan import slug, summary_files
from creditrl.experiments.starts import any_start, kept_start, known_starts
from creditrl.experiments.summaries import read_summary


def run_compare(
    grid_path: str | Path,
    out: str | Path | None = None,
    *,
    quick: bool = False,
    seeds: int | None = None,
    jobs: int = 1,
    summaries: Path | None = None,
    arms: list[str] | None = None,
    arm_seeds: dict[str, list[int]] | None = None,
) -> dict[str, Any]:
    """Run (resumably) and report a grid. ``summaries``: a folder of committed run summaries
    (:func:`creditrl.experiments.launch.run_arms`); when every run has one, nothing trains.
    ``arms``: only these of the grid's arms (in the grid's order). ``arm_seeds``: the seeds of the
    arms it names, where they run fewer than the grid's (a report while seeds are still running);
    each difference then pairs the seeds its two arms share. Returns what summary.json holds
    (``seeds``: each arm's), plus ``results``: each arm's per-seed metric histories."""
    grid = load_grid(grid_path, quick=quick, seeds=seeds)
    if arms is not None:
        grid = dataclasses.replace(grid, arms={k: v for k, v in grid.arms.items() if k in arms})
    if arm_seeds:
        grid = dataclasses.replace(grid, arm_seeds={a: list(s) for a, s in arm_seeds.items() if a in grid.arms})
    arm_seed = {name: grid.seeds_of(name) for name in grid.arms}
    out = Path(out or Path("runs") / f"compare-{grid.name}")
    out.mkdir(parents=True, exist_ok=True)
    start = time.time()
    log = lambda msg: print(f"[creditrl compare] {time.time() - start:6.0f} s  {msg}", flush=True)  # noqa: E731
    init: str | None = grid.init
    runs = grid  # the grid its runs are planned from
    if init == "policy":  # each run starts from its policy.model (train.init=policy), no SFT
        log(f"start: {load_config(grid.base, grid.common).policy.model} as it is (init: policy), no warm start")
        runs, init = dataclasses.replace(grid, common=[*grid.common, "train.init=policy"]), None
    elif init == "sft" and summaries is None:
        init = any_start(grid.base, grid.common, known_starts(Path(grid_path).parent), log)
    log(f"{len(grid.arms)} arms x {len(grid.seeds)} seeds, {grid.budget:,} generated {grid.unit} per run -> {out}")
    results = run_arms(runs, out, init, log, jobs=jobs, summaries=summaries)
    launches = launch_settings(out)
    machines = {  # each arm's runs' CPU kinds (None: not recorded): wall times compare only within one
        name: [run_launch(out / slug(name) / f"seed{s}").get("cpu") for s in arm_seed[name]] for name in grid.arms
    }
    loads: list[float] = []
    starts: list[dict[str, Any]] = []  # with summaries: each SFT start and the seeds that began from it
    spent = {
        arm: [_cost(out / slug(arm) / f"seed{s}", h) for s, h in zip(arm_seed[arm], hs)] for arm, hs in results.items()
    }
    if summaries is not None:
        found = [read_summary(f) for f in summary_files(runs, summaries)]  # a shared run: its summary there
        starts = _starts(runs, found, [s for a in grid.arms for s in arm_seed[a]], summaries)
        init = starts[0]["init"] if starts else init
        loads = [f["load"] for f in found if f.get("load") is not None]
        launches = [x for i, x in enumerate(f["launch"] for f in found) if x not in [f["launch"] for f in found[:i]]]
        cpus = iter(f["launch"].get("cpu") for f in found)  # in the plan's order: arm by arm, seed by seed
        machines = {name: [next(cpus) for _ in arm_seed[name]] for name in grid.arms}
        costs = iter(f.get("cost", {}) for f in found)
        spent = {name: [next(costs) for _ in arm_seed[name]] for name in grid.arms}
    rows = [summarise_arm(name, hs, grid.target, grid.gain) for name, hs in results.items()]
    table = results_markdown(rows)
    differences = difference_rows(results, grid.reference, machines, arm_seed) if grid.reference else []
    if differences:
        table += "\n" + differences_markdown(differences, grid.reference, machines, arm_seed)
    prms = prm_rows(results)
    if prms:
        table += "\n" + prm_markdown(prms)
    costs = cost_rows(results, spent)
    table += "\n" + costs_markdown(costs)
    judge = grid.reference or next(iter(grid.arms))
    verdicts = verdict_rows(results, judge, arm_seed)
    lines = verdict_lines(verdicts, judge)
    title = f"{grid.name}: {grid.budget:,} generated {grid.unit} per run, mean ± 95% CI over {len(grid.seeds)} seeds"
    length = {"y_key": "eval/length", "y_label": "held-out greedy response length (tokens)"}
    for name, x_key, x_label, y in (
        ("accuracy_vs_samples", "samples/total", "generated samples", {}),
        ("accuracy_vs_wall_time", "time/total_s", "RL wall time (s, evaluations excluded)", {}),
        ("length_vs_samples", "samples/total", "generated samples", length),
    ):
        plot_seed_curves(
            results, out / "plots" / f"{name}.png", title, x_key, x_label, "ci95", reference=grid.reference, **y
        )
    target = f"{100 * grid.target:.1f}%" if grid.target is not None else f"start + {100 * grid.gain:.1f} points"
    (out / "results.md").write_text(
        f"# compare: {grid.name}\n\nGrid {grid_path}; base {grid.base}; seeds {grid.seeds}; budget {grid.budget:,} "
        f"generated {grid.unit} per run; target {target}; init {init or 'policy'}; launched: "
        f"{launch_text(launches)}.\n\n{table}\n## Verdicts against {judge}\n\n"
        + "".join(f"- {x}\n" for x in lines)
        + "\n"
        "![accuracy vs samples](plots/accuracy_vs_samples.png)\n![accuracy vs wall "
        "time](plots/accuracy_vs_wall_time.png)\n"
        "![response length vs samples](plots/length_vs_samples.png)\n"
    )
    (out / "results.csv").write_text(results_csv(rows))
    summary = {
        "grid": {**asdict(grid), "base": str(grid.base)},
        "init": init or "policy",
        **({"starts": starts} if len(starts) > 1 else {}),  # several SFT starts (sft_seeds): each with its seeds
        "seeds": arm_seed,
        "rows": [asdict(r) for r in rows],
        "differences": differences,
        "verdicts": verdicts,
        "costs": costs,
        **({"prm": prms} if prms else {}),
        "launches": launches,
        "machines": machines,
        "cpu_hours": cpu_hours(results, launches),
        "load": float(np.mean(loads)) if loads else None,
        "wall_s": time.time() - start,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    print("\n" + table)
    log(f"results: {out / 'results.md'}")
    print(f"\nVerdicts against {judge}:\n" + "\n".join(lines), flush=True)
    return {**summary, "results": results}  # and each arm's histories, not written to summary.json


def _starts(grid, found: list[dict[str, Any]], seeds: list[int], summaries: Path) -> list[dict[str, Any]]:
    """Each SFT start of the summarised runs ``found`` (``seeds``: theirs, in the same order), the
    grid's own first and then one per ``sft_seeds`` value: ``{"init", "seeds"}``, a start named as the
    repository keeps it (findings/starts/<recipe>) when it is kept there, else as the runs name it."""
    out = []
    for k in dict.fromkeys([None] + [grid.sft_seeds.get(s) for s in seeds]):
        group = [f for f, s in zip(found, seeds) if grid.sft_seeds.get(s) == k]
        if not group:
            continue
        common = run_common(grid) + ([] if k is None else [f"sft.seed={k}"])
        kept = kept_start(grid.base, common, summaries.parent.parent / "starts", group)
        init = group[0]["init"] if kept is None else kept.relative_to(summaries.parent.parent.parent).as_posix()
        out.append({"init": init, "seeds": sorted({s for s in seeds if grid.sft_seeds.get(s) == k})})
    return out


def _cost(run: Path, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """What a grid's run in ``run`` cost: its updates' token positions (summed over its metrics
    ``rows``) and its CPU seconds (its ``cost.json``); a key is missing where it was not recorded."""
    f = run / "cost.json"
    cost = json.loads(f.read_text()) if f.is_file() else {}
    if any("update/positions" in r for r in rows):
        cost["trained_positions"] = sum(r.get("update/positions", 0) for r in rows)
    return cost
