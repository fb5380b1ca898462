"""``creditrl prm label | train | eval | score``. The PRM study (labelers, AUROC, MC labels, best-of-N, RL with
the PRM) is ``python -m studies.prm``."""

from __future__ import annotations

import argparse
import functools
import json
from collections.abc import Callable
from pathlib import Path

from creditrl.cli.common import add_config_args, set_threads
from creditrl.config import Config, load_config
from creditrl.errors import ConfigError


def _one_line(cmd: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """A ``creditrl prm`` command whose ValueErrors (bad data or settings found while labelling or
    training: an empty step, a prompt over the PRM's length) print as one line, like a config error."""

    @functools.wraps(cmd)
    def run(args: argparse.Namespace) -> int:
        try:
            return cmd(args)
        except ConfigError:
            raise
        except ValueError as exc:
            raise ConfigError(f"creditrl prm {args.prm_command}: {exc}") from exc

    return run


def _policy(cfg: Config):
    """The start policy of ``cfg`` (``train.init``), loaded for sampling: (path, model, tokenizer)."""
    from creditrl.policy.model import load_policy
    from creditrl.train.build import start_policy

    set_threads(cfg.train.threads)
    path = start_policy(cfg, progress=cfg.train.progress)
    model, tok = load_policy(path, seed=cfg.policy.init_seed)
    return path, model.eval(), tok


def cmd_label(args: argparse.Namespace) -> int:
    from creditrl.prm.cache import label_policy_samples
    from creditrl.prm.data import save_stepwise
    from creditrl.prm.pipeline import label_quality
    from creditrl.train.resolve import checked

    cfg = checked(load_config(args.config, args.set))
    _, model, tok = _policy(cfg)
    examples, info = label_policy_samples(cfg, model, tok)
    save_stepwise(examples, args.out)
    print(json.dumps({"out": args.out, "examples": len(examples), **info, **label_quality(examples)}, indent=2))
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    from creditrl.prm.data import load_stepwise
    from creditrl.prm.train import train_prm_from_examples
    from creditrl.train.resolve import checked

    examples = load_stepwise(args.data)  # a bad file fails in one line, before the policy is built or trained
    if all(label is None for ex in examples for label in ex.labels):
        raise ConfigError(f"{args.data}: no labelled step (every label is null); expected at least one label in [0, 1]")
    cfg = checked(load_config(args.config, args.set))
    init_path, _, _ = _policy(cfg)
    metrics = train_prm_from_examples(cfg, init_path, examples, Path(args.out), cfg.train.progress)
    print(json.dumps({"out": args.out, **{k: v for k, v in metrics.items() if k != "prm/loss_curve"}}, indent=2))
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from creditrl.prm.data import load_stepwise
    from creditrl.prm.pipeline import evaluate_prm, reference_likelihood_auroc
    from creditrl.prm.source import load_prm

    examples = load_stepwise(args.data)  # a bad file fails in one line, before the PRM is loaded
    if any("oracle" not in ex.meta for ex in examples):
        raise ConfigError(
            f"{args.data}: every row needs meta.oracle (true step labels), as `creditrl prm label` writes"
        )
    prm, tok = load_prm(args.prm)
    score, probe = evaluate_prm(prm, tok, examples)
    print(f"step AUROC against the oracle labels: {score:.4f}")
    base = reference_likelihood_auroc(prm, tok, examples)
    if base is not None:
        print(f"baseline, the reference policy's summed step log-prob alone (untrained): {base:.4f}")
    print()
    print(probe.markdown())
    return 0


def cmd_score(args: argparse.Namespace) -> int:
    from creditrl.prm.pipeline import to_steps
    from creditrl.prm.source import load_prm

    prm, tok = load_prm(args.prm)
    steps = to_steps(args.completion, args.separator)
    for step, score in zip(steps, prm.score(tok, [(args.prompt, steps)])[0]):
        print(f"{score:.4f}  {step}")
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    prm = sub.add_parser("prm", help="process reward models: label, train, eval, score")
    psub = prm.add_subparsers(dest="prm_command", required=True)

    p = psub.add_parser("label", help="sample policy solutions and label their steps (prm.labeler)")
    add_config_args(p)
    p.add_argument("--out", required=True, help="stepwise JSONL or Parquet file to write")
    p.set_defaults(func=_one_line(cmd_label))

    p = psub.add_parser("train", help="train a PRM on a stepwise file, starting from the policy (train.init)")
    p.add_argument("data", help="stepwise JSONL/Parquet file")
    add_config_args(p)
    p.add_argument("--out", required=True, help="directory to write the PRM to")
    p.set_defaults(func=_one_line(cmd_train))

    p = psub.add_parser("eval", help="step AUROC against oracle labels and the shortcut probe")
    p.add_argument("prm", help="PRM directory")
    p.add_argument("data", help="stepwise file written by `creditrl prm label` (meta.oracle holds the truth)")
    p.set_defaults(func=_one_line(cmd_eval))

    p = psub.add_parser("score", help="score the steps of one completion")
    p.add_argument("prm", help="PRM directory")
    p.add_argument("--prompt", required=True)
    p.add_argument("--completion", required=True)
    p.add_argument("--separator", default=";")
    p.set_defaults(func=_one_line(cmd_score))
