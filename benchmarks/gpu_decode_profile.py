"""GPU profile of the HF engine's decoding by precision: why the tiny model's bf16/fp16 rollout is slow on CUDA.

docs/results/gpu.md records it: on an H200 the tiny preset's rollout took about 10x fp32's under bf16
autocast, while the update, the reference pass and a 24-layer model's bf16 decode did not slow down. This
times ``HFEngine.generate`` on the chain of cases that separates the suspects, each after one untimed call,
and profiles one call of each with torch.profiler (CPU and CUDA activity)::

    PYTHONUNBUFFERED=1 python benchmarks/gpu_decode_profile.py [--device cuda] [--out gpu_decode_profile.json]

Cases, each at fp32, bf16 and fp16: the tiny preset with its eos reachable (rows stop and leave the cache)
and with eos unreachable (every row decodes ``--tokens``); on CUDA also bf16 and fp16 with cuDNN's attention
left out of SDPA's backends. The suspect: cuDNN attention serves only half precision and plans per shape,
and a decode step's key length is a new shape every step (the slow rollouts got faster from one iteration
to the next, as a per-shape cache would). Printed: median seconds per call and per decode step, and the ten
ops with the most self device time (CPU time on a CPU) of each profile. ``--device cpu`` dry-runs it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile

from creditrl.policy.engines import HFEngine, SamplingParams
from creditrl.policy.model import load_policy
from creditrl.policy.tokenizer import encode_prompt
from creditrl.tasks import make_task


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def case(model, tok, prompts, precision: str, eos: int | None, args, cudnn: bool = True) -> dict:
    """Time ``--repeats`` calls after one untimed call, then profile one; ``cudnn=False`` leaves cuDNN's
    attention out of SDPA's backends for all of them."""
    engine = HFEngine(model, eos_id=eos, pad_id=tok.pad_token_id, precision=precision)
    params = SamplingParams(max_new_tokens=args.tokens, temperature=1.0)

    def call(seed: int):
        sync(args.device)
        start = time.perf_counter()
        g = engine.generate(prompts, args.group, params, generator=torch.Generator().manual_seed(seed))
        sync(args.device)
        return time.perf_counter() - start, max(len(t) for t in g.tokens)

    backends = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if args.device == "cuda" else [])
    with contextlib.nullcontext() if cudnn else sdpa_kernel(backends):
        call(0)
        timed = [call(1 + r) for r in range(args.repeats)]
        with profile(activities=activities) as prof:
            call(99)
    key = "self_device_time_total" if args.device == "cuda" else "self_cpu_time_total"
    events = sorted(prof.key_averages(), key=lambda e: getattr(e, key, 0.0), reverse=True)[:10]
    seconds = statistics.median(s for s, _ in timed)
    steps = statistics.median(n for _, n in timed)
    return {
        "precision": precision,
        "eos": "reachable" if eos is not None else "unreachable",
        "cudnn_attention": cudnn,
        "s_per_call": seconds,
        "steps": steps,
        "ms_per_step": 1000 * seconds / steps,
        "top_ops": [
            {
                "op": e.key,
                "calls": e.count,
                "self_ms": getattr(e, key, 0.0) / 1000,
                "cpu_ms": e.self_cpu_time_total / 1000,
            }
            for e in events
        ],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print(json.dumps({"error": "torch sees no CUDA device", "torch": torch.__version__}))
        return 2
    out_path = Path(
        args.out
        or (
            Path(os.environ["OUT"]) / "gpu_decode_profile.json"
            if os.environ.get("OUT")
            else "runs/gpu_decode_profile.json"
        )
    )
    model, tok = load_policy("tiny", seed=1)
    model.to(args.device)
    task = make_task("arithmetic", min_ops=1, max_ops=3)
    prompts = [encode_prompt(tok, p.prompt) for p in task.sample(args.prompts, split="train", seed=0)]
    results = []
    cases = [(p, eos, True) for eos in (tok.eos_token_id, None) for p in ("fp32", "bf16", "fp16")]
    if args.device == "cuda":
        cases += [(p, tok.eos_token_id, False) for p in ("bf16", "fp16")]
    for precision, eos, cudnn in cases:
        res = case(model, tok, prompts, precision, eos, args, cudnn)
        results.append(res)
        print(
            f"{precision} eos {res['eos']}{'' if cudnn else ' without cuDNN attention'}: "
            f"{res['s_per_call']:.3f} s/call, {res['steps']:.0f} steps, "
            f"{res['ms_per_step']:.2f} ms/step; top: "
            + ", ".join(f"{o['op']} {o['self_ms']:.1f} ms x{o['calls']}" for o in res["top_ops"][:4]),
            flush=True,
        )
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps({"device": args.device, "torch": torch.__version__, "cases": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
