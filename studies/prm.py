"""The PRM life cycle measured end to end, on any task with reasoning steps (the config's; default:
the packaged arith config).

    python -m studies.prm [CONFIG] [--set KEY=VALUE ...] [--quick] [--out DIR] [--results docs/results/prm.md]

From the config's start policy (``train.init``) on the config's task (:mod:`studies.common`; by
default the packaged arith config: its SFT policy, 4-6-operation problems, operands 1-9):

1. sample training and held-out solutions from the policy;
2. label the training steps with ``oracle``, ``mc`` (hard, N) and ``outcome_heuristic``, and
   make ORM data (the outcome on the last step only); report each labeler against the oracle;
3. train one PRM per labeler and an ORM, all from the SFT weights, with the same budget;
4. step AUROC of each on the held-out steps (oracle labels), and the shortcut probe;
5. MC labels on the held-out steps for N in 1..16: false-positive rate of hard vs soft labels;
6. best-of-N on held-out problems for N in {1, 4, 16, 64}: PRM (min / product / last / mean),
   ORM and majority vote over the task's answers (``extract_answer`` / ``same_answer``; a task
   without them is voted on whole completions, and the report says so), with ``plots/best_of_n.png``;
7. RL with the learned PRM as step reward (``grpo_process``) from the start policy.

Writes ``report.md``, ``summary.json``, ``plots/`` and the trained models under ``prms/`` (``--out``,
default ``runs/prm-TIMESTAMP``), and with ``--results PAGE`` the report as a results page.
"""

from __future__ import annotations

import argparse
import functools
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from creditrl.config import Config, load_config
from creditrl.experiments.report import plt
from creditrl.policy.engines import GenerationEngine, SamplingParams, make_engine
from creditrl.policy.model import load_policy
from creditrl.prm.cache import load_completer
from creditrl.prm.data import StepwiseExample
from creditrl.prm.labels import mc_labels
from creditrl.prm.metrics import Candidate, auroc, best_of_n_accuracy, false_positive_rate
from creditrl.prm.pipeline import Sample, label_quality, label_samples, sample_solutions, step_records
from creditrl.prm.probe import shortcut_probe
from creditrl.prm.source import load_prm
from creditrl.prm.train import train_prm_from_examples
from creditrl.tasks import Task
from creditrl.tasks.base import answer_of, majority_note, same_answer
from creditrl.train.build import start_policy
from creditrl.train.rl import RLTrainer
from studies.common import base_config, logger, parser, publish_report, run, step_task, task_phrase

TITLE = "Process reward models: the PRM report"


@dataclass(frozen=True)
class Sizes:
    train_problems: int = 256  # x samples_per_problem training solutions (MC labels cost ~60 s per 64)
    samples_per_problem: int = 4
    heldout_problems: int = 128  # x samples_per_problem held-out solutions (AUROC, probe)
    mc_n: int = 8  # MC continuations per step for the mc labeler
    fpr_problems: int = 64  # held-out problems x samples_per_problem for the MC label table
    fpr_ns: tuple[int, ...] = (1, 2, 4, 8, 16)
    bon_problems: int = 128  # best-of-N problems, each with max(bon_ns) samples
    bon_ns: tuple[int, ...] = (1, 4, 16, 64)
    prm_steps: int = 600
    augment_rate: float = 0.0
    rl_iterations: int = 150


QUICK = Sizes(
    train_problems=12,
    samples_per_problem=2,
    heldout_problems=6,
    mc_n=2,
    fpr_problems=3,
    fpr_ns=(1, 2),
    bon_problems=3,
    bon_ns=(1, 2),
    prm_steps=4,
    augment_rate=0.5,
    rl_iterations=2,
)


def _auroc(records) -> float:
    """AUROC of PRM scores against labels; NaN when one class is missing (tiny quick runs)."""
    labels = [r.label for r in records]
    return auroc([r.score for r in records], labels) if 0.0 < sum(labels) < len(labels) else float("nan")


