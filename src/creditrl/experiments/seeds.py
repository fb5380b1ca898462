"""Arms x seeds at an equal budget of generated tokens: run (resumably), summarise, plot.

Every arm starts from the same SFT checkpoint and stops at the first iteration whose generated
tokens reach the budget (``train.max_tokens``), so arms that spend tokens differently (a tree
generates shared prefixes once) are compared at equal generation cost. A run whose last metrics
row already reached the budget is read back, not rerun; an interrupted one continues from its
last checkpoint (a grid's runs checkpoint at every evaluation).
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from scipy import stats

from creditrl.config import Config, load_config
from creditrl.errors import ConfigError
from creditrl.experiments.report import cpu_kind, eval_rows
from creditrl.experiments.summaries import history, read_summary, run_summary, summary_matches, write_summary
from creditrl.inspect.data import load_metrics
from creditrl.train.checkpoint import resume_checkpoint
from creditrl.train.rl import RLTrainer


def slug(name: str) -> str:
    return re.sub(r"[^0-9a-zA-Z]+", "_", name).strip("_")


def mean_ci95(xs: list[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95% Student-t interval (0 for a single value)."""
    n = len(xs)
    if n == 0:
        raise ValueError("mean_ci95 needs at least one value")
    mean = float(np.mean(xs))
    if n == 1:
        return mean, 0.0
    return mean, float(stats.t.ppf(0.975, n - 1) * stats.sem(xs))


def _finished(path: Path, budget: int, key: str = "tokens/total") -> list[dict[str, Any]] | None:
    """The run's metrics rows if it ran to exactly this ``budget`` of ``key`` and was evaluated at
    the end: for ``iteration`` the last row is that iteration; for a total (tokens) the last row
    reached it and the row before had not (a run made for a larger budget is not reused)."""
    rows = load_metrics(path.parent)
    if not rows or rows[-1].get(key, 0) < budget or "eval/accuracy" not in rows[-1]:
        return None
    if key == "iteration":
        return rows if rows[-1][key] == budget else None
    before = [r[key] for r in rows[:-1] if key in r]
    return rows if not before or before[-1] < budget else None


def samples_iterations(cfg, samples: int) -> int:
    """Iterations for a budget of generated samples: ``ceil(samples / (prompts_per_iter x
    group_size))`` (the trainer has no samples budget; an iteration generates that many)."""
    return max(1, math.ceil(samples / (cfg.rollout.prompts_per_iter * cfg.rollout.group_size)))


@dataclass
class _Run:
    arm: str
    seed: int
    overrides: list[str]
    where: Path  # the run directory
    summary: Path | None  # its committed summary (None: no summaries kept)
    identity: dict[str, Any]
    resume: int | None = None  # an interrupted run of this very plan: the iteration it continues from


# in a grid's run directory: the run's identity, so that a rerun of the grid continues an
# interrupted run of the same plan from its last checkpoint, and starts any other afresh
PLAN_FILE = "grid_run.json"


def _plan_text(run: _Run) -> str:
    return json.dumps(run.identity, sort_keys=True)


def _plan(
    base: Path,
    arms: dict[str, list[str]],
    seeds: list[int],
    budget: int,
    run_dir: Path,
    init_path: str,
    common: list[str],
    unit: str,
    summaries: Path | None,
) -> list[_Run]:
    """Every (arm, seed) run of the grid, with its overrides and the budget's stopping rule."""
    runs = []
    for name, over in arms.items():
        if unit == "tokens":
            extra = [f"train.max_tokens={budget}"]
        else:
            stop = samples_iterations(load_config(base, common + over), budget)
            extra = [f"train.iterations={stop}", "train.max_tokens=0"]
        for seed in seeds:
            overrides = common + over + [f"train.seed={seed}"] + extra
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
            runs.append(_Run(name, seed, overrides, where, summary, identity))
    return runs


def _summary_path(summaries: Path, arm: str, seed: int, identity: dict[str, Any]) -> Path:
    """Where the run's summary is: in the grid's own folder, or where another grid's folder beside
    it (``findings/runs/*``) holds the very same run (arm name, base, overrides, budget), which is
    then read from there rather than rerun -- two claims with one reference arm share its runs."""
    own = summaries / arm / f"seed{seed}.json"
    if own.is_file() or not summaries.parent.is_dir():
        return own
    for other in sorted(summaries.parent.glob(f"*/{arm}/seed{seed}.json")):
        if summary_matches(read_summary(other), identity):
            return other
    return own


