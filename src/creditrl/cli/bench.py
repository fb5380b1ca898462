"""``creditrl bench``: rollout and GRPO iteration speed against TRL and HF ``generate``; with
``--performance``, long outputs, model sizes and whole study runs (:mod:`creditrl.bench.performance`)."""

from __future__ import annotations

import argparse

from creditrl.cli.common import add_threads_arg, set_threads


def cmd_bench(args: argparse.Namespace) -> int:
    set_threads(args.threads)
    if args.performance:
        from creditrl.bench.performance import options_from_args, run_performance

        if args.curve or args.scaling:
            raise SystemExit(
                "creditrl bench: --curve and --scaling are sections of the default bench, not of --performance"
            )
        if args.render:
            from pathlib import Path

            from creditrl.bench.performance import render_saved

            render_saved(Path(args.render), Path(args.results) if args.results else None)
            return 0
        if args.sections or args.update:
            from pathlib import Path

            from creditrl.bench.performance import remeasure

            if not (args.sections and args.update):
                raise SystemExit("creditrl bench --performance: --sections and --update go together")
            remeasure(Path(args.update), args.sections.split(","), options_from_args(args))
            return 0
        run_performance(options_from_args(args))
        return 0
    from creditrl.bench.run import options_from_args, run_bench

    run_bench(options_from_args(args))
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="rollout and GRPO iteration speed against TRL and HF generate")
    p.add_argument(
        "--policy",
        default="sft",
        help="sft (the arith config's SFT policy; with --performance the chain config's), tiny (random init) or a "
        "model dir",
    )
    p.add_argument("--curve", type=int, default=0, metavar="N", help="also N-iteration reward curves, TRL vs creditrl")
    p.add_argument("--scaling", action="store_true", help="also iteration time vs group size and max new tokens")
    p.add_argument(
        "--performance",
        action="store_true",
        help="instead: generated length, model size and study-settings benchmark against TRL, HF generate, the "
        "machine's copy bandwidth and matmul peak, and the baseline commit (performance.json)",
    )
    p.add_argument("--no-trl", action="store_true", help="skip the TRL peer (trl not installed)")
    add_threads_arg(p)
    p.add_argument("--quick", action="store_true", help="tiny sizes: every section in seconds (numbers meaningless)")
    p.add_argument(
        "--render",
        metavar="JSON",
        help="with --performance: re-render a finished run's page from its performance.json (no measuring)",
    )
    p.add_argument(
        "--sections",
        metavar="LIST",
        help="with --performance and --update: measure only these sections again (comma-separated: study, rss, "
        "forward, kl_skip, profile)",
    )
    p.add_argument(
        "--update",
        metavar="JSON",
        help="with --performance --sections: the saved run (performance.json) the sections go into; its page is "
        "republished",
    )
    p.add_argument("--out", default="runs/bench", help="where bench.json (or performance.json) and plots go")
    p.add_argument(
        "--results",
        metavar="PAGE",
        help="also write the tables as a results page (e.g. docs/results/bench.md, docs/results/performance.md)",
    )
    p.set_defaults(func=cmd_bench)
