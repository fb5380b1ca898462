"""GPU check of the compiled decode engine: its decode tokens/s against HF ``generate`` at the Qwen2-0.5B shape.

Needs torch with CUDA (no download: the model is ``gpu_realsize.py``'s Qwen2-0.5B-shaped body, random
weights, on the character vocabulary, with an eos no row can sample, so every row decodes the asked
length). Run on a GPU machine, before ``gpu_realsize.py`` (whose creditrl side now decodes through the same
engine: ``policy.engine=auto`` is ``compiled`` on CUDA, and inductor's on-disk cache then serves its
compilations)::

    PYTHONUNBUFFERED=1 python benchmarks/gpu_compiled_decode.py [--lengths 1024 256] [--out gpu_compiled_decode.json]

At each length, 4 arithmetic prompts x 4 samples (16 rows, as a GRPO iteration of ``gpu_realsize.py``),
temperature 1, float32 weights under bf16 autocast (``policy.precision=bf16``): the compiled engine's first
call (prefill, its bucket's compilation and capture, the decode) is timed apart; then its calls and HF
``generate``'s (``do_sample``, ``min_new_tokens`` = ``max_new_tokens``, the same autocast, after one short
warm-up call) alternate ``--repeats`` times. Reported: seconds per call and decode tokens/s (median),
milliseconds per decode step, the ratio, and the peak GPU memory of each (reset before each call).

Prints one JSON line per length and writes the summary to ``--out`` (default ``$OUT/gpu_compiled_decode.json``
when ``$OUT`` is set) after each length, so a timeout keeps what ran. Exits 0 when every length ran, 1 when
one failed, 2 with no GPU. ``--device cpu --layers 1 --backend eager`` dry-runs the plumbing on a CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from creditrl.policy.device import autocast  # noqa: E402
from creditrl.policy.engines import CompiledEngine, SamplingParams, choose_engine, left_pad  # noqa: E402
from creditrl.policy.model import count_parameters, load_policy  # noqa: E402
from creditrl.policy.tokenizer import encode_prompt  # noqa: E402
from creditrl.tasks import make_task  # noqa: E402
from gpu_realsize import QWEN2_05B, save_model  # noqa: E402 - the sibling script's model


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def timed(device: str, call) -> tuple[float, float | None]:
    """Seconds of ``call()`` and the peak GPU memory (MB) it reached (None on the CPU)."""
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    sync(device)
    start = time.perf_counter()
    call()
    sync(device)
    seconds = time.perf_counter() - start
    return seconds, torch.cuda.max_memory_allocated() / 2**20 if device == "cuda" else None


def hf_generate(model, prompts: list[list[int]], group: int, length: int, pad_id: int, precision: str):
    """HF ``generate``: every prompt ``group`` times, left-padded, sampled for exactly ``length`` tokens."""
    ids, attn = left_pad([p for p in prompts for _ in range(group)], pad_id)
    device = next(model.parameters()).device
    with torch.no_grad(), autocast(device, precision):
        return model.generate(
            input_ids=ids.to(device),
            attention_mask=attn.to(device),
            do_sample=True,
            temperature=1.0,
            top_k=0,
            max_new_tokens=length,
            min_new_tokens=length,
            pad_token_id=pad_id,
        )


def summary_of(seconds: list[float], peaks: list[float | None], tokens: int, steps: int) -> dict:
    """Median seconds, tokens/s and ms per decode step over the timed calls, and their peak memory."""
    med = statistics.median(seconds)
    return {
        "s_per_call": med,
        "calls": len(seconds),
        "tokens_per_s": tokens / med,
        "ms_per_step": 1000 * med / steps,
        "peak_gpu_mb": max(peaks) if all(p is not None for p in peaks) else None,
    }


def point(model, tok, prompts: list[list[int]], length: int, args: argparse.Namespace) -> dict:
    """The compiled engine's first call, then ``--repeats`` alternating calls of it and of HF ``generate``."""
    engine = CompiledEngine(
        model, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, precision=args.precision, backend=args.backend
    )
    params = SamplingParams(max_new_tokens=length, temperature=1.0)
    gen = torch.Generator().manual_seed(0)

    def ours():
        out = engine.generate(prompts, args.group, params, generator=gen)
        assert all(len(t) == length for t in out.tokens), "a row stopped early: the eos must be unreachable"

    first_s, first_peak = timed(args.device, ours)
    timed(args.device, lambda: hf_generate(model, prompts, args.group, 8, tok.pad_token_id, args.precision))
    runs: dict[str, tuple[list, list]] = {"compiled": ([], []), "hf_generate": ([], [])}
    for _ in range(args.repeats):  # alternated, so a drift of the machine falls on both alike
        for name, call in (
            ("compiled", ours),
            ("hf_generate", lambda: hf_generate(model, prompts, args.group, length, tok.pad_token_id, args.precision)),
        ):
            s, peak = timed(args.device, call)
            runs[name][0].append(s)
            runs[name][1].append(peak)
    rows = len(prompts) * args.group
    res = {"length": length, "rows": rows}
    for name, (secs, peaks) in runs.items():
        res[name] = summary_of(secs, peaks, rows * length, length)
    res["compiled"].update(
        first_call_s=first_s, first_call_peak_gpu_mb=first_peak, backend=engine.backend, buckets=sorted(engine.buckets)
    )
    res["ratio_compiled_vs_hf"] = res["compiled"]["tokens_per_s"] / res["hf_generate"]["tokens_per_s"]
    return res


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--precision", default="bf16", choices=["bf16", "fp32"])
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 256])
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--backend", default="inductor", choices=["inductor", "eager"])
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print(json.dumps({"error": "torch sees no CUDA device", "torch": torch.__version__}))
        return 2
    default = Path(os.environ["OUT"]) if os.environ.get("OUT") else Path("runs")
    out_path = Path(args.out or default / "gpu_compiled_decode.json")
    summary: dict = {
        "device": args.device,
        "gpu": torch.cuda.get_device_name(0) if args.device == "cuda" else None,
        "torch": torch.__version__,
        "precision": args.precision,
        "points": [],
    }
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        model, tok = load_policy(str(save_model(Path(tmp) / "model", args.layers, seed=0)))
    model.to(args.device).eval()
    summary["model"] = {"shape": {**QWEN2_05B, "num_hidden_layers": args.layers}, "parameters": count_parameters(model)}
    summary["auto_engine"] = choose_engine(model, "auto")[0]  # what policy.engine=auto runs this model with
    task = make_task("arithmetic", min_ops=1, max_ops=3)
    prompts = [encode_prompt(tok, p.prompt) for p in task.sample(args.prompts, split="train", seed=0)]
    for length in args.lengths:
        try:
            res = point(model, tok, prompts, length, args)
        except Exception as exc:  # one length's failure is reported; the others still run
            res, ok = {"length": length, "error": f"{type(exc).__name__}: {str(exc)[:500]}"}, False
        summary["points"].append(res)
        print(json.dumps(res), flush=True)
        out_path.parent.mkdir(parents=True, exist_ok=True)
        out_path.write_text(json.dumps(summary, indent=2))
    summary["passed"] = ok
    out_path.write_text(json.dumps(summary, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
