"""``creditrl compare``, ``findings``, ``value-report``, ``tree-report``, ``long-report`` and
``eval``: the experiments that compare credit-assignment choices over seeds, and the reports on
a setting's start policy."""

from __future__ import annotations

import argparse
import json
import textwrap
import time
from dataclasses import asdict
from pathlib import Path

from creditrl.cli.common import add_config_args, add_threads_arg, set_threads


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


def cmd_value_report(args: argparse.Namespace) -> int:
    from creditrl.experiments.value_report import run_value_report

    set_threads(args.threads)
    run_value_report(Path(args.out), quick=args.quick, config=args.config, overrides=args.set)
    return 0


def cmd_tree_report(args: argparse.Namespace) -> int:
    from creditrl.experiments.tree_report import run_tree_report

    set_threads(args.threads)
    run_tree_report(
        Path(args.out) if args.out else None,
        quick=args.quick,
        seeds=args.seeds,
        budget=args.budget,
        config=args.config,
        overrides=args.set,
    )
    return 0


def cmd_exposure_report(args: argparse.Namespace) -> int:
    from creditrl.experiments.exposure_report import ARMS, VARIANTS, exposure_markdown, run_exposure_report
    from creditrl.experiments.report import write_results

    set_threads(args.threads)
    summaries = Path(args.summaries) if args.summaries else None
    out = Path(args.out) if args.out else None
    summary = run_exposure_report(
        out,
        quick=args.quick,
        config=args.config,
        overrides=args.set,
        seeds=args.seeds,
        jobs=args.jobs,
        summaries=summaries,
    )
    table = exposure_markdown(summary)
    print("\n" + table)
    variants = "; ".join(f"**{v}**: `{' '.join(o) or '(teacher forcing)'}`" for v, o in VARIANTS.items())
    arms = "; ".join(f"**{a}**: `{' '.join(o)}`" for a, o in ARMS.items())
    body = (
        f"Task {summary['task']}; seeds {summary['seeds']} (seed s: `sft.seed=s`, then `train.seed=s`); SFT "
        f"variants: {variants}. RL from each start: {arms}; {summary['samples']:,} samples per run.\n\n"
        "*Teacher-forced step accuracy*: the share of a reference solution's steps whose every token is the "
        "start's argmax given the reference prefix; *free-running*: the share of the reference's steps its own "
        "greedy solution gets right (stop at the first error); *gap* = the first minus the second, the exposure "
        "bias. Means ± 95% Student-t intervals over the seeds; the last row pairs the variants seed by seed.\n\n"
        f"{table}"
    )
    write_results(args.results, "Scheduled sampling against exposure bias", body)
    return 0