def _done(run: _Run, budget: int, unit: str) -> list[dict[str, Any]] | None:
    """The run's history when it is finished: its committed summary, else its run directory's
    metrics (summarised then, when summaries are kept)."""
    if run.summary is not None:
        found = read_summary(run.summary)
        if summary_matches(found, run.identity):
            return history(found)
    key, stop = ("tokens/total", budget) if unit == "tokens" else ("iteration", _stop(run.overrides))
    rows = _finished(run.where / "metrics.jsonl", stop, key)
    if rows is not None and run.summary is not None:
        _summarise(run, rows)
    return rows


def _stop(overrides: list[str]) -> int:
    """The ``train.iterations`` a samples budget set (the last such override)."""
    return int([o for o in overrides if o.startswith("train.iterations=")][-1].split("=", 1)[1])


def _summarise(run: _Run, rows: list[dict[str, Any]] | None = None) -> None:
    rows = rows if rows is not None else load_metrics(run.where)
    if (run.where / "config.yaml").is_file():  # the start the run resolved (the SFT cache's path)
        run.identity["init"] = load_config(run.where / "config.yaml").train.init
    f = run.where / "launch.json"
    launch = json.loads(f.read_text()) if f.exists() else {}
    write_summary(run.summary, run_summary(rows, run.identity, launch))


def summarised_arms(
    base: Path,
    arms: dict[str, list[str]],
    seeds: list[int],
    budget: int,
    common: list[str],
    unit: str,
    summaries: Path,
) -> dict[str, int]:
    """Per arm, how many of its seeds' runs have a matching committed summary (nothing runs)."""
    done = dict.fromkeys(arms, 0)
    for r in _plan(base, arms, seeds, budget, Path("."), "sft", common, unit, summaries):
        done[r.arm] += summary_matches(read_summary(r.summary), r.identity)
    return done


def summary_files(
    base: Path,
    arms: dict[str, list[str]],
    seeds: list[int],
    budget: int,
    common: list[str],
    unit: str,
    summaries: Path,
) -> list[Path]:
    """Each run's summary file, in the grid's own folder or in the grid it shares the run with."""
    return [r.summary for r in _plan(base, arms, seeds, budget, Path("."), "sft", common, unit, summaries)]


def run_arms(
    base: Path,
    arms: dict[str, list[str]],
    seeds: list[int],
    budget: int,
    run_dir: Path,
    init_path: str,
    common: list[str] | None = None,
    log=print,
    unit: str = "tokens",
    jobs: int = 1,
    summaries: Path | None = None,
) -> dict[str, list[list[dict[str, Any]]]]:
    """``{arm: [history per seed]}``; each run is ``base`` + ``common`` + the arm's overrides +
    ``train.seed=s`` + the budget, written to ``run_dir/<arm>/seed<s>``. The budget is
    ``train.max_tokens=budget`` for ``unit="tokens"``; for ``unit="samples"`` it is
    ``train.iterations`` = :func:`samples_iterations` (and ``train.max_tokens=0``), and a run is
    finished when its last row is that iteration.

    ``summaries``: a folder of committed run summaries (:mod:`creditrl.experiments.summaries`),
    ``<arm>/seed<s>.json``; a run with a matching summary is read from it and not rerun, and
    every finished run gets one. ``init_path`` is only resolved (``"sft"``: the cached warm start
    of ``base`` + ``common``) when some run is still to do.

    ``jobs > 1`` runs that many at once, each in its own (spawned) process with
    ``max(1, torch threads // jobs)`` intra-op threads and no progress bar; a run's numbers then
    equal those of a one-at-a-time run with the same thread count (tested). Every run writes
    ``launch.json`` (threads, jobs), which the reports state, since iteration times depend on it."""
    if unit not in ("tokens", "samples"):
        raise ValueError(f"run_arms: unit must be 'tokens' or 'samples', got {unit!r}")
    if jobs < 1:
        raise ValueError(f"run_arms: jobs must be >= 1, got {jobs}")
    runs = _plan(base, arms, seeds, budget, run_dir, init_path, list(common or []), unit, summaries)
    done = {(r.arm, r.seed): _done(r, budget, unit) for r in runs}
    # seed by seed (each arm of seed 0, then of seed 1, ...): runs that first build different cached
    # things (a PRM per labeler) build them side by side rather than one waiting on the other's
    # lock, and an interrupted grid leaves whole seeds, which pair
    pending = sorted((r for r in runs if done[(r.arm, r.seed)] is None), key=lambda r: seeds.index(r.seed))
    for r in runs:
        if done[(r.arm, r.seed)] is not None:
            log(f"arm '{r.arm}' seed {r.seed}: finished earlier, read back")
    if pending and init_path == "sft":  # kept next to the summaries (findings/runs/<grid>): findings/starts
        starts = None if summaries is None else summaries.parent.parent / "starts"
        summarised = [r.summary for r in runs if r.summary is not None and done[(r.arm, r.seed)]]
        init_path = grid_start(base, list(common or []), starts, summarised)
    for r in pending:
        r.identity["init"] = init_path
        plan = r.where / PLAN_FILE
        same = (r.where / "config.yaml").is_file() and plan.is_file() and plan.read_text() == _plan_text(r)
        r.resume = _checkpointed(r.where) if same else None
        if r.resume is None:  # another plan's leftovers, or no intact checkpoint: start afresh
            shutil.rmtree(r.where, ignore_errors=True)
        r.where.mkdir(parents=True, exist_ok=True)
        plan.write_text(_plan_text(r))
    _launch(pending, init_path, budget, unit, jobs, log, base)
    if summaries is not None:  # what a rebuild from the summaries alone will read, to the digit
        return {name: [history(read_summary(r.summary)) for r in runs if r.arm == name] for name in arms}
    return {name: [done[(name, s)] or load_metrics(run_dir / slug(name) / f"seed{s}") for s in seeds] for name in arms}


