"""``creditrl demo``, ``creditrl sft``, ``creditrl train`` and ``creditrl config``."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path

from creditrl.cli.common import add_config_args, run_dir
from creditrl.config import load_config
from creditrl.errors import ConfigError


def cmd_sft(args: argparse.Namespace) -> int:
    from creditrl.train.resolve import checked
    from creditrl.train.sft import cached_sft

    cfg = checked(load_config(args.config, args.set))
    path, metrics = cached_sft(cfg, progress=cfg.train.progress)
    if args.out:  # a plain HF folder of the warm start (the cache entry without its state file)
        import shutil

        out = Path(args.out)
        if out.exists() and any(out.iterdir()):
            raise ConfigError(f"--out {out}: not empty; name a new or empty directory")
        out.mkdir(parents=True, exist_ok=True)
        for f in path.iterdir():
            if f.is_file() and f.name not in ("trainer_state.json", "manifest.json"):
                shutil.copy2(f, out / f.name)
        path = out
    print(json.dumps({"checkpoint": str(path), **metrics}, indent=2))
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    from creditrl.train import rundir  # light: the lock is taken before torch is imported
    from creditrl.train.lifecycle import Interrupted, Signals

    if args.resume and (args.config or args.overwrite):
        raise ConfigError("--resume continues a run with its saved config.yaml; do not pass CONFIG or --overwrite")
    where = Path(args.resume) if args.resume else run_dir(args.run_dir, "train")
    main = rundir.launch_rank() == 0  # rank 0 of a torchrun launch (or the only process) owns the run directory
    try:
        with Signals(active=main), rundir.hold(where) if main else contextlib.nullcontext():
            result = _train(args, where, main)
    except Interrupted as exc:
        print(f"creditrl: {_interrupted_line(exc, args, where)}", file=sys.stderr)
        return exc.exit_code
    except OSError as exc:
        return _unwritable(exc, where)
    if not main:
        return 0
    last_eval = next((r for r in reversed(result.history) if "eval/accuracy" in r), {})
    print(f"run dir: {result.run_dir}")
    print(
        f"held-out accuracy {last_eval.get('eval/accuracy', float('nan')):.3f}, "
        f"step accuracy {last_eval.get('eval/step_accuracy', float('nan')):.3f}"
    )
    return 0


def _train(args: argparse.Namespace, where: Path, main: bool):
    """Build the run (a new one, or ``--resume``) and train it, inside the run directory's lock."""
    from creditrl.train import rundir

    if main and not args.resume:  # before the (long) build: one run per directory
        rundir.check_fresh(where, overwrite=args.overwrite)
    cfg = None if args.resume else load_config(args.config, args.set)  # a bad key fails before torch loads
    from creditrl.distributed import ddp
    from creditrl.train.rl import RLTrainer

    if cfg is None:
        trainer = RLTrainer.resume(where, args.set)
    else:
        if args.config:  # reward.source=module:function finds module.py beside the config
            from creditrl.rollout.segment import add_callable_folder

            add_callable_folder(Path(args.config).parent)
        trainer = RLTrainer.from_config(cfg, where, overwrite=args.overwrite)
    try:
        return trainer.run()
    finally:
        ddp.shutdown()  # leave the data-parallel process group of a torchrun launch (no-op otherwise)


def _interrupted_line(exc: KeyboardInterrupt, args: argparse.Namespace, where: Path) -> str:
    """The trainer's own line, or, when the signal came while the run was being built, what to run next."""
    from creditrl.train.lifecycle import resume_command

    if str(exc):
        return str(exc)
    if args.resume:
        return f"stopped by {exc.name} while the run was being built; resume with: {resume_command(where)}"
    return f"stopped by {exc.name} while the run was being built; nothing was trained: run the same command again"


def _unwritable(exc: OSError, where: Path) -> int:
    """A full disk, a read-only or forbidden file while training: one line (other OSErrors are re-raised)."""
    from creditrl.train.checkpoint import latest_name
    from creditrl.train.lifecycle import WRITE_ERRNOS, os_error_line, resume_command

    if exc.errno not in WRITE_ERRNOS:
        raise exc
    resumable = latest_name(where / "checkpoints") is not None
    then = f"resume with: {resume_command(where)}" if resumable else "run the same command again"
    print(f"creditrl: error: {os_error_line(exc)}; {then}", file=sys.stderr)
    return 2


def cmd_demo(args: argparse.Namespace) -> int:
    from creditrl.experiments.demo import run_demo

    run_demo(
        run_dir(args.run_dir, "demo"), quick=args.quick, overrides=args.set, config=args.config, results=args.results
    )
    return 0


def cmd_config(args: argparse.Namespace) -> int:
    """Print the config after loading and checking (``auto`` values that need the policy or a
    trained PRM are resolved when a run is built, and then written to its config.yaml)."""
    from creditrl.config.reference import reference_markdown
    from creditrl.train.resolve import checked

    if args.reference:
        sys.stdout.write(reference_markdown())
        return 0
    import yaml

    words = args.words[1:] if args.words[:1] == ["show"] else args.words
    if len(words) > 1:
        raise ConfigError(f"creditrl config [show] [CONFIG]: one config file, got {' '.join(words)}")
    cfg = checked(load_config(words[0] if words else None, args.set))
    sys.stdout.write(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="SFT warm start, then outcome-GRPO vs step-level process-GRPO")
    p.add_argument("--quick", action="store_true", help="every output in under a minute (numbers meaningless)")
    p.add_argument("--run-dir", help="where to write (default runs/demo-TIMESTAMP)")
    p.add_argument(
        "--results", metavar="PAGE", help="also write the report as a results page (e.g. docs/results/demo.md)"
    )
    p.add_argument(
        "config",
        nargs="?",
        help="run both arms on this config instead of the packaged demo.yaml "
        "(e.g. src/creditrl/configs/arith.yaml: operands 1-9)",
    )
    add_config_args(p, positional=False)
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("sft", help="supervised warm start (cached by config hash)")
    add_config_args(p)
    p.add_argument("--out", metavar="DIR", help="also write the warm start there, as a plain HF model folder")
    p.set_defaults(func=cmd_sft)

    from creditrl.config import Config

    sections = ", ".join(Config.model_fields)
    p = sub.add_parser(
        "train",
        help="RL training",
        epilog=f"Config sections: {sections}. `creditrl config show [CONFIG] [--set ...]` prints the resolved "
        "config as YAML (which train accepts back); `creditrl config --reference` documents every key.",
    )
    add_config_args(p)
    p.add_argument("--run-dir", help="where to write (default runs/train-TIMESTAMP)")
    p.add_argument(
        "--resume",
        metavar="RUN_DIR",
        help="continue a run from its newest intact checkpoint; --set may change only keys that leave the trained "
        "iterations as they were (train.iterations, cadences, trackers)",
    )
    p.add_argument(
        "--overwrite", action="store_true", help="start afresh in a --run-dir that already holds a run (its files go)"
    )
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("config", help="show the resolved config as YAML (or, with --reference, every key documented)")
    p.add_argument("words", nargs="*", metavar="[show] [CONFIG]", help="`show` (optional) and a YAML config file")
    add_config_args(p, positional=False)
    p.add_argument("--reference", action="store_true", help="the config reference (Markdown) generated from the schema")
    p.set_defaults(func=cmd_config)