def cmd_long_report(args: argparse.Namespace) -> int:
    from creditrl.experiments.long_report import run_long_report

    set_threads(args.threads)
    run_long_report(
        args.results,
        config=args.config,
        overrides=args.set,
        problems=args.problems,
        lengths=args.lengths,
        quick=args.quick,
        temperature=args.temperature,
    )
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from creditrl.experiments.evaluate import errors_table, evaluate_checkpoints, markdown_table

    rows = evaluate_checkpoints(
        args.config, args.checkpoints, size=args.size, baseline=args.baseline, overrides=args.set, errors=args.errors
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
    p.add_argument(
        "--quick", action="store_true", help="demo_quick sizes, a tiny budget, 2 seeds (numbers meaningless)"
    )
    p.add_argument(
        "--out",
        help="output directory (default runs/compare-<grid name>); finished runs in it are reused, "
        "interrupted ones continue from their last checkpoint",
    )
    p.add_argument("--seeds", type=int, default=None, help="seeds 0..N-1 instead of the grid's")
    p.add_argument(
        "--timing",
        action="store_true",
        help="instead: a controlled timing of the arms (short runs from the grid's start, first seed, one at a "
        "time in fresh processes, order rotated each round): seconds per iteration and ratio to the reference "
        "with its spread, to OUT/timing.json (default runs/timing-<name>); run it on an otherwise idle machine",
    )
    p.add_argument("--rounds", type=int, default=3, help="--timing: rounds, each arm once per round (default 3)")
    p.add_argument("--timing-iterations", type=int, default=3, help="--timing: iterations per run (default 3)")
    p.add_argument("--results", metavar="PAGE", help="--timing: also write a results page (the table)")
    add_threads_arg(p)
    add_jobs_arg(p)
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("findings", help="run the committed finding grids (resumably) and write FINDINGS.md")
    p.add_argument("--root", default=".", help="the repository root (holds findings/ and grids/)")
    p.add_argument("--quick", action="store_true", help="tiny grids (numbers meaningless); writes runs/findings-quick")
    p.add_argument("--out", help="where to write (default ROOT/FINDINGS.md)")
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
        "value-report",
        help="value estimates (critic, dual critic, MC K, tree) vs true step values",
        description="On the config's task (any task with a step separator and a step checker; "
        "default: the packaged arith config), from its start policy (train.init).",
    )
    add_config_args(p)
    p.add_argument("--out", default="runs/value-report", help="output directory (a finished report is read back)")
    p.add_argument("--quick", action="store_true", help="tiny sizes (numbers meaningless)")
    add_threads_arg(p)
    p.set_defaults(func=cmd_value_report)

    p = sub.add_parser(
        "tree-report",
        help="tree rollouts vs outcome GRPO over seeds at equal generated tokens",
        description="On the config's task (any task with a step separator and a step checker; "
        "default: the packaged arith config, RL on 5-7 operations), from its start "
        "policy (train.init).",
    )
    add_config_args(p)
    p.add_argument("--quick", action="store_true", help="tiny sizes (numbers meaningless)")
    p.add_argument("--seeds", type=int, default=None, help="seeds 0..N-1 (default 3)")
    p.add_argument("--budget", type=int, default=None, help="generated tokens per run (default 400,000)")
    add_threads_arg(p)
    p.add_argument("--out", help="run directory (default runs/tree-TIMESTAMP); finished runs in it are reused")
    p.set_defaults(func=cmd_tree_report)

    p = sub.add_parser(
        "exposure-report",
        help="plain SFT vs scheduled sampling: exposure bias, and outcome / process GRPO from each start",
        description="Per seed, both SFT variants (plain, scheduled sampling), their teacher-forced and free-running "
        "step accuracy on held-out problems, then outcome GRPO and process GRPO from each (default: the packaged "
        "arith config).",
    )
    add_config_args(p)
    p.add_argument("--quick", action="store_true", help="tiny sizes (numbers meaningless)")
    p.add_argument("--seeds", type=int, default=None, help="seeds 0..N-1 (default 3)")
    p.add_argument("--out", help="run directory (default runs/exposure-TIMESTAMP); finished runs in it are reused")
    p.add_argument("--summaries", help="keep each finished run's summary and each start's measurements here")
    p.add_argument("--results", metavar="PAGE", help="also write a results page (docs/results/scheduled_sampling.md)")
    add_jobs_arg(p)
    add_threads_arg(p)
    p.set_defaults(func=cmd_exposure_report)

    p = sub.add_parser(
        "long-report",
        help="the long-output setting's SFT start per response length: tokens, per-step and solution accuracy",
        description="On held-out chain problems of n - 2 .. n + 2 steps for each length n (default n = 6, 25, 51, "
        "99: about 64, 256, 512 and 1,000 tokens), the SFT start policy of the config (default: the packaged "
        "chain config), greedy and sampled at the rollout temperature: mean generated tokens, per-step accuracy p, "
        "p^n and solution accuracy.",
    )
    add_config_args(p)
    p.add_argument("--problems", type=int, default=None, help="held-out problems per length (default 256; quick: 8)")
    p.add_argument(
        "--lengths", type=int, nargs="+", default=None, metavar="N", help="chain lengths (default 6 25 51 99)"
    )
    p.add_argument("--temperature", type=float, default=None, help="sampling temperature (default rollout.temperature)")
    p.add_argument("--quick", action="store_true", help="a 20-step SFT, lengths 2 and 4 (numbers meaningless)")
    p.add_argument(
        "--results", metavar="PAGE", help="also write the report as a results page (e.g. docs/results/long_outputs.md)"
    )
    add_threads_arg(p)
    p.set_defaults(func=cmd_long_report)

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
    p.add_argument("--baseline", help="the checkpoint the differences are against (default: the first one)")
    p.add_argument("--out", help="also write the rows as JSON here")
    p.add_argument(
        "--errors",
        action="store_true",
        help="also count where each checkpoint's solutions first go wrong (arithmetic: slips, wrong operands, ...)",
    )
    p.set_defaults(func=cmd_eval)
