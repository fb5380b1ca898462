"""Where the static engine's compiled decode step spends its time, op by op.

    .venv/bin/python benchmarks/decode_profile.py [--threads 2] [--repeats 5] [--rows-per-prompt 8] [--every-row]

The arith config's SFT policy (as ``benchmarks/bench.py`` uses), 16 arithmetic prompts x 8 samples,
48 tokens with eos disabled, ``policy.kernels=numba``. Every call inside the decode step (the
matrix products by weight, the attention kernel, RMSNorm, the gated SiLU), the sampling step and
the prompt prefill is timed with a wall clock over ``--repeats`` generate calls after one
warm-up; "rest" is the call's time outside them (cache set-up, bookkeeping, Python). Prints
milliseconds per decode step and shares of the call. ``--every-row``: decode every row, also
identical ones (``share_rows=False``); by default the engine computes one slot per distinct
sequence, and ``cache_layout="auto"`` picks its layout from the warm-up call.
"""

import argparse
import collections
import time

import torch
import torch.nn.functional as F

from bench import bench_policy_and_prompts
from creditrl.policy.engines import SamplingParams, kernels
from creditrl.policy.engines import static as se

STEPS = 48


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--rows-per-prompt", type=int, default=8)
    ap.add_argument("--every-row", action="store_true", help="share_rows=False")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model, tok, prompts = bench_policy_and_prompts()  # the SFT policy benchmarks/bench.py uses
    params = SamplingParams(max_new_tokens=STEPS, temperature=1.0)
    engine = se.StaticEngine(model, eos_id=-1, pad_id=tok.pad_token_id, kernels="numba", share_rows=not args.every_row)
    hidden, inter = model.config.hidden_size, model.config.intermediate_size
    names = {hidden: "matmul o_proj + residual", inter: "matmul down_proj + residual"}
    out_names = {2 * inter: "matmul gate|up", model.config.vocab_size: "matmul lm_head"}
    spent: collections.Counter = collections.Counter()
    inside = [False]

    def timed(label_of, fn):
        def wrapper(*a, **k):
            if not inside[0]:
                return fn(*a, **k)
            start = time.perf_counter()
            result = fn(*a, **k)
            spent[label_of(*a)] += time.perf_counter() - start
            return result

        return wrapper

    def linear_label(x, w, *rest):
        return out_names.get(w.shape[0], "matmul q|k|v")

    def addmm_label(h, x, w, *rest):
        return names.get(x.shape[1], "matmul (other)")

    def region(label, fn, flag=None):
        def wrapper(*a, **k):
            start = time.perf_counter()
            if flag is not None:
                inside[0] = flag
            try:
                return fn(*a, **k)
            finally:
                if flag is not None:
                    inside[0] = False
                spent[label] += time.perf_counter() - start

        return wrapper

    patches = [
        (F, "linear", timed(linear_label, F.linear)),
        (torch, "addmm", timed(addmm_label, torch.addmm)),
        (
            kernels,
            "rope_cache_attend",
            timed(lambda *a: "attention (rotary, cache write, softmax, values)", kernels.rope_cache_attend),
        ),
        (
            kernels,
            "rope_cache_attend_shared",
            timed(lambda *a: "attention (rotary, cache write, softmax, values)", kernels.rope_cache_attend_shared),
        ),
        (kernels, "rms_norm", timed(lambda *a: "RMSNorm", kernels.rms_norm)),
        (kernels, "silu_mul", timed(lambda *a: "gated SiLU", kernels.silu_mul)),
        (se.Decoder, "decode_fused", region("decode step", se.Decoder.decode_fused, flag=True)),
        (se.Decoder, "forward", region("prompt prefill", se.Decoder.forward)),
        (se, "sample_step", region("sampling (draw, log-prob, state)", se.sample_step)),
    ]
    originals = [(obj, name, getattr(obj, name)) for obj, name, _ in patches]
    for obj, name, fn in patches:
        setattr(obj, name, fn)
    try:
        engine.generate(prompts, args.rows_per_prompt, params, generator=torch.Generator().manual_seed(0))
        spent.clear()
        start = time.perf_counter()
        for r in range(args.repeats):
            engine.generate(prompts, args.rows_per_prompt, params, generator=torch.Generator().manual_seed(r))
        total = time.perf_counter() - start
    finally:
        for obj, name, fn in originals:
            setattr(obj, name, fn)
    step = spent.pop("decode step")
    per_step = 1000 / (args.repeats * STEPS)
    rows = sorted(spent.items(), key=lambda kv: -kv[1])
    inner = sum(v for k, v in rows if k not in ("prompt prefill", "sampling (draw, log-prob, state)"))
    rows.append(("rest of the decode step (embedding, Python)", step - inner))
    rows.append(
        (
            "rest of the call (cache set-up, bookkeeping)",
            total - step - spent["prompt prefill"] - spent["sampling (draw, log-prob, state)"],
        )
    )
    computed, decoded = engine.last_rows
    rows_layout = engine.rows_layout(len(prompts) * args.rows_per_prompt, len(prompts), max(map(len, prompts)), STEPS)
    print(
        f"{len(prompts) * args.rows_per_prompt} rows x {STEPS} tokens, {args.threads} threads: "
        f"{total * per_step:.2f} ms per step ({args.repeats} calls); "
        f"{'rows innermost' if rows_layout else 'shared-prompt'} "
        f"cache, last call computed {computed:,} of {decoded:,} row-steps"
    )
    print("| part | ms per step | share |\n|---|---|---|")
    for label, seconds in rows:
        print(f"| {label} | {seconds * per_step:.3f} | {seconds / total:.0%} |")


if __name__ == "__main__":
    main()
