"""The ``creditrl`` command line: ``demo``, ``sft``, ``train``, ``bench``, ``prm ...``."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from creditrl.config import ConfigError, load_config


def _quiet_libraries() -> None:
    import warnings

    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    warnings.filterwarnings("ignore", category=FutureWarning)


def _run_dir(given: str | None, kind: str) -> Path:
    return Path(given) if given else Path("runs") / f"{kind}-{time.strftime('%Y%m%d-%H%M%S')}"


def cmd_sft(args: argparse.Namespace) -> int:
    from creditrl.train.sft import cached_sft

    cfg = load_config(args.config, args.set)
    path, metrics = cached_sft(cfg, progress=cfg.train.progress)
    print(json.dumps({"checkpoint": str(path), **metrics}, indent=2))
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    from creditrl.distributed import ddp
    from creditrl.train.rl import RLTrainer

    if args.resume:
        if args.config or args.set:
            raise ConfigError("--resume continues a run with its saved config.yaml; do not pass CONFIG or --set")
        trainer = RLTrainer.resume(Path(args.resume))
    else:
        cfg = load_config(args.config, args.set)
        trainer = RLTrainer(cfg, _run_dir(args.run_dir, "train"))
    main = ddp.is_main()  # rank 0 of a torchrun launch (or the only process) reports
    try:
        result = trainer.run()
    finally:
        ddp.shutdown()  # leave the data-parallel process group of a torchrun launch (no-op otherwise)
    if not main:
        return 0
    last_eval = next((r for r in reversed(result.history) if "eval/accuracy" in r), {})
    print(f"run dir: {result.run_dir}")
    print(f"held-out accuracy {last_eval.get('eval/accuracy', float('nan')):.3f}, "
          f"step accuracy {last_eval.get('eval/step_accuracy', float('nan')):.3f}")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from creditrl.experiments.demo import run_demo

    run_demo(_run_dir(args.run_dir, "demo"), quick=args.quick, overrides=args.set, config=args.config)
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from creditrl.bench.run import options_from_args, run_bench

    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    run_bench(options_from_args(args))
    return 0


def cmd_tree_report(args: argparse.Namespace) -> int:
    from creditrl.experiments.tree_report import run_tree_report

    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    run_tree_report(Path(args.out) if args.out else None, quick=args.quick, seeds=args.seeds, budget=args.budget)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="creditrl", description="RL fine-tuning where credit assignment comes first")
    sub = parser.add_subparsers(dest="command", required=True)

    def add_config_args(p: argparse.ArgumentParser, positional: bool = True) -> None:
        if positional:
            p.add_argument("config", nargs="?", help="YAML config file (defaults apply to missing keys)")
        p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override, e.g. credit.estimator=rloo")

    p = sub.add_parser("demo", help="SFT warm start, then outcome-GRPO vs step-level process-GRPO")
    p.add_argument("--quick", action="store_true", help="every output in under a minute (numbers meaningless)")
    p.add_argument("--run-dir", help="where to write (default runs/demo-TIMESTAMP)")
    p.add_argument("config", nargs="?", help="run both arms on this config instead of the packaged demo.yaml "
                   "(e.g. src/creditrl/configs/arith.yaml: operands 1-9, the demo until 2026-11-30)")
    add_config_args(p, positional=False)
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("sft", help="supervised warm start (cached by config hash)")
    add_config_args(p)
    p.set_defaults(func=cmd_sft)

    p = sub.add_parser("train", help="RL training")
    add_config_args(p)
    p.add_argument("--run-dir", help="where to write (default runs/train-TIMESTAMP)")
    p.add_argument("--resume", metavar="RUN_DIR", help="continue a run from its latest checkpoint")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("bench", help="rollout and GRPO iteration speed against TRL and HF generate")
    p.add_argument("--policy", default="sft", help="sft (the arith config's SFT policy), tiny (random init) or a model dir")
    p.add_argument("--curve", type=int, default=0, metavar="N", help="also N-iteration reward curves, TRL vs creditrl")
    p.add_argument("--scaling", action="store_true", help="also iteration time vs group size and max new tokens")
    p.add_argument("--no-trl", action="store_true", help="skip the TRL peer (trl not installed)")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    p.add_argument("--quick", action="store_true", help="tiny sizes: every section in seconds (numbers meaningless)")
    p.add_argument("--out", default="runs/bench", help="where bench.json and plots go")
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("tree-report", help="tree rollouts vs outcome GRPO over seeds at equal generated tokens")
    p.add_argument("--quick", action="store_true", help="tiny sizes (numbers meaningless)")
    p.add_argument("--seeds", type=int, default=None, help="seeds 0..N-1 (default 3)")
    p.add_argument("--budget", type=int, default=None, help="generated tokens per run (default 400,000)")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    p.add_argument("--out", help="run directory (default runs/tree-TIMESTAMP); finished runs in it are reused")
    p.set_defaults(func=cmd_tree_report)

    from creditrl.prm.cli import add_prm_parser

    add_prm_parser(sub, add_config_args)
    from creditrl.search.cli import add_search_parser

    add_search_parser(sub)
    from creditrl.inspect.cli import add_inspect_parser

    add_inspect_parser(sub)
    from creditrl.experiments.compare import add_compare_parser

    add_compare_parser(sub)
    from creditrl.experiments.findings import add_findings_parser
    from creditrl.experiments.value_report import add_value_report_parser

    add_findings_parser(sub)
    add_value_report_parser(sub)
    from creditrl.experiments.evaluate import add_eval_parser

    add_eval_parser(sub, add_config_args)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _quiet_libraries()
    try:
        return args.func(args)
    except (ConfigError, FileNotFoundError) as exc:
        print(f"creditrl: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