def orm_examples(samples: Sequence[Sample]) -> list[StepwiseExample]:
    """ORM data: the outcome as the label of the last step, every other step unlabelled."""
    return [
        StepwiseExample(
            s.problem.prompt,
            list(s.steps),
            [None] * (len(s.steps) - 1) + [float(s.outcome)],
            {"outcome": float(s.outcome), "oracle": list(s.oracle)},
        )
        for s in samples
        if s.steps
    ]


def mc_label_table(
    engine: GenerationEngine, tok, task, samples: Sequence[Sample], ns: Sequence[int], params: SamplingParams
) -> list[dict[str, float]]:
    """False-positive rate (and agreement) against the oracle of hard and soft MC labels for each
    N, from one run of max(ns) continuations per step prefix (the first N of them for each N)."""
    res = mc_labels(
        engine,
        tok,
        task,
        [(s.problem, s.steps) for s in samples if s.steps],
        n=max(ns),
        params=params,
        generator=torch.Generator().manual_seed(7),
        max_prefixes_per_call=max(1, 2048 // max(ns)),
    )
    truth = [s.oracle for s in samples if s.steps]
    rows = []
    for n in ns:
        hard, soft, true = [], [], []
        for outs, labels in zip(res.outcomes, truth):
            for o, t in zip(outs, labels):
                if t is None:
                    continue
                share = sum(o[:n]) / n
                hard.append(1.0 if share > 0 else 0.0)
                soft.append(share)
                true.append(t)
        rows.append(
            {
                "N": n,
                "hard_fpr": false_positive_rate(hard, true),
                "soft_fpr": false_positive_rate(soft, true),
                "hard_agreement": sum((h >= 0.5) == (t >= 0.5) for h, t in zip(hard, true)) / len(true),
                "soft_agreement": sum((s >= 0.5) == (t >= 0.5) for s, t in zip(soft, true)) / len(true),
                "steps": len(true),
            }
        )
    return rows


def run_prm_report(
    run_dir: Path | None, *, quick: bool = False, config: str | Path | None = None, overrides: list[str] | None = None
) -> dict[str, Any]:
    """The whole report on the task of ``config`` + ``overrides`` (default: the packaged arith
    config, :mod:`studies.common`); writes ``run_dir`` and returns the summary.

    Raises:
        ConfigError: Before anything is loaded, for a bad config or a task without reasoning steps.
    """
    sizes = QUICK if quick else Sizes()
    base = base_config(config, quick)
    cfg = load_config(base, overrides or [])
    task = step_task(cfg, "the PRM study")
    run_dir = Path(run_dir or Path("runs") / f"prm-{time.strftime('%Y%m%d-%H%M%S')}")
    (run_dir / "plots").mkdir(parents=True, exist_ok=True)
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    start = time.time()
    log = logger("studies.prm")
    init = start_policy(cfg, task, progress=cfg.train.progress)
    policy, tok = load_policy(init)
    policy.eval()
    params = SamplingParams(max_new_tokens=cfg.rollout.max_new_tokens, temperature=1.0)
    engine = make_engine(
        policy, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, kind=cfg.policy.engine, kernels=cfg.policy.kernels
    )
    sampler = _Sampler(policy, tok, task, params)

    log(f"sampling {sizes.train_problems} x {sizes.samples_per_problem} training solutions from {init}")
    train = sampler("train", sizes.train_problems, sizes.samples_per_problem, 0)
    held = sampler("heldout", sizes.heldout_problems, sizes.samples_per_problem, 1)
    completer, ctok = load_completer(cfg, policy, tok)
    datasets, quality = _labelled(cfg, task, train, completer, ctok, sizes, params, log)
    aurocs, train_metrics, probe_records = _train_and_score(cfg, init, datasets, held, task, sizes, run_dir, log)
    log("MC label table (hard vs soft against the oracle)")
    c_engine = (
        engine
        if completer is policy
        else make_engine(
            completer,
            eos_id=tok.eos_token_id,
            pad_id=tok.pad_token_id,
            kind=cfg.policy.engine,
            kernels=cfg.policy.kernels,
        )
    )
    fpr_rows = mc_label_table(
        c_engine, tok, task, held[: sizes.fpr_problems * sizes.samples_per_problem], sizes.fpr_ns, params
    )

    log(f"best-of-N on {sizes.bon_problems} held-out problems x {max(sizes.bon_ns)} samples")
    bon = sampler("heldout", sizes.bon_problems, max(sizes.bon_ns), 2)
    bon_table = best_of_n_table(task, bon, run_dir / "prms", sizes.bon_ns)
    _plot_best_of_n(bon_table, run_dir / "plots" / "best_of_n.png", task_phrase(cfg))

    log(f"RL with the oracle-label PRM as step reward ({sizes.rl_iterations} iterations)")
    rl_over = (overrides or []) + [
        "reward.source=prm",
        f"reward.prm={run_dir / 'prms' / 'oracle'}",
        "credit.estimator=grpo_process",
        "credit.normaliser=batch",
        f"train.iterations={sizes.rl_iterations}",
    ]
    trainer = RLTrainer.from_config(load_config(base, rl_over), run_dir / "rl_prm", init_path=init, overwrite=True)
    history = trainer.run().history
    evals = [(r["iteration"], r["eval/accuracy"]) for r in history if "eval/accuracy" in r]

    probe_md, probe_numbers = "(not enough labelled steps of both kinds for the probe)", {}
    if sum(r.label for r in probe_records) >= 2 and sum(1 - r.label for r in probe_records) >= 2:
        probe = shortcut_probe(probe_records, tokenizer=load_prm(str(run_dir / "prms" / "oracle"))[1])
        probe_md, probe_numbers = probe.markdown(), probe.__dict__
    summary = {
        "sizes": sizes.__dict__,
        "task": {"name": cfg.task.name, "args": dict(cfg.task.args)},
        "policy": init,
        "completer": cfg.prm.completer or init,
        "label_quality": quality,
        "auroc": aurocs,
        "train": train_metrics,
        "mc_label_table": fpr_rows,
        "best_of_n": bon_table,
        "majority_note": majority_note(task),
        "probe": probe_numbers,
        "rl_prm": {"evals": evals},
        "wall_s": time.time() - start,
    }
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    (run_dir / "report.md").write_text(_report(summary, probe_md, quick))
    log(f"report: {run_dir / 'report.md'}")
    print((run_dir / "report.md").read_text())
    return summary


class _Sampler:
    """Policy solutions of ``n_problems`` problems of a split, ``per`` each, in chunks that bound the
    KV cache of one generate call."""

    def __init__(self, policy, tok, task: Task, params: SamplingParams) -> None:
        self.policy, self.tok, self.task, self.params = policy, tok, task, params

    def __call__(self, split: str, n_problems: int, per: int, seed: int) -> list[Sample]:
        problems = self.task.sample(n_problems, split=split, seed=seed)
        chunk = max(1, 1024 // per)
        return [
            s
            for i in range(0, len(problems), chunk)
            for s in sample_solutions(
                self.policy,
                self.tok,
                self.task,
                problems[i : i + chunk],
                samples=per,
                params=self.params,
                seed=seed + i,
            )
        ]


def _labelled(
    cfg: Config, task: Task, train: Sequence[Sample], completer, ctok, sizes: Sizes, params: SamplingParams, log
) -> tuple[dict[str, list[StepwiseExample]], dict[str, dict[str, float]]]:
    """The training samples labelled by each labeler, plus ORM data; and each labeler's quality."""
    datasets: dict[str, list[StepwiseExample]] = {}
    quality: dict[str, dict[str, float]] = {}
    for name in ("oracle", "mc", "outcome_heuristic"):
        log(
            f"labelling with {name}"
            + (f" (completer {cfg.prm.completer})" if name == "mc" and cfg.prm.completer else "")
        )
        examples, info = label_samples(
            train,
            name,
            task=task,
            model=completer,
            tokenizer=ctok,
            mc_n=sizes.mc_n,
            mc_mode="hard",
            mc_params=params,
            seed=0,
        )
        datasets[name] = examples
        quality[name] = {**label_quality(examples), **{k: float(v) for k, v in info.items() if k != "labeler"}}
    datasets["orm"] = orm_examples(train)
    return datasets, quality


def _train_and_score(
    cfg: Config,
    init: str,
    datasets: dict[str, list[StepwiseExample]],
    held: Sequence[Sample],
    task: Task,
    sizes: Sizes,
    run_dir: Path,
    log,
) -> tuple[dict[str, float], dict[str, Any], list]:
    """One PRM per labeler and the ORM, trained into ``run_dir/prms/<name>`` with the same budget;
    their step AUROC on the held-out steps (oracle labels), their training metrics, and the
    oracle PRM's step records (for the probe)."""
    held_examples, _ = label_samples(held, "oracle", task=task)
    prm_cfg: Config = cfg.updated({"prm": {"steps": sizes.prm_steps, "augment_rate": sizes.augment_rate}})
    aurocs: dict[str, float] = {}
    train_metrics: dict[str, dict[str, Any]] = {}
    probe_records: list = []
    for name, examples in datasets.items():
        log(f"training the {name} {'ORM' if name == 'orm' else 'PRM'} ({sizes.prm_steps} steps)")
        c = prm_cfg if name != "orm" else prm_cfg.updated({"prm": {"augment_rate": 0.0}})
        m = train_prm_from_examples(c, init, examples, run_dir / "prms" / name, progress=cfg.train.progress)
        train_metrics[name] = {k: v for k, v in m.items() if k != "prm/loss_curve"}
        prm, ptok = load_prm(str(run_dir / "prms" / name))
        records = step_records(prm, ptok, held_examples)
        aurocs[name] = _auroc(records)
        if name == "oracle":
            probe_records = records
    return aurocs, train_metrics, probe_records


def best_of_n_table(
    task: Task, samples: Sequence[Sample], prms: Path, ns: Sequence[int]
) -> dict[str, dict[int, float]]:
    """Best-of-N accuracy at each N of every selector, from ``max(ns)`` consecutive samples per problem:
    the oracle-label PRM (``prms/oracle``, four aggregations), the ORM (``prms/orm``) and majority
    vote over the task's answers (:func:`creditrl.tasks.base.answer_of`, grouped by its
    ``same_answer``). A step the PRM could not score (NaN) counts 0.0."""
    prm, ptok = load_prm(str(prms / "oracle"))
    orm, otok = load_prm(str(prms / "orm"))
    pairs = [(s.problem.prompt, s.steps or [s.completion or " "]) for s in samples]
    step_scores = prm.score(ptok, pairs, batch_size=64)
    orm_scores = [row[-1] for row in orm.score(otok, pairs, batch_size=64)]
    per = max(ns)
    groups = [
        [
            Candidate(
                s.outcome, tuple(0.0 if x != x else x for x in sc), 0.0 if o != o else o, answer_of(task, s.completion)
            )
            for s, sc, o in zip(samples[i : i + per], step_scores[i : i + per], orm_scores[i : i + per])
        ]
        for i in range(0, len(samples), per)
    ]
    same = functools.partial(same_answer, task)
    methods = ["prm_min", "prm_product", "prm_last", "prm_mean", "orm", "majority"]
    return {m: best_of_n_accuracy(groups, m, ns=ns, same=same) for m in methods}


def _plot_best_of_n(table: dict[str, dict[int, float]], path: Path, task: str) -> None:
    fig, ax = plt.subplots(figsize=(6, 4))
    for method, acc in table.items():
        ns = sorted(acc)
        ax.plot(ns, [100 * acc[n] for n in ns], marker="o", label=method)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("N (samples per problem)")
    ax.set_ylabel("held-out accuracy (%)")
    ax.set_title(f"best-of-N on {task}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _report(s: dict[str, Any], probe_md: str, quick: bool) -> str:
    note = "\n**Quick mode: smoke test only, the numbers mean nothing.**\n" if quick else ""
    sz = s["sizes"]
    task = s.get("task", {"name": "arithmetic", "args": {}})
    args = ", ".join(f"{k}={v}" for k, v in task["args"].items())
    lines = [
        f"# {TITLE}\n{note}",
        f"Task `{task['name']}`"
        + (f" ({args})" if args else "")
        + f". Policy: `{s['policy']}`. MC completer: `{s.get('completer', s['policy'])}`. Sizes: {sz}. "
        f"Wall time {s['wall_s']:.0f} s.\n",
        "## Labelers against the oracle (training steps)\n",
        "| labeler | steps | coverage | false-positive rate | agreement |",
        "|---|---|---|---|---|",
    ]
    for name, q in s["label_quality"].items():
        lines.append(
            f"| {name} | {q['steps']:.0f} | {q['coverage']:.3f} | {q['false_positive_rate']:.3f} | "
            f"{q['agreement']:.3f} |"
        )
    lines += ["", "## Step AUROC on held-out policy samples (oracle labels)\n", "| trained on | AUROC |", "|---|---|"]
    lines += [f"| {name} | {v:.4f} |" for name, v in s["auroc"].items()]
    lines += [
        "",
        "## Shortcut probe (oracle-label PRM, held-out steps)\n",
        probe_md,
        "",
        "## MC labels: hard vs soft against the oracle (held-out steps)\n",
        "| N | hard FPR | soft FPR | hard agreement | soft agreement | steps |",
        "|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['N']} | {r['hard_fpr']:.3f} | {r['soft_fpr']:.3f} | {r['hard_agreement']:.3f} | "
        f"{r['soft_agreement']:.3f} | {r['steps']} |"
        for r in s["mc_label_table"]
    ]
    ns = sz["bon_ns"]
    lines += [
        "",
        "## Best-of-N accuracy on held-out problems\n",
        "| method | " + " | ".join(f"N={n}" for n in ns) + " |",
        "|---|" + "---|" * len(ns),
    ]
    for m, acc in s["best_of_n"].items():
        lines.append(f"| {m} | " + " | ".join(f"{100 * acc[n]:.1f}%" for n in ns) + " |")
    if s.get("majority_note"):
        lines += ["", f"Majority vote: {s['majority_note']}."]
    lines += [
        "",
        "![best of N](plots/best_of_n.png)",
        "",
        "## RL with the learned PRM as step reward\n",
        "grpo_process with batch whitening, the config's settings otherwise. Held-out greedy exact match:\n",
        "| iteration | " + " | ".join(str(i) for i, _ in s["rl_prm"]["evals"]) + " |",
        "|---|" + "---|" * len(s["rl_prm"]["evals"]),
        "| accuracy | " + " | ".join(f"{100 * a:.1f}%" for _, a in s["rl_prm"]["evals"]) + " |",
        "",
    ]
    return "\n".join(lines)


def main(args: argparse.Namespace) -> None:
    where = Path(args.out or Path("runs") / f"prm-{time.strftime('%Y%m%d-%H%M%S')}")
    run_prm_report(where, quick=args.quick, config=args.config, overrides=args.set)
    publish_report(where / "report.md", args.results, TITLE)


def cli(argv: list[str] | None = None) -> int:
    p = parser(
        "prm",
        __doc__,
        out="where to write (default runs/prm-TIMESTAMP)",
        results="also write the report as a results page (e.g. docs/results/prm.md)",
    )
    return run(main, p, argv)


if __name__ == "__main__":
    raise SystemExit(cli())
