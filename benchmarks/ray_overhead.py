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
The numbers are only meaningful on an otherwise idle machine. With ``--results PAGE`` they also go
to PAGE's name with .json, beside the page.
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

from common import spread, write_json  # noqa: E402
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


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iterations", type=int, default=8)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=24)
    ap.add_argument("--results", metavar="PAGE", help="also write what is printed as a results page (docs/results/...)")
    args = ap.parse_args(argv)
    with printed_results(args.results, "Scale-out: the Ray backend against the in-process loop"):
        result = _run(args)
    if args.results:
        write_json(Path(args.results).with_suffix(".json"), result)


BASE, RAY = "in-process, 2 threads", "ray, 2 workers x 1 thread"


def summary(results: dict[str, tuple[list[dict], float]]) -> dict[str, dict]:
    """Per setup (``results``: its metrics rows after the first iteration, and its set-up seconds): the
    set-up seconds, the spread of the iteration seconds, the median of each stage in :data:`KEYS`, and
    the median iteration against in-process with 2 threads; for Ray, the median weight broadcast (ms)
    and whether every iteration drew the same tokens and rewards as in-process."""
    base = statistics.median(r["time/iter_s"] for r in results[BASE][0])
    out = {}
    for name, (rows, setup) in results.items():
        its = [r["time/iter_s"] for r in rows]
        out[name] = {
            "setup_s": setup,
            "iter_s": spread(its),
            "stage_median_s": {k.split("/")[1][:-2]: statistics.median(r[k] for r in rows) for k in KEYS[1:]},
            "ratio": statistics.median(its) / base,
        }
    far = results[RAY][0]
    out[RAY]["broadcast_median_ms"] = 1000 * statistics.median(r["time/sync_s"] for r in far)
    out[RAY]["same_as_in_process"] = all(
        a["tokens/total"] == b["tokens/total"] and a["reward/mean"] == b["reward/mean"]
        for a, b in zip(results[BASE][0], far)
    )
    return out


def _run(args: argparse.Namespace) -> dict[str, object]:
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    setups = {
        BASE: ["train.threads=2"],
        "in-process, 1 thread": ["train.threads=1"],
        RAY: ["train.threads=2", "backend.name=ray", "backend.rollout_workers=2", "backend.worker_threads=1"],
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
    setups_summary = summary(results)
    head = "".join(f"{k.split('/')[1][:-2] + ' med':>14}" for k in KEYS[1:])
    print(f"{'':<27}{'setup s':>8}{'iter s min':>12}{'median':>8}{'max':>8}{head}{'ratio':>8}")
    for name, r in setups_summary.items():
        it = r["iter_s"]
        stages = "".join(f"{v:14.3f}" for v in r["stage_median_s"].values())
        print(
            f"{name:<27}{r['setup_s']:8.2f}{it['min']:12.3f}{it['median']:8.3f}{it['max']:8.3f}{stages}"
            f"{r['ratio']:7.2f}x"
        )
    far = setups_summary[RAY]
    print(
        f"ratio = median s/iteration / in-process 2 threads; ray setup = starting the workers + first broadcast; "
        f"weight broadcast median {far['broadcast_median_ms']:.1f} ms (in update)"
    )
    print(f"same tokens and rewards as in-process every iteration: {far['same_as_in_process']}")
    settings = {k: getattr(args, k) for k in ("iterations", "prompts", "group", "tokens")}
    return {**settings, "torch": torch.__version__, "ray": ray.__version__, "setups": setups_summary}


if __name__ == "__main__":
    main()
