"""Throughput of ``creditrl compare --jobs N`` against one run at a time, on the same grid.

    .venv/bin/python benchmarks/compare_jobs.py [--arms 2] [--seeds 2] [--samples 1024] [--jobs 2]

Runs a small grid (the demo's config and cached SFT start, ``--arms`` estimators x ``--seeds``
seeds, ``--samples`` generated samples per run) twice into fresh directories: one run at a time
with all torch threads, then ``--jobs`` runs at a time (spawned processes, threads / jobs
threads each). Prints both wall times (SFT excluded: it is cached first) and their ratio. Only
meaningful on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from creditrl.config import load_config
from creditrl.experiments.compare import run_compare
from creditrl.experiments.demo import demo_config_path
from creditrl.experiments.report import printed_results  # noqa: E402
from creditrl.train.sft import cached_sft

ESTIMATORS = ["grpo", "rloo", "dr_grpo", "reinforce"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arms", type=int, default=2, choices=range(1, len(ESTIMATORS) + 1))
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--samples", type=int, default=1024)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--results", metavar="PAGE", help="also write what is printed as a results page (docs/results/...)")
    args = ap.parse_args()
    with printed_results(args.results, "creditrl compare --jobs: runs at a time"):
        _run(args)


def _run(args: argparse.Namespace) -> None:
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
    runs = args.arms * args.seeds
    print(f"\n{runs} runs x {args.samples:,} samples, {torch.get_num_threads()} torch threads on this machine")
    print(f"one at a time ({torch.get_num_threads()} threads): {seconds[1]:7.1f} s")
    print(
        f"--jobs {args.jobs} ({max(1, torch.get_num_threads() // args.jobs)} thread(s) each):   "
        f"{seconds[args.jobs]:7.1f} s"
    )
    print(f"throughput ratio: {seconds[1] / seconds[args.jobs]:.2f}x")


if __name__ == "__main__":
    main()