def _launch(pending: list[_Run], init_path: str, budget: int, unit: str, jobs: int, log, base: Path) -> None:
    """Run ``pending``, ``jobs`` at a time; each finished run is summarised at once."""
    if jobs == 1:
        for r in pending:
            log(f"arm '{r.arm}' seed {r.seed}: {_start_text(r)}up to {budget:,} generated {unit}")
            _run_one(base, r.overrides, r.where, init_path, torch.get_num_threads(), 1, r.resume)
            if r.summary is not None:
                _summarise(r)
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
                _run_one, base, r.overrides + ["train.progress=false"], r.where, init_path, threads, jobs, r.resume
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
                    _summarise(r)
                log(f"arm '{r.arm}' seed {r.seed}: done in {seconds:.0f} s")


def _checkpointed(where: Path) -> int | None:
    """The iteration of the run's newest intact checkpoint (None: none, or none intact)."""
    try:
        ckpt = resume_checkpoint(where / "checkpoints")
    except ConfigError:
        return None
    return json.loads((ckpt / "trainer_state.json").read_text())["iteration"] if ckpt else None


def grid_start(
    base: Path, common: list[str], starts: Path | None = None, summarised: list[Path] | tuple[Path, ...] = ()
) -> str:
    """The SFT start of a grid on ``base`` + ``common`` (cached). With ``starts`` (a repository's
    folder of kept starts, one per SFT recipe), a start kept there is used as it is, and one built
    here is kept there once it is known to be the one the ``summarised`` runs started from: the same
    recipe trains other weights on another CPU kind (an arithmetic start held out 20.8% on one
    machine, 11.2% on another), and a grid's runs pair only when they share their start."""
    from creditrl.train.sft import cached_sft, keep_start, recipe_key

    cfg = load_config(base, common)
    kept = None if starts is None else starts / recipe_key(cfg)
    weights = kept if kept is not None and kept.is_dir() else None
    path = cached_sft(cfg, progress=cfg.train.progress, weights=weights)[0]
    _check_start(cfg, path, summarised)
    if kept is not None and weights is None:
        keep_start(path, kept)
    return str(path)


def kept_start(base: Path, common: list[str], starts: Path, found: list[dict[str, Any]]) -> Path | None:
    """The start kept under ``starts`` for the recipe of ``base`` + ``common`` when it is the one
    the summarised runs ``found`` started from (its held-out outcomes, as kept, equal their
    iteration-0 outcomes on every problem); None otherwise (nothing kept, or kept for another task)."""
    from creditrl.train.sft import recipe_key

    kept = starts / recipe_key(load_config(base, common))
    state = kept / "trainer_state.json"
    if not state.is_file():
        return None
    own = json.loads(state.read_text()).get("heldout_correct")
    first = _start_evals(found)
    same = bool(first) and all(e["eval/correct"] == own for e in first)
    return kept if own is not None and same else None


