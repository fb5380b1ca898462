"""Static engine decode time per step against batch size, with and without the compiled kernels.

    .venv/bin/python benchmarks/decode_step.py [--threads 2] [--tokens 48] [--repeats 4]

The demo's SFT policy, eos disabled (every row decodes ``--tokens`` steps), 4-6-operation
arithmetic prompts; for each batch (prompts x samples) the best of ``--repeats`` calls, divided
by the number of steps (prefill included), for ``policy.kernels=torch`` and ``numba``. With
``--results PAGE`` the numbers also go to PAGE's name with .json, beside the page.
"""

import argparse
import time
from pathlib import Path

import torch

from bench import BenchOptions, resolve_policy
from common import write_json
from creditrl.experiments.report import printed_results  # noqa: E402
from creditrl.policy.engines import SamplingParams, StaticEngine
from creditrl.policy.model import load_policy
from creditrl.policy.tokenizer import encode_prompt
from creditrl.tasks import make_task


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--repeats", type=int, default=4)
    ap.add_argument("--results", metavar="PAGE", help="also write what is printed as a results page (docs/results/...)")
    args = ap.parse_args(argv)
    with printed_results(args.results, "Static engine decode step: tensor ops against the compiled kernels"):
        result = _run(args)
    if args.results:
        write_json(Path(args.results).with_suffix(".json"), result)


def _run(args: argparse.Namespace) -> dict[str, object]:
    torch.set_num_threads(args.threads)
    model, tok = load_policy(resolve_policy(BenchOptions()))  # the demo's SFT policy, as benchmarks/bench.py uses
    model.eval()
    task = make_task("arithmetic", min_ops=4, max_ops=6)
    params = SamplingParams(max_new_tokens=args.tokens, temperature=1.0)
    engines = {k: StaticEngine(model, eos_id=-1, pad_id=tok.pad_token_id, kernels=k) for k in ("torch", "numba")}
    print(f"ms per decode step ({args.threads} threads, {args.tokens} tokens, best of {args.repeats})")
    print("| rows | tensor ops | compiled kernels | ratio |\n|---|---|---|---|")
    rows = []
    for n_prompts, n in ((1, 1), (16, 1), (16, 4), (16, 8), (32, 8)):
        prompts = [encode_prompt(tok, p.prompt) for p in task.sample(n_prompts, split="train", seed=0)]
        best = {}
        for name, engine in engines.items():
            times = []
            for r in range(args.repeats):
                start = time.perf_counter()
                engine.generate(prompts, n, params, generator=torch.Generator().manual_seed(r))
                times.append(time.perf_counter() - start)
            best[name] = 1000 * min(times) / args.tokens
        print(f"| {n_prompts * n} | {best['torch']:.2f} | {best['numba']:.2f} | {best['torch'] / best['numba']:.2f}x |")
        rows.append({"rows": n_prompts * n, "ms_per_step": best, "ratio": best["torch"] / best["numba"]})
    return {"threads": args.threads, "tokens": args.tokens, "repeats": args.repeats, "batches": rows}


if __name__ == "__main__":
    main()
