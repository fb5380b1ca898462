"""Plain SFT against scheduled sampling, as exposure bias and as RL starts.

    python -m studies.scheduled_sampling [CONFIG] [--set KEY=VALUE ...] [--quick] [--seeds N] [--out DIR]
        [--summaries DIR] [--jobs N] [--results docs/results/scheduled_sampling.md]

For each seed ``s`` and each SFT variant (:data:`VARIANTS`: plain teacher forcing, and scheduled
sampling with the inverse-sigmoid schedule up to 0.25), the warm start is trained with
``sft.seed=s`` (cached), its exposure bias is measured on held-out problems
(:func:`creditrl.experiments.evaluate.exposure_bias`: teacher-forced against free-running
step accuracy, and its greedy exact match, the RL start), and outcome GRPO and process GRPO
(oracle step rewards) train from it with ``train.seed=s``
(:func:`creditrl.experiments.launch.run_arms`, resumable; with ``summaries``, each finished run's
summary and each start's measurements are kept there, so a later call trains nothing it has).
Everything is reported as means with 95% Student-t intervals over the seeds, and as the paired
per-seed difference scheduled sampling minus plain.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from creditrl.config import load_config
from creditrl.experiments.evaluate import exposure_bias
from creditrl.experiments.grid import QUICK_SET, Grid
from creditrl.experiments.launch import run_arms
from creditrl.experiments.plan import slug
from creditrl.experiments.report import eval_rows
from creditrl.experiments.seeds import mean_ci95
from studies.common import base_config, logger, parser, run, step_task, task_phrase, write_results

TITLE = "Scheduled sampling against exposure bias"

VARIANTS: dict[str, list[str]] = {
    "plain SFT": [],
    "scheduled sampling": ["sft.scheduled_sampling=inverse_sigmoid", "sft.ss_max=0.25"],
}
ARMS: dict[str, list[str]] = {
    "outcome GRPO": ["reward.source=outcome", "credit.estimator=grpo"],
    "process GRPO": [
        "reward.source=oracle_steps",
        "reward.granularity=step",
        "credit.estimator=grpo_process",
        "credit.normaliser=batch",
    ],
}
FULL = {
    "seeds": [0, 1, 2],
    "samples": 19_200,  # 150 iterations x 16 prompts x 8 samples, the arith config's budget
    "problems": 1024,
    "common": ["train.eval_every=30", "train.eval_size=1024", "train.checkpoint_every=100000", "train.inspect_every=0"],
}
QUICK = {"seeds": [0, 1], "samples": 32, "problems": 8, "common": [*QUICK_SET, "train.inspect_every=0"]}
MEASURES = ("tf_step_accuracy", "free_step_accuracy", "gap", "accuracy")


def _measure_start(cfg, init: str, problems: int, where: Path) -> dict[str, float]:
    """The exposure-bias measurements of the start at ``init``, with ``init`` (kept in ``where``,
    and read back from there when it exists)."""
    if where.is_file():
        return json.loads(where.read_text())
    from creditrl.policy.model import load_policy, policy_options

    task = step_task(cfg, "the scheduled-sampling study")
    model, tokenizer = load_policy(init, seed=cfg.policy.init_seed, **policy_options(cfg))
    model.eval()
    held = task.sample(problems, split="heldout", seed=4242)
    out = {**exposure_bias(model, tokenizer, task, held, max_new_tokens=cfg.rollout.max_new_tokens), "init": init}
    where.parent.mkdir(parents=True, exist_ok=True)
    where.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    return out


def run_exposure_report(
    out: Path | None,
    *,
    quick: bool = False,
    config: str | Path | None = None,
    overrides: list[str] | None = None,
    seeds: int | None = None,
    jobs: int = 1,
    summaries: Path | None = None,
) -> dict[str, Any]:
    """Both SFT variants x both RL arms x the seeds (module docstring); returns the summary."""
    sizes = QUICK if quick else FULL
    base = base_config(config, quick)
    common = list(sizes["common"]) + list(overrides or [])
    step_task(load_config(base, common), "the scheduled-sampling study")  # refuse a task without steps first
    out = Path(out or Path("runs") / f"exposure-{time.strftime('%Y%m%d-%H%M%S')}")
    out.mkdir(parents=True, exist_ok=True)
    seed_list = sizes["seeds"] if seeds is None else list(range(seeds))
    log = logger("studies.scheduled_sampling")
    starts: dict[str, list[dict[str, float]]] = {v: [] for v in VARIANTS}
    finals: dict[str, dict[str, list[float]]] = {v: {a: [] for a in ARMS} for v in VARIANTS}
    for seed in seed_list:
        for variant, sft_sets in VARIANTS.items():
            sets = [*common, *sft_sets, f"sft.seed={seed}"]
            keep = (summaries or out) / slug(variant)
            measured = keep / f"start_seed{seed}.json"
            init = json.loads(measured.read_text())["init"] if measured.is_file() else _sft_start(base, sets)
            starts[variant].append(_measure_start(load_config(base, sets), init, sizes["problems"], measured))
            log(f"{variant}, seed {seed}: start {starts[variant][-1]['accuracy']:.3f}")
            grid = Grid(base=base, arms=ARMS, seeds=[seed], budget=sizes["samples"], common=sets, unit="samples")
            results = run_arms(grid, out / slug(variant), init, log, jobs=jobs, summaries=keep if summaries else None)
            for arm, histories in results.items():
                finals[variant][arm].append(eval_rows(histories[0])[-1]["eval/accuracy"])
    cfg = load_config(base, common)
    summary = {"seeds": seed_list, "samples": sizes["samples"], "task": task_phrase(cfg), "starts": starts}
    summary["finals"] = finals
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    log(f"summary: {out / 'summary.json'}")
    return summary


def _sft_start(base: Path, sets: list[str]) -> str:
    from creditrl.train.build import start_policy

    cfg = load_config(base, [*sets, "train.init=sft"])
    return start_policy(cfg, progress=cfg.train.progress)


def exposure_markdown(summary: dict[str, Any]) -> str:
    """The per-variant table and the paired differences, means ± 95% t-intervals over the seeds."""
    pct = lambda xs: "{:.1f} ± {:.1f}%".format(*(100 * v for v in mean_ci95(xs)))  # noqa: E731
    pts = lambda xs: "{:+.1f} ± {:.1f} points".format(*(100 * v for v in mean_ci95(xs)))  # noqa: E731
    head = (
        "| SFT | teacher-forced step accuracy | free-running step accuracy | gap | RL start (greedy exact match) "
        + "".join(f"| after {arm} " for arm in ARMS)
        + "|\n"
        + "|---" * (5 + len(ARMS))
        + "|\n"
    )
    rows = ""
    for variant, starts in summary["starts"].items():
        cells = [pct([s[m] for s in starts]) for m in MEASURES]
        cells += [pct(summary["finals"][variant][arm]) for arm in ARMS]
        rows += f"| {variant} | " + " | ".join(cells) + " |\n"
    plain, mixed = summary["starts"]["plain SFT"], summary["starts"]["scheduled sampling"]
    diff = [pts([b[m] - a[m] for a, b in zip(plain, mixed)]) for m in MEASURES]
    diff += [
        pts([b - a for a, b in zip(summary["finals"]["plain SFT"][arm], summary["finals"]["scheduled sampling"][arm])])
        for arm in ARMS
    ]
    rows += "| scheduled sampling - plain, paired by seed | " + " | ".join(diff) + " |\n"
    return head + rows


def page_body(summary: dict[str, Any]) -> str:
    """The results page's body: the setting, the measures and :func:`exposure_markdown`."""
    variants = "; ".join(f"**{v}**: `{' '.join(o) or '(teacher forcing)'}`" for v, o in VARIANTS.items())
    arms = "; ".join(f"**{a}**: `{' '.join(o)}`" for a, o in ARMS.items())
    return (
        f"Task {summary['task']}; seeds {summary['seeds']} (seed s: `sft.seed=s`, then `train.seed=s`); SFT "
        f"variants: {variants}. RL from each start: {arms}; {summary['samples']:,} samples per run.\n\n"
        "*Teacher-forced step accuracy*: the share of a reference solution's steps whose every token is the "
        "start's argmax given the reference prefix; *free-running*: the share of the reference's steps its own "
        "greedy solution gets right (stop at the first error); *gap* = the first minus the second, the exposure "
        "bias. Means ± 95% Student-t intervals over the seeds; the last row pairs the variants seed by seed.\n\n"
        f"{exposure_markdown(summary)}"
    )


def main(args: argparse.Namespace) -> None:
    summary = run_exposure_report(
        Path(args.out) if args.out else None,
        quick=args.quick,
        config=args.config,
        overrides=args.set,
        seeds=args.seeds,
        jobs=args.jobs,
        summaries=Path(args.summaries) if args.summaries else None,
    )
    print("\n" + exposure_markdown(summary))
    write_results(args.results, TITLE, page_body(summary))


def cli(argv: list[str] | None = None) -> int:
    p = parser(
        "scheduled_sampling",
        __doc__,
        out="run directory (default runs/exposure-TIMESTAMP); finished runs in it are reused",
        seeds="seeds 0..N-1 (default 3)",
        results="also write a results page (docs/results/scheduled_sampling.md)",
    )
    p.add_argument("--summaries", help="keep each finished run's summary and each start's measurements here")
    p.add_argument("--jobs", type=int, default=1, help="runs at a time, each in its own process")
    return run(main, p, argv)


if __name__ == "__main__":
    raise SystemExit(cli())
