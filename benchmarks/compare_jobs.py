"""Throughput of ``creditrl compare --jobs N`` against one run at a time, on the same grid.

    .venv/bin/python benchmarks/compare_jobs.py [--arms 2] [--seeds 2] [--samples 1024] [--jobs 2]

Runs a small grid (the demo's config and cached SFT start, ``--arms`` estimators x ``--seeds``
seeds, ``--samples`` generated samples per run) twice into fresh directories: one run at a time
with all torch threads, then ``--jobs`` runs at a time (spawned processes, threads / jobs
threads each). Prints both wall times (SFT excluded: it is cached first) and their ratio. Only
meaningful on an otherwise idle machine. With ``--results PAGE`` the numbers also go to PAGE's name
with .json, beside the page.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from common import write_json
from creditrl.config import load_config
from creditrl.experiments.compare import run_compare
from creditrl.experiments.demo import demo_config_path
from creditrl.experiments.report import printed_results  # noqa: E402
from creditrl.train.sft import cached_sft

ESTIMATORS = ["grpo", "rloo", "dr_grpo", "reinforce"]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arms", type=int, default=2, choices=range(1, len(ESTIMATORS) + 1))
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--samples", type=int, default=1024)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--results", metavar="PAGE", help="also write what is printed as a results page (docs/results/...)")
    args = ap.parse_args(argv)
    with printed_results(args.results, "creditrl compare --jobs: runs at a time"):
        result = _run(args)
    if args.results:
        write_json(Path(args.results).with_suffix(".json"), result)


def summary(seconds: dict[int, float], args: argparse.Namespace, threads: int) -> dict[str, float | int]:
    """The grid's size, the wall seconds one run at a time and ``args.jobs`` at a time, the threads each
    run had, and the throughput ratio (one at a time / jobs at a time)."""
    return {
        "runs": args.arms * args.seeds,
        "samples": args.samples,
        "jobs": args.jobs,
        "threads": threads,
        "threads_per_job": max(1, threads // args.jobs),
        "one_at_a_time_s": seconds[1],
        "jobs_at_a_time_s": seconds[args.jobs],
        "ratio": seconds[1] / seconds[args.jobs],
    }


def _run(args: argparse.Namespace) -> dict[str, float | int]:
    cached_sft(load_config(demo_config_path(False)), progress=True)
    arms = "".join(f"  {e}: [credit.estimator={e}]\n" for e in ESTIMATORS[: args.arms])
    with tempfile.TemporaryDirectory() as tmp:
        grid = Path(tmp) / "grid.yaml"
        grid.write_text(
            f"name: jobs\nbase: demo\nset: [train.eval_every=1000, train.checkpoint_every=100000, "
            f"train.progress=false]\nbudget: {{samples: {args.samples}}}\narms:\n{arms}"
        )
        seconds = {}
        for jobs in (1, args.jobs):
            start = time.time()
            run_compare(grid, Path(tmp) / f"jobs{jobs}", seeds=args.seeds, jobs=jobs)
            seconds[jobs] = time.time() - start
    r = summary(seconds, args, torch.get_num_threads())
    print(f"\n{r['runs']} runs x {r['samples']:,} samples, {r['threads']} torch threads on this machine")
    print(f"one at a time ({r['threads']} threads): {r['one_at_a_time_s']:7.1f} s")
    print(f"--jobs {r['jobs']} ({r['threads_per_job']} thread(s) each):   {r['jobs_at_a_time_s']:7.1f} s")
    print(f"throughput ratio: {r['ratio']:.2f}x")
    return r


if __name__ == "__main__":
    main()