def _start_evals(found: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The iteration-0 evaluations (the start's outcome on every held-out problem) of the run
    summaries ``found`` that hold one."""
    first = [f["evals"][0] for f in found if f["evals"]]
    return [e for e in first if e.get("iteration") == 0 and "eval/correct" in e]


def _check_start(cfg: Config, start: Path, summaries: list[Path] | tuple[Path, ...]) -> None:
    """Stop before training when ``start`` is not the one the summarised runs started from: their
    iteration-0 evaluations (the start's greedy outcome on every held-out problem) must equal its
    own, or new runs would not pair with them."""
    from creditrl.train.metrics import unpack_outcomes
    from creditrl.train.sft import start_outcomes

    first = _start_evals([read_summary(p) for p in summaries if p.is_file()])
    if not first:
        return
    own = start_outcomes(cfg, start)
    other = [e for e in first if e["eval/correct"] != own]
    if other:
        share = float(np.mean(unpack_outcomes(own)))
        raise ConfigError(
            f"start {start}: held out {share:.1%} here, but {len(other)} of the {len(first)} summarised runs "
            f"of this grid started from {other[0]['eval/accuracy']:.1%} on the same problems: these weights are not "
            "theirs (trained on another CPU kind or torch version) and new runs would not pair with "
            "them; start from theirs (kept under findings/starts), or move their summaries aside to rerun every arm"
        )


def _start_text(run: _Run) -> str:
    return "" if run.resume is None else f"continues from its checkpoint at iteration {run.resume}, "


def _run_one(
    base: Path, overrides: list[str], where: Path, init_path: str, threads: int, jobs: int, resume: int | None = None
) -> float:
    """One run (also the worker of a parallel :func:`run_arms`); returns its wall seconds. The run
    checkpoints at each evaluation (or more often, as its config says), so that ``resume`` (the
    same plan interrupted) continues it from the last one -- a resumed run's metrics equal an
    uninterrupted run's, and the replayed iterations' time is not counted twice."""
    import time

    torch.set_num_threads(threads)
    if jobs > 1:  # parallel runs: their log lines, not interleaved progress bars
        import transformers

        transformers.utils.logging.disable_progress_bar()
    start = time.time()
    if resume is not None:
        RLTrainer.resume(where).run()
    else:
        train = load_config(base, overrides).train
        every = [f"train.checkpoint_every={min(train.checkpoint_every, train.eval_every)}"]
        RLTrainer.from_config(load_config(base, overrides + every), where, init_path=init_path).run()
    # train.threads wins; the load average over the run's last 15 minutes says what else shared the machine
    launch = {"threads": torch.get_num_threads(), "jobs": jobs, "cpu": cpu_kind(), "load": round(os.getloadavg()[2], 2)}
    (where / "launch.json").write_text(json.dumps(launch))
    return time.time() - start


def run_launch(run: Path) -> dict[str, Any]:
    """How the run at ``run`` was launched (its ``launch.json``; {} when it has none)."""
    f = Path(run) / "launch.json"
    return json.loads(f.read_text()) if f.is_file() else {}


def launch_settings(run_dir: Path) -> list[dict[str, int]]:
    """The distinct ``launch.json`` settings of the runs under ``run_dir`` (runs from before it
    existed count as ``{}``)."""
    found = []
    for metrics in sorted(Path(run_dir).glob("*/seed*/metrics.jsonl")):
        d = {k: v for k, v in run_launch(metrics.parent).items() if k != "load"}
        if d not in found:
            found.append(d)
    return found


@dataclass
class SeedSummary:
    arm: str
    seeds: int
    start: float  # held-out exact match before RL (the same SFT start for every seed)
    final: tuple[float, float]  # mean, 95% half-width over seeds
    best: tuple[float, float]
    step_final: tuple[float, float]
    tokens: float  # mean generated tokens at the end
    samples: float
    iterations: float
    wall_s: float  # mean RL wall time per run (evaluations excluded)


def summarise_seeds(arm: str, histories: list[list[dict[str, Any]]]) -> SeedSummary:
    evals = [eval_rows(h) for h in histories]
    last = [h[-1] for h in histories]
    return SeedSummary(
        arm=arm,
        seeds=len(histories),
        start=evals[0][0]["eval/accuracy"],
        final=mean_ci95([e[-1]["eval/accuracy"] for e in evals]),
        best=mean_ci95([max(r["eval/accuracy"] for r in e) for e in evals]),
        step_final=mean_ci95([e[-1]["eval/step_accuracy"] for e in evals]),
        tokens=float(np.mean([r["tokens/total"] for r in last])),
        samples=float(np.mean([r["samples/total"] for r in last])),
        iterations=float(np.mean([r["iteration"] for r in last])),
        wall_s=float(np.mean([r["time/total_s"] for r in last])),
    )


def seeds_table(rows: list[SeedSummary]) -> str:
    pct = lambda m: f"{100 * m[0]:.1f} ± {100 * m[1]:.1f}%"  # noqa: E731
    head = (
        "| arm | seeds | exact match start | final (mean ± 95% CI) | best | step acc final | generated tokens "
        "| samples | iterations | RL wall time / run |\n|---|---|---|---|---|---|---|---|---|---|\n"
    )
    return head + "".join(
        f"| {r.arm} | {r.seeds} | {100 * r.start:.1f}% | {pct(r.final)} | {pct(r.best)} | {pct(r.step_final)} "
        f"| {r.tokens:,.0f} | {r.samples:,.0f} | {r.iterations:.0f} | {r.wall_s:.0f} s |\n"
        for r in rows
    )
