"""``creditrl compare``, ``findings`` and ``eval``: the experiments that compare credit-assignment
choices over seeds, and held-out evaluation of checkpoints. The one-off studies (value estimates,
scheduled sampling, long outputs, the PRM life cycle, test-time search) are scripts in the
repository's ``studies/``."""

from __future__ import annotations

import argparse
import json
import textwrap
import time
from dataclasses import asdict
from pathlib import Path

from creditrl.cli.common import add_config_args, add_report_args, add_threads_arg, set_threads


def add_jobs_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="runs at a time, each in its own process with threads / jobs "
        "intra-op threads and no progress bar (benchmarks/compare_jobs.py measures the gain)",
    )


def cmd_compare(args: argparse.Namespace) -> int:
    from creditrl.experiments.compare import run_compare

    set_threads(args.threads)
    if args.timing:
        from creditrl.experiments.timing import run_timing

        run_timing(
            args.grid,
            args.out,
            rounds=args.rounds,
            iterations=args.timing_iterations,
            quick=args.quick,
            results=args.results,
            threads=args.threads,
        )
        return 0
    run_compare(args.grid, args.out, quick=args.quick, seeds=args.seeds, jobs=args.jobs)
    return 0


def cmd_findings(args: argparse.Namespace) -> int:
    started = time.perf_counter()  # before the import: torch and the registries count in the time
    from creditrl.experiments.findings import run_findings

    out = Path(args.out) if args.out else None
    run_findings(
        Path(args.root), quick=args.quick, out=out, jobs=args.jobs, train=not args.no_train, only=args.only or ()
    )
    print(f"[creditrl findings] done in {time.perf_counter() - started:.0f} s")
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from creditrl.experiments.evaluate import errors_table, evaluate_checkpoints, markdown_table

    rows = evaluate_checkpoints(
        args.config,
        args.checkpoints,
        size=args.size,
        baseline=args.baseline,
        overrides=args.set,
        errors=args.errors,
        split=args.split,
    )
    print(markdown_table(rows))
    if args.errors:
        print()
        print(errors_table(rows))
    if args.out:
        Path(args.out).write_text(json.dumps([asdict(r) for r in rows], indent=2))
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    from creditrl.experiments.grid_keys import keys_text

    p = sub.add_parser(
        "compare",
        help="a grid of arms x seeds at a fixed generation budget: table, plots and a verdict per arm",
        description=textwrap.fill(
            "Runs every arm of the grid file with every seed at the same budget, reports a table and plots, "
            "and ends with one line per arm against the reference: better, worse or no difference detectable, "
            "with the interval (seed-level paired t, Holm over the arms). Grid file keys (every one but "
            "arms/grid optional; docs/compare.md has a worked example):"
        )
        + "\n"
        + keys_text(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("grid", help="grid YAML (keys above; example grids/estimators.yaml)")
    add_report_args(
        p,
        quick="demo_quick sizes, a tiny budget, 2 seeds (numbers meaningless)",
        out="output directory (default runs/compare-<grid name>); finished runs in it are reused, "
        "interrupted ones continue from their last checkpoint",
        seeds="seeds 0..N-1 instead of the grid's",
        results="--timing: also write a results page (the table)",
    )
    p.add_argument(
        "--timing",
        action="store_true",
        help="instead: a controlled timing of the arms (short runs from the grid's start, first seed, one at a "
        "time in fresh processes, order rotated each round): seconds per iteration and ratio to the reference "
        "with its spread, to OUT/timing.json (default runs/timing-<name>); run it on an otherwise idle machine",
    )
    p.add_argument("--rounds", type=int, default=3, help="--timing: rounds, each arm once per round (default 3)")
    p.add_argument("--timing-iterations", type=int, default=3, help="--timing: iterations per run (default 3)")
    add_threads_arg(p)
    add_jobs_arg(p)
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("findings", help="run the committed finding grids (resumably) and write FINDINGS.md")
    p.add_argument("--root", default=".", help="the repository root (holds findings/ and grids/)")
    add_report_args(
        p,
        quick="tiny grids (numbers meaningless); writes runs/findings-quick",
        out="where to write (default ROOT/FINDINGS.md)",
    )
    p.add_argument(
        "--no-train", action="store_true", help="only the committed run summaries (findings/runs/): nothing trains"
    )
    p.add_argument(
        "--only",
        nargs="+",
        metavar="ID",
        help="train only these findings' grids, in this order (e.g. C3-arith C4-arith); the rest from summaries",
    )
    add_jobs_arg(p)
    p.set_defaults(func=cmd_findings)

    p = sub.add_parser(
        "eval", help="held-out exact match of checkpoints on a larger problem set, paired against a baseline"
    )
    add_config_args(p)
    p.add_argument(
        "checkpoints",
        nargs="+",
        help="checkpoint directories, run directories (latest checkpoint) or SFT cache entries",
    )
    p.add_argument(
        "--size",
        type=int,
        default=2048,
        help="held-out problems (default 2048; a run evaluates the first train.eval_size)",
    )
    p.add_argument(
        "--split",
        choices=("heldout", "train"),
        default="heldout",
        help="the problems' split (train: the split RL draws its prompts from, to see how often a start solves them)",
    )
    p.add_argument("--baseline", help="the checkpoint the differences are against (default: the first one)")
    p.add_argument("--out", help="also write the rows as JSON here")
    p.add_argument(
        "--errors",
        action="store_true",
        help="also count where each checkpoint's solutions first go wrong (arithmetic: slips, wrong operands, ...)",
    )
    p.set_defaults(func=cmd_eval)
