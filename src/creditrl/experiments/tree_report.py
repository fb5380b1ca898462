"""``creditrl tree-report``: tree rollouts (outcome reward only) vs outcome GRPO, equal tokens.

Both arms start from the config's start policy (``train.init``), train on the config's task, any
task with reasoning steps (the trees branch where a step separator is generated), with that
config's optimiser settings, and stop at the same budget of generated tokens; held-out greedy
exact match is plotted against generated tokens over several seeds. The default config
(:mod:`.report_setup`) is the packaged arith config: its SFT checkpoint (trained on 1-6
operations), RL on the training split of 5-7-operation problems (``task.args={min_ops: 5,
max_ops: 7}``, which applies only while neither a CONFIG nor a ``task.*`` override is given),
256 held-out problems of 5-7 operations.

- ``outcome + grpo``: 16 prompts x 8 independent samples, GRPO advantages (group mean / std).
- ``outcome + tree``: 16 prompts x one tree each (branching 2, depth 3: 8 leaves, the first two
  steps shared), ``value.source=tree``, ``gae`` with gamma 1, lam 0 at segment resolution
  (``V(child) - V(parent)``), batch-whitened (GRPO's advantages are whitened per group; without
  it the tree's advantages, at most 1 in magnitude, would meet a several times smaller step).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path

from creditrl.config import load_config
from creditrl.experiments.curves import plot_seed_curves
from creditrl.experiments.launch import run_arms
from creditrl.experiments.report_setup import base_config, default_task_sets, step_task, task_phrase
from creditrl.experiments.seeds import seeds_table, summarise_seeds
from creditrl.train.build import start_policy
from creditrl.train.resolve import check

ARMS: dict[str, list[str]] = {
    "outcome + grpo": ["reward.source=outcome", "credit.estimator=grpo"],
    "outcome + tree (gae, lam 0)": [
        "reward.source=outcome",
        "value.source=tree",
        "value.tree_branching=2",
        "value.tree_depth=3",
        "credit.estimator=gae",
        "credit.lam=0.0",
        "credit.gamma=1.0",
        "credit.normaliser=batch",
    ],
}
FULL = {
    "budget": 400_000,
    "seeds": [0, 1, 2],
    "task": ["task.args={min_ops: 5, max_ops: 7}"],
    "common": ["train.iterations=10000", "train.eval_every=10", "train.checkpoint_every=10000"],
}
QUICK = {
    "budget": 1_500,
    "seeds": [0, 1],
    "task": [],
    "common": ["rollout.group_size=8", "train.iterations=100", "train.eval_every=2", "train.checkpoint_every=100"],
}


def run_tree_report(
    run_dir: Path | None,
    *,
    quick: bool = False,
    seeds: int | None = None,
    budget: int | None = None,
    config: str | Path | None = None,
    overrides: list[str] | None = None,
) -> dict:
    """Both arms over the seeds on ``config`` + ``overrides`` (module docstring); finished runs in
    ``run_dir`` are read back.

    Raises:
        ConfigError: Before anything is trained, for a bad config or a task without reasoning steps.
    """
    sizes = QUICK if quick else FULL
    base = base_config(config, quick)
    overrides = list(overrides or [])
    common = default_task_sets(config, overrides, sizes["task"]) + sizes["common"] + overrides
    policy_cfg, rl_cfg = load_config(base, overrides), load_config(base, common)
    task = step_task(rl_cfg, "creditrl tree-report")
    for over in ARMS.values():  # every arm's config is checked before any arm trains
        check(load_config(base, common + over), task)
    run_dir = Path(run_dir or Path("runs") / f"tree-{time.strftime('%Y%m%d-%H%M%S')}")
    run_dir.mkdir(parents=True, exist_ok=True)
    start = time.time()
    log = lambda msg: print(f"[creditrl tree-report] {time.time() - start:6.0f} s  {msg}", flush=True)  # noqa: E731
    # the config's start policy as given (the arith SFT, trained on 1-6 operations, cached); RL runs on the arms' task
    init = start_policy(policy_cfg, progress=policy_cfg.train.progress)
    budget = budget or sizes["budget"]
    seed_list = sizes["seeds"] if seeds is None else list(range(seeds))
    results = run_arms(base, ARMS, seed_list, budget, run_dir, init, common, log)
    rows = [summarise_seeds(name, hs) for name, hs in results.items()]
    table = seeds_table(rows)
    plot = run_dir / "plots" / "tree_vs_grpo.png"
    plot_seed_curves(results, plot, f"{task_phrase(rl_cfg)}, equal generated tokens ({budget:,})")
    summary = {
        "budget": budget,
        "seeds": seed_list,
        "arms": ARMS,
        "common": common,
        "rows": [asdict(r) for r in rows],
        "wall_s": time.time() - start,
    }
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    (run_dir / "report.md").write_text(
        f"# Tree rollouts vs GRPO (outcome reward only), equal generated tokens\n\n"
        f"Task {task_phrase(rl_cfg)}; budget {budget:,} generated tokens per run; seeds {seed_list}; "
        f"start policy {init}.\n\n{table}\n![curves](plots/tree_vs_grpo.png)\n"
    )
    print("\n" + table)
    log(f"report: {run_dir / 'report.md'}  plot: {plot}")
    return summary
