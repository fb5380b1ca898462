"""``creditrl search [CONFIG]``: one test-time search method on any task with a step separator, on
the same config as ``creditrl train`` (task, policy, PRM, plus its ``search`` section); and
``creditrl search report`` (every method, accuracy against generated tokens)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from creditrl.cli.common import add_config_args, run_dir
from creditrl.config import load_config


def cmd_search(args: argparse.Namespace) -> int:
    from creditrl.search.runner import run_search

    overrides = list(args.set) + ([f"search.method={args.method}"] if args.method else [])
    cfg = load_config(args.config, overrides)
    result, setting = run_search(cfg)
    s = result.summary()
    print(
        f"search {s['method']} {s['setting']} on {len(result.problems)} {setting}, budget {s['budget']} tokens/problem"
    )
    print(
        f"accuracy {100 * result.accuracy:.1f}% ({sum(r.correct for r in result.problems)}/{len(result.problems)}) | "
        f"tokens/problem {result.tokens_mean:.1f} (max {s['tokens_max']}) | total {result.tokens_total} tokens | "
        f"{result.engine_calls} engine calls | {result.wall_s:.1f} s"
    )
    if result.note:
        print(result.note)
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        rows = [r.__dict__ for r in result.problems]
        out.write_text(json.dumps({"summary": s, "config": result.config.model_dump(), "problems": rows}, indent=2))
        print(f"per-problem results: {out}")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from creditrl.experiments.report import publish_report
    from creditrl.experiments.search_report import run_search_report

    where = run_dir(args.out, "search")
    run_search_report(
        where,
        quick=args.quick,
        prm_dir=args.prm,
        orm_dir=args.orm,
        problems=args.problems,
        overrides=args.set,
        temperature=args.temperature,
        config=args.config,
    )
    publish_report(where / "report.md", args.results, "Test-time search: accuracy against generated tokens")
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """``creditrl search [CONFIG] [--method M] [--set ...]`` and ``creditrl search report`` (parsed
    as ``search-report``, see :func:`creditrl.cli.main`)."""
    p = sub.add_parser(
        "search",
        help="test-time search over reasoning steps (greedy, best_of_n, beam, mcts) under a token budget",
        description="Run one search method (search.method) on search.problems problems of search.split of the "
        "config's task, with its policy (train.init) and PRM (search.prm or reward.prm); print accuracy "
        "and generated tokens. `creditrl search report` compares every method.",
    )
    add_config_args(p)
    p.add_argument("--method", help="shortcut for --set search.method=M: greedy | best_of_n | beam | mcts")
    p.add_argument("--out", help="write the summary and per-problem results to this JSON file")
    p.set_defaults(func=cmd_search)

    r = sub.add_parser(
        "search-report",
        help="`creditrl search report`: accuracy vs generated tokens of every method",
        description="Every search method on held-out problems of the config's task (any task with a step separator "
        "and a step checker; default: the packaged arith config, searched on 5-7 operations), from its "
        "start policy (train.init), each method's settings over the config's search section.",
    )
    add_config_args(r)
    r.add_argument("--quick", action="store_true", help="tiny sizes, well under a minute (numbers meaningless)")
    r.add_argument("--out", help="output directory (default runs/search-TIMESTAMP)")
    r.add_argument(
        "--results", metavar="PAGE", help="also write the report as a results page (e.g. docs/results/search.md)"
    )
    r.add_argument("--prm", help="use this PRM instead of training one on oracle step labels")
    r.add_argument("--orm", help="use this ORM instead of training one on outcomes")
    r.add_argument("--problems", type=int, default=None, help="held-out problems (default 128; quick: 4)")
    r.add_argument("--temperature", type=float, default=1.0, help="sampling temperature of every sampling method")
    r.set_defaults(func=cmd_report)
