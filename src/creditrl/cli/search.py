"""``creditrl search [CONFIG]``: one test-time search method on any task with a step separator, on
the same config as ``creditrl train`` (task, policy, PRM, plus its ``search`` section). Every method
against generated tokens is the search study, ``python -m studies.search``."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from creditrl.cli.common import add_config_args
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


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """``creditrl search [CONFIG] [--method M] [--set ...]``."""
    p = sub.add_parser(
        "search",
        help="test-time search over reasoning steps (greedy, best_of_n, beam, mcts) under a token budget",
        description="Run one search method (search.method) on search.problems problems of search.split of the "
        "config's task, with its policy (train.init) and PRM (search.prm or reward.prm); print accuracy "
        "and generated tokens. `python -m studies.search` compares every method.",
    )
    add_config_args(p)
    p.add_argument("--method", help="shortcut for --set search.method=M: greedy | best_of_n | beam | mcts")
    p.add_argument("--out", help="write the summary and per-problem results to this JSON file")
    p.set_defaults(func=cmd_search)
