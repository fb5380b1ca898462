"""``creditrl demo``: one SFT warm start, then outcome-GRPO vs oracle-step process-GRPO.

Both arms start from the same cached SFT checkpoint and get the same sample budget
(iterations x prompts x group size) on the same held-out problems, so the table compares
credit assignment and nothing else.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from creditrl.config import Config, ConfigError, load_config, merge, parse_overrides
from creditrl.config.loader import demo_config_path
from creditrl.experiments.evaluate import errors_table, evaluate_checkpoints
from creditrl.experiments.evaluate import markdown_table as eval_table
from creditrl.experiments.plan import slug
from creditrl.experiments.report import (
    ArmSummary,
    markdown_table,
    peak_rss_mb,
    plot_accuracy,
    publish_report,
    summarise,
    task_phrase,
)
from creditrl.train.resolve import run_task
from creditrl.train.rl import RLTrainer
from creditrl.train.sft import cached_sft

# Process-GRPO sums up to one normalised reward per step, so its advantages are several times
# larger than GRPO's; batch whitening puts both arms on the same advantage scale at one lr.
ARMS: dict[str, dict[str, Any]] = {
    "outcome + grpo": {"reward": {"source": "outcome"}, "credit": {"estimator": "grpo"}},
    "oracle steps + grpo_process": {
        "reward": {"source": "oracle_steps"},
        "credit": {"estimator": "grpo_process", "normaliser": "batch"},
    },
}
TARGET_GAIN = 0.10  # "samples to target" = samples until held-out exact match is SFT + 10 points
# the final check of the SFT start and each arm's last checkpoint: held-out problems of the same stream
FINAL_EVAL_SIZE = {False: 2048, True: 32}


def run_demo(
    run_dir: Path,
    *,
    quick: bool = False,
    overrides: list[str] | None = None,
    config: str | Path | None = None,
    results: str | Path | None = None,
) -> list[ArmSummary]:
    """Run the demo into ``run_dir`` (on ``config`` instead of the packaged demo.yaml when given);
    print and return the per-arm summaries. ``results``: also write the report as a results page."""
    if config is not None and quick:
        raise ConfigError("creditrl demo: give a config or --quick, not both (--quick has its own sizes)")
    base_path = Path(config) if config is not None else demo_config_path(quick)
    if not base_path.exists():
        raise FileNotFoundError(f"creditrl demo: config file not found: {base_path}")
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    base = load_config(base_path, overrides or [])
    start = time.time()
    print(f"[creditrl demo] config {base_path.name}; SFT warm start (cached by config hash) ...", flush=True)
    sft_path, sft_metrics = cached_sft(base, progress=base.train.progress)
    print(
        f"[creditrl demo] SFT: held-out exact match {100 * sft_metrics['eval/accuracy']:.1f}%, "
        f"step accuracy {100 * sft_metrics['eval/step_accuracy']:.1f}% ({sft_path})",
        flush=True,
    )
    histories: dict[str, list[dict[str, Any]]] = {}
    for name, arm in ARMS.items():
        cfg: Config = load_config(base_path, _with(overrides or [], arm))
        print(
            f"[creditrl demo] arm '{name}': {cfg.train.iterations} iterations x "
            f"{cfg.rollout.prompts_per_iter} prompts x {cfg.rollout.group_size} samples",
            flush=True,
        )
        result = RLTrainer.from_config(cfg, run_dir / slug(name), init_path=str(sft_path), overwrite=True).run()
        histories[name] = result.history
    target = sft_metrics["eval/accuracy"] + TARGET_GAIN
    arms = [summarise(name, h, target) for name, h in histories.items()]
    table = markdown_table(arms, target)
    size = FINAL_EVAL_SIZE[quick]
    classified = hasattr(run_task(base), "first_error")  # where solutions go wrong
    print(
        f"[creditrl demo] final check: the SFT start and both arms' last checkpoints on {size} held-out problems",
        flush=True,
    )
    final = evaluate_checkpoints(
        str(base_path),
        [str(sft_path)] + [str(run_dir / slug(n)) for n in ARMS],
        size=size,
        overrides=overrides,
        errors=classified,
    )
    for row, label in zip(final, ["SFT start", *ARMS]):
        row.checkpoint = label
    table += "\n\n" + eval_table(final) + "\n" + ("\n" + errors_table(final) + "\n" if classified else "")
    plot_accuracy(
        histories,
        run_dir / "plots" / "accuracy_vs_samples.png",
        f"{task_phrase(base)}: RL from the same SFT start",
    )
    elapsed = time.time() - start
    rss = peak_rss_mb()
    report = _report(base, sft_metrics, table, elapsed, quick, rss)
    (run_dir / "report.md").write_text(report)
    publish_report(run_dir / "report.md", results, f"Demo: {base_path.name}")
    summary = {
        "sft": sft_metrics,
        "arms": [asdict(a) for a in arms],
        "final_eval": [asdict(r) for r in final],
        "wall_s": elapsed,
        "peak_rss_mb": rss,
    }
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    print("\n" + table)
    print(f"[creditrl demo] report: {run_dir / 'report.md'}  plot: {run_dir / 'plots' / 'accuracy_vs_samples.png'}")
    print(f"[creditrl demo] total wall time {elapsed:.0f} s, peak RSS {rss:.0f} MB")
    return arms


def _with(overrides: list[str], arm: dict[str, Any]) -> dict[str, Any]:
    """User ``--set`` overrides, then the arm's reward/credit (the arm defines the comparison)."""
    return merge(parse_overrides(overrides), arm)


def _report(cfg: Config, sft: dict[str, Any], table: str, elapsed: float, quick: bool, rss: float) -> str:
    note = "\n**Quick mode: smoke test only, the numbers mean nothing.**\n" if quick else ""
    return f"""# creditrl demo report
{note}
Task: `{cfg.task.name}` {cfg.task.args}; policy `{cfg.policy.model}`; SFT {cfg.sft.steps} steps on
{cfg.sft.task_args} (held-out exact match {100 * sft["eval/accuracy"]:.1f}%,
step accuracy {100 * sft["eval/step_accuracy"]:.1f}%).
RL: {cfg.train.iterations} iterations x {cfg.rollout.prompts_per_iter} prompts x {cfg.rollout.group_size} samples
per arm, lr {cfg.optim.lr}, temperature {cfg.rollout.temperature}; held-out greedy evaluation on
{cfg.train.eval_size} problems every {cfg.train.eval_every} iterations.

{table}
Exact match: greedy final answer after `#` equals the true value. Step accuracy: per problem, the
share of generated steps the step checker accepts, averaged. Total wall time {elapsed:.0f} s, peak RSS
{rss:.0f} MB.

![accuracy vs samples](plots/accuracy_vs_samples.png)
"""
