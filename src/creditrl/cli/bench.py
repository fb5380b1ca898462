"""``creditrl bench``: rollout and GRPO iteration speed against TRL and HF ``generate``."""

from __future__ import annotations

import argparse

from creditrl.cli.common import add_threads_arg, set_threads


def cmd_bench(args: argparse.Namespace) -> int:
    from creditrl.bench.run import options_from_args, run_bench

    set_threads(args.threads)
    run_bench(options_from_args(args))
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="rollout and GRPO iteration speed against TRL and HF generate")
    p.add_argument(
        "--policy", default="sft", help="sft (the arith config's SFT policy), tiny (random init) or a model dir"
    )
    p.add_argument("--curve", type=int, default=0, metavar="N", help="also N-iteration reward curves, TRL vs creditrl")
    p.add_argument("--scaling", action="store_true", help="also iteration time vs group size and max new tokens")
    p.add_argument("--no-trl", action="store_true", help="skip the TRL peer (trl not installed)")
    add_threads_arg(p)
    p.add_argument("--quick", action="store_true", help="tiny sizes: every section in seconds (numbers meaningless)")
    p.add_argument("--out", default="runs/bench", help="where bench.json and plots go")
    p.add_argument(
        "--results", metavar="PAGE", help="also write the tables as a results page (e.g. docs/results/bench.md)"
    )
    p.set_defaults(func=cmd_bench)
