"""``creditrl prm label | train | eval | score | report``."""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path
from typing import Callable

from creditrl.config import Config, ConfigError, load_config


def _policy(cfg: Config):
    import torch

    from creditrl.policy.model import load_policy
    from creditrl.train.rl import resolve_init

    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    path = resolve_init(cfg, cfg.train.progress)
    model, tok = load_policy(path, seed=cfg.policy.init_seed)
    return path, model.eval(), tok


def cmd_label(args: argparse.Namespace) -> int:
    from creditrl.prm.cache import label_policy_samples
    from creditrl.prm.data import save_stepwise
    from creditrl.prm.pipeline import label_quality

    cfg = load_config(args.config, args.set)
    _, model, tok = _policy(cfg)
    examples, info = label_policy_samples(cfg, model, tok)
    save_stepwise(examples, args.out)
    print(json.dumps({"out": args.out, "examples": len(examples), **info, **label_quality(examples)}, indent=2))
    return 0


def train_from_examples(cfg: Config, init_path: str, examples, out: Path, progress: bool) -> dict:
    """Train a PRM on ``examples`` from the policy at ``init_path``; save model + tokenizer."""
    from creditrl.policy.device import resolve_device
    from creditrl.policy.model import load_policy
    from creditrl.prm.augment import augment_negatives
    from creditrl.prm.model import ProcessRewardModel
    from creditrl.prm.train import train_prm

    p = cfg.prm
    policy, tok = load_policy(init_path)
    if p.augment_rate > 0:
        examples = augment_negatives(examples, rate=p.augment_rate, rng=random.Random(p.seed))
    prm = ProcessRewardModel.from_model(
        policy, members=p.members, combine=p.combine, seed=p.seed, likelihood=p.likelihood
    )
    prm.to(resolve_device(cfg.policy.device))  # trained where the policy trains
    metrics = train_prm(
        prm, tok, examples, steps=p.steps, batch_size=p.batch_size, lr=p.lr, soft=p.soft,
        max_step_tokens=p.max_step_tokens, seed=p.seed, progress=progress, train_backbone=p.train_backbone,
    )
    prm.to("cpu")  # saved from the CPU; a reader places it (reward.prm: on policy.device)
    out.mkdir(parents=True, exist_ok=True)
    prm.save(out)
    tok.save_pretrained(out)
    (out / "train_metrics.json").write_text(json.dumps(metrics, indent=2))
    return metrics


def cmd_train(args: argparse.Namespace) -> int:
    from creditrl.prm.data import load_stepwise

    cfg = load_config(args.config, args.set)
    init_path, _, _ = _policy(cfg)
    metrics = train_from_examples(cfg, init_path, load_stepwise(args.data), Path(args.out), cfg.train.progress)
    print(json.dumps({"out": args.out, **{k: v for k, v in metrics.items() if k != "prm/loss_curve"}}, indent=2))
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from creditrl.prm.data import load_stepwise
    from creditrl.prm.pipeline import evaluate_prm, reference_likelihood_auroc
    from creditrl.prm.source import load_prm

    prm, tok = load_prm(args.prm)
    examples = load_stepwise(args.data)
    if any("oracle" not in ex.meta for ex in examples):
        raise ConfigError(f"{args.data}: every row needs meta.oracle (true step labels), as `creditrl prm label` writes")
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


def cmd_report(args: argparse.Namespace) -> int:
    from creditrl.experiments.prm_report import run_prm_report

    run_prm_report(Path(args.run_dir) if args.run_dir else None, quick=args.quick, overrides=args.set)
    return 0


def add_prm_parser(sub: argparse._SubParsersAction, add_config_args: Callable) -> None:
    prm = sub.add_parser("prm", help="process reward models: label, train, eval, score, report")
    psub = prm.add_subparsers(dest="prm_command", required=True)

    p = psub.add_parser("label", help="sample policy solutions and label their steps (prm.labeler)")
    add_config_args(p)
    p.add_argument("--out", required=True, help="stepwise JSONL or Parquet file to write")
    p.set_defaults(func=cmd_label)

    p = psub.add_parser("train", help="train a PRM on a stepwise file, starting from the policy (train.init)")
    p.add_argument("data", help="stepwise JSONL/Parquet file")
    add_config_args(p)
    p.add_argument("--out", required=True, help="directory to write the PRM to")
    p.set_defaults(func=cmd_train)

    p = psub.add_parser("eval", help="step AUROC against oracle labels and the shortcut probe")
    p.add_argument("prm", help="PRM directory")
    p.add_argument("data", help="stepwise file written by `creditrl prm label` (meta.oracle holds the truth)")
    p.set_defaults(func=cmd_eval)

    p = psub.add_parser("score", help="score the steps of one completion")
    p.add_argument("prm", help="PRM directory")
    p.add_argument("--prompt", required=True)
    p.add_argument("--completion", required=True)
    p.add_argument("--separator", default=";")
    p.set_defaults(func=cmd_score)

    p = psub.add_parser("report", help="the PRM acceptance experiments: AUROC, MC labels, best-of-N, probe")
    p.add_argument("--quick", action="store_true", help="tiny sizes (numbers meaningless)")
    p.add_argument("--run-dir", help="where to write (default runs/prm-TIMESTAMP)")
    add_config_args(p, positional=False)
    p.set_defaults(func=cmd_report)
