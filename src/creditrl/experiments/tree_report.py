"""``creditrl tree-report``: tree rollouts (outcome reward only) vs outcome GRPO, equal tokens.

Both arms start from the arith config's SFT checkpoint, train on the held-out-disjoint training split of
5-7-operation problems with that config's optimiser settings, and stop at the same budget of
generated tokens; held-out greedy exact match (256 problems of 5-7 operations) is plotted against
generated tokens over several seeds.

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
from creditrl.config.loader import arith_config_path
from creditrl.experiments.seeds import plot_seed_curves, run_arms, seeds_table, summarise_seeds
from creditrl.train.sft import cached_sft

ARMS: dict[str, list[str]] = {
    "outcome + grpo": ["reward.source=outcome", "credit.estimator=grpo"],
    "outcome + tree (gae, lam 0)": [
        "reward.source=outcome", "value.source=tree", "value.tree_branching=2", "value.tree_depth=3",
        "credit.estimator=gae", "credit.lam=0.0", "credit.gamma=1.0", "credit.normaliser=batch",
    ],
}
FULL = {"budget": 400_000, "seeds": [0, 1, 2], "task": ["task.args={min_ops: 5, max_ops: 7}"],
        "common": ["train.iterations=10000", "train.eval_every=10", "train.checkpoint_every=10000"]}
QUICK = {"budget": 1_500, "seeds": [0, 1], "task": ["rollout.group_size=8"],
         "common": ["train.iterations=100", "train.eval_every=2", "train.checkpoint_every=100"]}


def run_tree_report(run_dir: Path | None, *, quick: bool = False, seeds: int | None = None,
                    budget: int | None = None) -> dict:
    sizes = QUICK if quick else FULL
    run_dir = Path(run_dir or Path("runs") / f"tree-{time.strftime('%Y%m%d-%H%M%S')}")
    run_dir.mkdir(parents=True, exist_ok=True)
    start = time.time()
    log = lambda msg: print(f"[creditrl tree-report] {time.time() - start:6.0f} s  {msg}", flush=True)  # noqa: E731
    base = arith_config_path(quick)
    # the arith config's SFT start (trained on 1-6 operations, cached); RL runs on the arms' own task
    sft_path, _ = cached_sft(load_config(base), progress=load_config(base).train.progress)
    budget = budget or sizes["budget"]
    seed_list = sizes["seeds"] if seeds is None else list(range(seeds))
    common = sizes["task"] + sizes["common"]
    results = run_arms(base, ARMS, seed_list, budget, run_dir, str(sft_path), common, log)
    rows = [summarise_seeds(name, hs) for name, hs in results.items()]
    table = seeds_table(rows)
    task_args = load_config(base, common).task.args
    plot = run_dir / "plots" / "tree_vs_grpo.png"
    plot_seed_curves(results, plot, f"arithmetic {task_args}, equal generated tokens ({budget:,})")
    summary = {"budget": budget, "seeds": seed_list, "arms": ARMS, "common": common, "rows": [asdict(r) for r in rows],
               "wall_s": time.time() - start}
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    (run_dir / "report.md").write_text(
        f"# Tree rollouts vs GRPO (outcome reward only), equal generated tokens\n\n"
        f"Task {task_args}; budget {budget:,} generated tokens per run; seeds {seed_list}; "
        f"SFT start {sft_path}.\n\n{table}\n![curves](plots/tree_vs_grpo.png)\n"
    )
    print("\n" + table)
    log(f"report: {run_dir / 'report.md'}  plot: {plot}")
    return summary
