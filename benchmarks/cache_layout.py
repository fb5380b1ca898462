"""The compiled kernels' two KV cache layouts on a short-prompt and a long-prefix workload.

    .venv/bin/python benchmarks/cache_layout.py [--threads 2] [--repeats 2]

The tiny policy (random weights; the layouts do not care), random prompts, eos disabled. For
each workload and layout (``rows``: each row's own copy of its prompt's keys, rows innermost;
``shared``: prompt keys once per distinct prompt), the best of ``--repeats`` calls, the size of
the cache it allocates, and which layout ``cache_layout="auto"`` picks
(:meth:`~creditrl.policy.engines.static.StaticEngine.rows_layout`).
"""

import argparse
import time

import torch

from creditrl.policy.engines import SamplingParams, StaticEngine
from creditrl.policy.model import build_tiny

WORKLOADS = (  # name, distinct prompts, samples each, prompt tokens, new tokens
    ("GRPO batch: 16 prompts x 8, 15 tokens, 48 new", 16, 8, 15, 48),
    ("MC continuations: 256 prefixes x 8, 80 tokens, 64 new", 256, 8, 80, 64),
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model, tok = build_tiny(0)
    model.eval()
    cfg = model.config
    kv_bytes = cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * (cfg.hidden_size // cfg.num_attention_heads) * 4
    print(f"{args.threads} threads, best of {args.repeats} calls")
    print("| workload | layout | s per call | KV cache MB | auto picks |\n|---|---|---|---|---|")
    for name, n_prompts, n, length, steps in WORKLOADS:
        g = torch.Generator().manual_seed(0)
        prompts = [torch.randint(5, cfg.vocab_size, (length,), generator=g).tolist() for _ in range(n_prompts)]
        params = SamplingParams(max_new_tokens=steps, temperature=1.0)
        rows = n_prompts * n
        auto = (
            "rows"
            if StaticEngine(model, eos_id=-1, pad_id=tok.pad_token_id).rows_layout(rows, n_prompts, length, steps)
            else "shared"
        )
        for layout in ("rows", "shared"):
            engine = StaticEngine(model, eos_id=-1, pad_id=tok.pad_token_id, kernels="numba", cache_layout=layout)
            best = float("inf")
            for r in range(args.repeats):
                start = time.perf_counter()
                engine.generate(prompts, n, params, generator=torch.Generator().manual_seed(r))
                best = min(best, time.perf_counter() - start)
            columns = rows * (length + steps) if layout == "rows" else n_prompts * length + rows * steps
            print(
                f"| {name} | {layout} | {best:.2f} | {columns * kv_bytes / 2**20:,.0f} | "
                f"{auto if layout == auto else ''} |"
            )


if __name__ == "__main__":
    main()
