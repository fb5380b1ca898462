"""The decode attention kernel inside the static engine's loop against the same call in isolation.

    .venv/bin/python benchmarks/attention_in_loop.py [--threads 2] [--repeats 4]

The arith config's SFT policy (as ``benchmarks/bench.py`` uses), 16 prompts x 8 samples, 48 tokens
with eos disabled. Every call of the fused rotary + cache + attention kernel during
``--repeats`` generate calls is timed; then one call's arguments (at 24 response columns) are
copied and the same kernel is timed on them alone: hot (back to back), after a 32 MB memory
sweep (its inputs no longer in cache), and after a 2 ms sleep (the cores idle). Prints medians
in microseconds per call (one layer of one decode step).
"""

import argparse
import statistics
import time

import numpy as np
import torch

from bench import bench_policy_and_prompts
from creditrl.policy.engines import SamplingParams, StaticEngine, kernels

COLUMNS = 24  # the response length at which one call's arguments are kept for the isolated runs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=4)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model, tok, prompts = bench_policy_and_prompts()  # the SFT policy benchmarks/bench.py uses
    params = SamplingParams(max_new_tokens=48, temperature=1.0)
    engine = StaticEngine(model, eos_id=-1, pad_id=tok.pad_token_id, kernels="numba")
    lib = kernels._need()
    kernel = lib._rope_cache_attend
    in_loop: list[float] = []
    kept: list[tuple] = []

    def timed(*a):
        start = time.perf_counter()
        result = kernel(*a)
        in_loop.append(time.perf_counter() - start)
        if not kept and a[8] == a[5].shape[1] - 48 + COLUMNS:  # t = prompt width + COLUMNS
            kept.append(tuple(x.copy() if isinstance(x, np.ndarray) else x for x in a))
        return result

    lib._rope_cache_attend = timed
    try:
        engine.generate(prompts, 8, params, generator=torch.Generator().manual_seed(0))  # warm-up
        in_loop.clear()
        for r in range(args.repeats):
            engine.generate(prompts, 8, params, generator=torch.Generator().manual_seed(r))
    finally:
        lib._rope_cache_attend = kernel
    a = kept[0]
    sweep = np.ones(8_000_000, dtype=np.float32)

    def alone(before) -> float:
        times = []
        for _ in range(200):
            before()
            start = time.perf_counter()
            kernel(*a)
            times.append(time.perf_counter() - start)
        return statistics.median(times)

    def sweep_memory() -> None:
        sweep.__iadd__(1.0)

    rows = [
        ("in the decode loop (all layers and steps)", statistics.median(in_loop)),
        ("alone, back to back (inputs hot in cache)", alone(lambda: None)),
        ("alone, after a 32 MB memory sweep", alone(sweep_memory)),
        ("alone, after a 2 ms sleep", alone(lambda: time.sleep(0.002))),
    ]
    print(f"rotary + cache + attention kernel, 128 rows, {args.threads} threads: median us per call")
    print("| where | us |\n|---|---|")
    for label, seconds in rows:
        print(f"| {label} | {seconds * 1e6:.0f} |")


if __name__ == "__main__":
    main()
