"""Time every registered estimator, every normaliser and step-resolution estimation on CPU.

    .venv/bin/python benchmarks/credit_speed.py [--batch 512] [--length 2048] [--threads 2]

Inputs: float32 (B, T) rewards, response masks with trailing padding and holes (observation
tokens), group ids in groups of 8, values for the critic-based estimators, gamma = 0.99 and
lam = 0.95 so the discounted paths run. Prints the median wall time in ms over several runs
after warm-up; the target is <= 50 ms per estimator at B = 512, T = 2048 on 2 cores. With
``--results PAGE`` the numbers also go to PAGE's name with .json, beside the page.
"""

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from common import write_json
from creditrl.credit import (
    ESTIMATORS,
    NORMALISERS,
    estimate,
    estimate_at,
    normalise,
    requires,
)
from creditrl.experiments.report import printed_results  # noqa: E402

# How each implementation walks time and the batch: "blocked" is discounted_cumsum, a (64, 64)
# matmul per block of columns whose block starts are themselves a (shorter) discounted cumsum.
BLOCKED = "none (64-col blocked matmul scan)"
LOOPS = {
    "reinforce": BLOCKED,
    "reinforce_baseline": BLOCKED,
    "rloo": BLOCKED,
    "grpo": BLOCKED,
    "dr_grpo": BLOCKED,
    "grpo_process": BLOCKED,
    "gae": BLOCKED,
    "min_form": "none (reverse cummin)",
}
NOT_AUDITED = "not audited"


def make_inputs(batch: int, length: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random float32 (B, T) inputs shaped like a real rollout batch."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(length // 4, length + 1, (batch,), generator=gen)
    holes = torch.rand(batch, length, generator=gen) < 0.05
    response_mask = (torch.arange(length) < lengths[:, None]) & ~holes
    reward_mask = torch.rand(batch, length, generator=gen) < 0.02
    reward_mask |= torch.arange(length) == (lengths - 1)[:, None]  # a sequence reward too
    rewards = torch.where(reward_mask, torch.randn(batch, length, generator=gen), 0.0)
    return {
        "rewards": rewards,
        "reward_mask": reward_mask,
        "response_mask": response_mask,
        "group_ids": torch.arange(batch) // 8,
        "values": torch.randn(batch, length, generator=gen),
        "step_ends": torch.rand(batch, length, generator=gen) < 1 / 40,  # ~40-token steps
    }


def time_ms(fn: Callable[[], object], runs: int, warmup: int) -> tuple[float, float]:
    """(median, min) wall time of ``fn`` in ms. The min is printed too because on a shared
    machine another process stealing a core inflates single runs, and the median with them."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times), 1e3 * min(times)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--length", type=int, default=2048)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument(
        "--results", metavar="PAGE", help="also write what is printed as a results page (docs/results/...)"
    )
    args = parser.parse_args(argv)
    with printed_results(args.results, "Credit estimator speed"):
        result = _run(args)
    if args.results:
        write_json(Path(args.results).with_suffix(".json"), result)


def _run(args: argparse.Namespace) -> dict[str, object]:
    torch.set_num_threads(args.threads)
    x = make_inputs(args.batch, args.length)
    tokens = (x["rewards"], x["reward_mask"], x["response_mask"])
    gammas = {"gamma": 0.99, "lam": 0.95}

    rows: list[tuple[str, tuple[float, float], str]] = []
    with torch.no_grad():
        for name in sorted(ESTIMATORS):
            values = x["values"] if "values" in requires(name) else None
            call = {"group_ids": x["group_ids"], "values": values, **gammas}
            ms = time_ms(lambda: estimate(name, *tokens, **call), args.runs, args.warmup)
            rows.append((f"estimator {name}", ms, LOOPS.get(name, NOT_AUDITED)))
        advantages = estimate("grpo", *tokens, group_ids=x["group_ids"])[0]
        for name in sorted(NORMALISERS):
            call = {"group_ids": x["group_ids"]}
            ms = time_ms(
                lambda: normalise(name, advantages, x["response_mask"], **call),
                args.runs,
                args.warmup,
            )
            rows.append((f"normaliser {name}", ms, "none"))
        for name in ("grpo", "gae"):
            values = x["values"] if "values" in requires(name) else None
            call = {"step_ends": x["step_ends"], "group_ids": x["group_ids"], "values": values}
            ms = time_ms(
                lambda: estimate_at("step", name, *tokens, **call, **gammas),
                args.runs,
                args.warmup,
            )
            rows.append((f"estimate_at(step) {name}", ms, LOOPS.get(name, NOT_AUDITED)))

    print(
        f"B={args.batch} T={args.length} float32, threads={args.threads}, "
        f"gamma=0.99 lam=0.95, median of {args.runs} runs after {args.warmup} warm-up"
    )
    header = ("what", "median ms", "min ms", "Python loop over time", "over batch")
    width = max(len(r[0]) for r in rows)
    loop_width = max(len(header[3]), *(len(r[2]) for r in rows))
    print(f"{header[0]:<{width}}  {header[1]:>9}  {header[2]:>6}  {header[3]:<{loop_width}}  {header[4]}")
    for what, (median, fastest), loop in rows:
        batch_loop = "none" if loop != NOT_AUDITED else NOT_AUDITED
        print(f"{what:<{width}}  {median:9.1f}  {fastest:6.1f}  {loop:<{loop_width}}  {batch_loop}")
    settings = {k: getattr(args, k) for k in ("batch", "length", "threads", "runs", "warmup")}
    timings = [
        {"what": what, "median_ms": median, "min_ms": fastest, "time_loop": loop}
        for what, (median, fastest), loop in rows
    ]
    return {**settings, "gamma": 0.99, "lam": 0.95, "timings": timings}


if __name__ == "__main__":
    main()
