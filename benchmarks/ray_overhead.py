"""Overhead of the Ray backend against the in-process loop at the same core count.

    .venv/bin/python benchmarks/ray_overhead.py [--iterations 8] [--prompts 8] [--group 8] [--tokens 24]

Runs the same RL configuration (the tiny model from its initialisation, a length penalty so the
weights move, MC values so value continuations go through the engine too) on 2 cores:
in-process with 2 torch threads (and, for reference, 1 thread), and with ``backend.name=ray``:
2 rollout workers x 1 thread (the driver keeps 2 threads for the update, while the workers
wait). Ray and the workers are started before the timed iterations (``RLTrainer.__init__``
waits for them). Prints seconds per iteration (min / median / max over the iterations after
the first), the median of the stages the backend touches (rollout; value = MC continuations;
update = update + weight broadcast) and the ratio of the median to in-process with 2 threads.
The numbers are only meaningful on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")  # the intra-op threads are set explicitly below

import torch  # noqa: E402

from creditrl.config import load_config  # noqa: E402
from creditrl.experiments.report import printed_results  # noqa: E402
from creditrl.train.rl import RLTrainer  # noqa: E402

KEYS = ("time/iter_s", "time/rollout_s", "time/value_s", "time/update_s")


def config(args: argparse.Namespace, backend: list[str]):
    return load_config(
        None,
        [
            "train.init=policy",
            f"rollout.prompts_per_iter={args.prompts}",
            f"rollout.group_size={args.group}",
            f"rollout.max_new_tokens={args.tokens}",
            "train.eval_size=8",
            f"train.eval_every={args.iterations}",
            f"train.checkpoint_every={args.iterations}",
            f"train.iterations={args.iterations}",
            "train.progress=false",
            "train.threads=2",
            "shaping.length_coef=0.05",
            "shaping.length_budget=8",
            "value.source=mc",
            "value.mc_samples=2",
            "credit.estimator=gae",
            *backend,
        ],
    )


def timed_run(args: argparse.Namespace, extra: list[str], root: Path) -> tuple[list[dict], float]:
    start = time.perf_counter()
    trainer = RLTrainer.from_config(config(args, extra), root)
    setup = time.perf_counter() - start
    rows = [r for r in trainer.run().history if r["iteration"] > 1]  # the first warms caches up
    return rows, setup


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iterations", type=int, default=8)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=24)
    ap.add_argument("--results", metavar="PAGE", help="also write what is printed as a results page (docs/results/...)")
    args = ap.parse_args()
    with printed_results(args.results, "Scale-out: the Ray backend against the in-process loop"):
        _run(args)


def _run(args: argparse.Namespace) -> None:

    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    setups = {
        "in-process, 2 threads": ["train.threads=2"],
        "in-process, 1 thread": ["train.threads=1"],
        "ray, 2 workers x 1 thread": [
            "train.threads=2",
            "backend.name=ray",
            "backend.rollout_workers=2",
            "backend.worker_threads=1",
        ],
    }
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for i, (name, extra) in enumerate(setups.items()):
            results[name] = timed_run(args, extra, Path(tmp) / str(i))
    ray.shutdown()
    print(
        f"tiny policy, {args.prompts} prompts x {args.group} samples, <= {args.tokens} new tokens, MC values; "
        f"{args.iterations - 1} timed iterations (after the first), Ray on 2 CPUs; "
        f"torch {torch.__version__}, ray {ray.__version__}"
    )
    base = statistics.median(r["time/iter_s"] for r in results["in-process, 2 threads"][0])
    head = "".join(f"{k.split('/')[1][:-2] + ' med':>14}" for k in KEYS[1:])
    print(f"{'':<27}{'setup s':>8}{'iter s min':>12}{'median':>8}{'max':>8}{head}{'ratio':>8}")
    for name, (rows, setup) in results.items():
        its = [r["time/iter_s"] for r in rows]
        mid = statistics.median(its)
        stages = "".join(f"{statistics.median(r[k] for r in rows):14.3f}" for k in KEYS[1:])
        print(f"{name:<27}{setup:8.2f}{min(its):12.3f}{mid:8.3f}{max(its):8.3f}{stages}{mid / base:7.2f}x")
    far = results["ray, 2 workers x 1 thread"][0]
    print(
        f"ratio = median s/iteration / in-process 2 threads; ray setup = starting the workers + first broadcast; "
        f"weight broadcast median {statistics.median(r['time/sync_s'] for r in far) * 1000:.1f} ms (in update)"
    )
    same = all(
        a["tokens/total"] == b["tokens/total"] and a["reward/mean"] == b["reward/mean"]
        for a, b in zip(results["in-process, 2 threads"][0], far)
    )
    print(f"same tokens and rewards as in-process every iteration: {same}")


if __name__ == "__main__":
    main()
