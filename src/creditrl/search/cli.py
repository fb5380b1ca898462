"""``creditrl search`` (one method on held-out arithmetic problems) and ``creditrl search report``."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from creditrl.config import ConfigError


def _policy_path(name: str) -> str:
    """``sft``: the arith config's cached SFT policy (operands 1-9, trained now if not cached); else a
    directory or ``tiny``."""
    if name != "sft":
        return name
    from creditrl.config import load_config
    from creditrl.config.loader import arith_config_path
    from creditrl.train.rl import resolve_init

    cfg = load_config(arith_config_path(False))
    return resolve_init(cfg, cfg.train.progress)


def cmd_search(args: argparse.Namespace) -> int:
    import torch

    from creditrl.policy.model import load_policy
    from creditrl.policy.static_engine import make_engine
    from creditrl.prm.source import load_prm
    from creditrl.search.config import SearchConfig, with_overrides
    from creditrl.search.methods import require_models, search
    from creditrl.tasks import make_task

    cfg = with_overrides(SearchConfig(method=args.method, budget=args.budget), args.set)
    require_models(cfg, has_prm=args.prm is not None, has_orm=args.orm is not None)
    if args.problems < 1:
        raise ConfigError(f"--problems must be >= 1, got {args.problems}")
    if args.threads:
        torch.set_num_threads(args.threads)
    model, tok = load_policy(_policy_path(args.policy))
    model.eval()
    task = make_task("arithmetic", min_ops=args.min_ops, max_ops=args.max_ops)
    problems = task.sample(args.problems, split=args.split, seed=args.problem_seed)
    engine = make_engine(model, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, kind="auto")
    result = search(
        problems, engine=engine, tokenizer=tok, task=task, config=cfg,
        prm=load_prm(args.prm) if args.prm else None, orm=load_prm(args.orm) if args.orm else None,
    )
    s = result.summary()
    print(f"search {cfg.method} {s['setting']} on {len(problems)} {args.split} arithmetic problems "
          f"({args.min_ops}-{args.max_ops} ops), budget {cfg.budget} tokens/problem")
    print(f"accuracy {100 * result.accuracy:.1f}% ({sum(r.correct for r in result.problems)}/{len(problems)}) | "
          f"tokens/problem {result.tokens_mean:.1f} (max {s['tokens_max']}) | total {result.tokens_total} tokens | "
          f"{result.engine_calls} engine calls | {result.wall_s:.1f} s")
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        rows = [r.__dict__ for r in result.problems]
        out.write_text(json.dumps({"summary": s, "config": cfg.__dict__, "problems": rows}, indent=2))
        print(f"per-problem results: {out}")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from creditrl.experiments.search_report import run_search_report

    run_search_report(
        Path(args.out) if args.out else None, quick=args.quick, prm_dir=args.prm, orm_dir=args.orm,
        problems=args.problems, overrides=args.set, temperature=args.temperature,
    )
    return 0


def add_search_parser(sub: argparse._SubParsersAction) -> None:
    """``creditrl search [--method ...]`` and ``creditrl search report``."""
    p = sub.add_parser(
        "search", help="test-time search over reasoning steps (greedy, best_of_n, beam, mcts) under a token budget",
        description="Run one search method on held-out arithmetic problems and print accuracy and generated tokens. "
                    "`creditrl search report` compares all methods.",
    )
    p.add_argument("--method", default="greedy", help="greedy | best_of_n | beam | mcts")
    p.add_argument("--policy", default="sft", help="policy directory, 'sft' (the arith config's cached SFT policy) or 'tiny'")
    p.add_argument("--prm", help="PRM directory (creditrl prm train): beam, mcts leaf_value=prm, best_of_n prm_*")
    p.add_argument("--orm", help="ORM directory: best_of_n selector=orm, mcts leaf_value=rollout_orm")
    p.add_argument("--budget", type=int, default=1024, help="generated tokens per problem, all engine output counted")
    p.add_argument("--problems", type=int, default=128, help="number of problems")
    p.add_argument("--min-ops", type=int, default=5)
    p.add_argument("--max-ops", type=int, default=7)
    p.add_argument("--split", default="heldout", help="train | heldout")
    p.add_argument("--problem-seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    p.add_argument("--out", help="write the summary and per-problem results to this JSON file")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="search setting, e.g. width=4, expansions=4, leaf_value=rollout_orm (see SearchConfig)")
    p.set_defaults(func=cmd_search)

    ssub = p.add_subparsers(dest="search_command")
    r = ssub.add_parser("report", help="accuracy vs generated tokens of every method (report.md, summary.json, plot)")
    r.add_argument("--quick", action="store_true", help="tiny sizes, well under a minute (numbers meaningless)")
    r.add_argument("--out", help="output directory (default runs/search-TIMESTAMP)")
    r.add_argument("--prm", help="use this PRM instead of training one on oracle step labels")
    r.add_argument("--orm", help="use this ORM instead of training one on outcomes")
    r.add_argument("--problems", type=int, default=None, help="held-out problems (default 128; quick: 4)")
    r.add_argument("--temperature", type=float, default=1.0, help="sampling temperature of every sampling method")
    r.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override of the arith config (e.g. train.progress=false)")
    r.set_defaults(func=cmd_report)
