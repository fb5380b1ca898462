"""A grid's pending runs, launched: one at a time or several in spawned processes, resumably.

:func:`run_arms` reads finished runs back, resolves the start only when something is left to run,
and runs the rest seed by seed; an interrupted run continues from its last checkpoint, and each
finished run is summarised at once.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch

from creditrl.config import load_config
from creditrl.errors import ConfigError
from creditrl.experiments.grid import Grid, run_common
from creditrl.experiments.plan import PLAN_FILE, PlannedRun, finished_history, plan_runs, plan_text, slug, summarise_run
from creditrl.experiments.report import cpu_kind
from creditrl.experiments.starts import grid_start
from creditrl.experiments.summaries import history, read_summary
from creditrl.inspect.data import load_metrics
from creditrl.train.checkpoint import resume_checkpoint
from creditrl.train.rl import RLTrainer
from creditrl.usage import run_cpu_s


def run_arms(
    grid: Grid,
    run_dir: Path,
    init_path: str | None,
    log=print,
    jobs: int = 1,
    summaries: Path | None = None,
) -> dict[str, list[list[dict[str, Any]]]]:
    """``{arm: [history per seed]}`` of ``grid``, each run planned by
    :func:`~creditrl.experiments.plan.plan_runs` and written to ``run_dir/<arm>/seed<s>``.

    ``summaries``: a folder of committed run summaries (``<arm>/seed<s>.json``); a run with a
    matching summary is read from it and not rerun, and every finished run gets one.
    ``init_path`` is only resolved (``"sft"``: the cached warm start of ``base`` + ``common``, per
    the grid's ``sft_seeds``) when some run is still to do; None starts each run where its own
    ``train.init`` says.

    ``jobs > 1`` runs that many at once, each in its own spawned process with ``max(1, torch
    threads // jobs)`` intra-op threads and no progress bar; a run's numbers equal those of a
    one-at-a-time run with the same thread count. Every run writes ``launch.json`` (threads, jobs,
    CPU kind), which the reports state."""
    base, arms, seeds, budget, unit = grid.base, grid.arms, grid.seeds, grid.budget, grid.unit
    sft_seeds = grid.sft_seeds
    if unit not in ("tokens", "samples"):
        raise ValueError(f"run_arms: unit must be 'tokens' or 'samples', got {unit!r}")
    if jobs < 1:
        raise ValueError(f"run_arms: jobs must be >= 1, got {jobs}")
    runs = plan_runs(grid, run_dir, init_path, summaries)
    done = {(r.arm, r.seed): finished_history(r, budget, unit) for r in runs}
    # seed by seed: runs that first build different cached things (a PRM per labeler) build them side
    # by side rather than waiting on each other's lock, and an interrupted grid leaves whole seeds
    pending = sorted((r for r in runs if done[(r.arm, r.seed)] is None), key=lambda r: seeds.index(r.seed))
    for r in runs:
        if done[(r.arm, r.seed)] is not None:
            log(f"arm '{r.arm}' seed {r.seed}: finished earlier, read back")
    starts = None if summaries is None else summaries.parent.parent / "starts"  # kept starts: findings/starts
    # start by start, in the order of their first pending seed: a second start's SFT (sft_seeds)
    # is resolved, and trained when missing, only once the first start's runs are done
    for k in dict.fromkeys(_sft_seed(r, sft_seeds) for r in pending):
        group = [r for r in pending if _sft_seed(r, sft_seeds) == k]
        init = init_path
        if init_path == "sft":
            summarised = [
                r.summary for r in runs if _sft_seed(r, sft_seeds) == k and r.summary and done[(r.arm, r.seed)]
            ]
            init = grid_start(base, run_common(grid) + ([] if k is None else [f"sft.seed={k}"]), starts, summarised)
        for r in group:
            r.identity["init"] = init
            plan = r.where / PLAN_FILE
            same = (r.where / "config.yaml").is_file() and plan.is_file() and plan.read_text() == plan_text(r)
            r.resume = _checkpointed(r.where) if same else None
            if r.resume is None:  # another plan's leftovers, or no intact checkpoint: start afresh
                shutil.rmtree(r.where, ignore_errors=True)
            r.where.mkdir(parents=True, exist_ok=True)
            plan.write_text(plan_text(r))
        _launch(group, budget, unit, jobs, log, base)
    if summaries is not None:  # what a rebuild from the summaries alone will read, to the digit
        return {name: [history(read_summary(r.summary)) for r in runs if r.arm == name] for name in arms}
    return {
        name: [done[(name, s)] or load_metrics(run_dir / slug(name) / f"seed{s}") for s in grid.seeds_of(name)]
        for name in arms
    }


def _sft_seed(run: PlannedRun, sft_seeds: dict[int, int] | None) -> int | None:
    """The ``sft.seed`` of the run's own start (None: the grid's ``sft.seed``)."""
    return (sft_seeds or {}).get(run.seed)


def _launch(pending: list[PlannedRun], budget: int, unit: str, jobs: int, log, base: Path) -> None:
    """Run ``pending`` ``jobs`` at a time, each from its own start, summarising each as it finishes."""
    if jobs == 1:
        for r in pending:
            log(f"arm '{r.arm}' seed {r.seed}: {_start_text(r)}up to {budget:,} generated {unit}")
            _run_one(base, r.overrides, r.where, r.identity["init"], torch.get_num_threads(), 1, r.resume)
            if r.summary is not None:
                summarise_run(r)
        return
    if not pending:
        return
    import multiprocessing
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    threads = max(1, torch.get_num_threads() // jobs)
    log(f"{len(pending)} runs, {jobs} at a time with {threads} thread(s) each")
    with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        running = {
            pool.submit(
                _run_one,
                base,
                r.overrides + ["train.progress=false"],
                r.where,
                r.identity["init"],
                threads,
                jobs,
                r.resume,
            ): r
            for r in pending
        }
        for r in pending:
            if r.resume is not None:
                log(f"arm '{r.arm}' seed {r.seed}: {_start_text(r)}")
        while running:
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
            for fut in finished:
                r = running.pop(fut)
                try:
                    seconds = fut.result()
                except Exception as exc:
                    for other in running:
                        other.cancel()
                    raise RuntimeError(f"arm '{r.arm}' seed {r.seed} failed: {exc}") from exc
                if r.summary is not None:
                    summarise_run(r)
                log(f"arm '{r.arm}' seed {r.seed}: done in {seconds:.0f} s")


def _start_text(run: PlannedRun) -> str:
    return "" if run.resume is None else f"continues from its checkpoint at iteration {run.resume}, "


def _checkpointed(where: Path) -> int | None:
    """The iteration of the run's newest intact checkpoint (None: none, or none intact)."""
    try:
        ckpt = resume_checkpoint(where / "checkpoints")
    except ConfigError:
        return None
    return json.loads((ckpt / "trainer_state.json").read_text())["iteration"] if ckpt else None


def _run_one(
    base: Path,
    overrides: list[str],
    where: Path,
    init_path: str | None,
    threads: int,
    jobs: int,
    resume: int | None = None,
) -> float:
    """One run (also the worker of a parallel :func:`run_arms`); returns its wall seconds. The run
    checkpoints at least at each evaluation, so that ``resume`` (the same plan interrupted)
    continues it from the last one with the metrics an uninterrupted run has."""
    import time

    torch.set_num_threads(threads)
    cpu = run_cpu_s()
    if jobs > 1:  # parallel runs: their log lines, not interleaved progress bars
        import transformers

        transformers.utils.logging.disable_progress_bar()
    start = time.time()
    if resume is not None:
        trainer = RLTrainer.resume(where)
    else:
        train = load_config(base, overrides).train
        every = [f"train.checkpoint_every={min(train.checkpoint_every, train.eval_every)}"]
        trainer = RLTrainer.from_config(load_config(base, overrides + every), where, init_path=init_path)
    trainer.cpu_base = cpu  # the run's CPU seconds count its build too
    trainer.run()
    # train.threads wins; the load average over the run's last 15 minutes says what else shared the machine
    launch = {"threads": torch.get_num_threads(), "jobs": jobs, "cpu": cpu_kind(), "load": round(os.getloadavg()[2], 2)}
    (where / "launch.json").write_text(json.dumps(launch))
    # a resumed run: its earlier processes' share comes from its checkpoint; a PRM built here is left out
    # (each run reading it is charged it); a run resumed from a checkpoint without the record has none
    cpu_s = trainer.cpu_s()
    (where / "cost.json").write_text(json.dumps({} if cpu_s is None else {"cpu_s": round(cpu_s, 2)}))
    return time.time() - start


def run_launch(run: Path) -> dict[str, Any]:
    """How the run at ``run`` was launched (its ``launch.json``; {} when it has none)."""
    f = Path(run) / "launch.json"
    return json.loads(f.read_text()) if f.is_file() else {}


def launch_settings(run_dir: Path) -> list[dict[str, int]]:
    """The distinct ``launch.json`` settings of the runs under ``run_dir`` (``{}``: none)."""
    found = []
    for metrics in sorted(Path(run_dir).glob("*/seed*/metrics.jsonl")):
        d = {k: v for k, v in run_launch(metrics.parent).items() if k != "load"}
        if d not in found:
            found.append(d)
    return found
