"""GPU check at real size: a GRPO iteration of creditrl against TRL's GRPOTrainer on a Qwen2-0.5B-shaped model.

Needs torch with CUDA and trl (``creditrl[bench]``); no vLLM (both sides generate in process: creditrl's
engine on CUDA, HF ``generate`` inside TRL). Run on a GPU machine::

    PYTHONUNBUFFERED=1 python benchmarks/gpu_realsize.py [--lengths 256 1024] [--out gpu_realsize.json]

The model: Qwen2-0.5B's transformer body (24 layers, hidden 896, 14 heads, 2 KV heads, MLP 4,864, q/k/v
bias, tied embeddings) on creditrl's character vocabulary, random init. That is the real model's layers
(about 358M parameters) without its 151,936-token embedding (136M parameters). As in ``benchmarks/performance.py``,
an eos outside the vocabulary is appended, so every row generates exactly the asked
length in both trainers.

At each length, creditrl's iterations (``RLTrainer``: rollout, scoring, GRPO, update) and TRL's steps
(generation, reward, loss, update) run one after the other at identical settings: outcome reward on
the arithmetic task, group-normalised advantages, token-mean PPO-clip loss, no KL, AdamW, float32
weights with bf16 autocast (``policy.precision=bf16``; TRL ``bf16=True``), on ``cuda``. The first
iteration of each is dropped (warm-up). Reported: seconds per iteration (median), generated tokens/s,
creditrl's rollout and update seconds, peak GPU memory of each.

Prints one JSON summary (also written to ``--out``; default ``$OUT/gpu_realsize.json`` when ``$OUT`` is
set, else ``runs/gpu_realsize.json``). Exits 0 when every length ran, 1 when one failed, 2 with no GPU.
``--device cpu --layers 2`` dry-runs the plumbing on a CPU.
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

from bench import BenchOptions, creditrl_iterations, spread, trl_iterations
from creditrl.policy.engines import choose_engine
from creditrl.policy.model import count_parameters, load_policy
from creditrl.policy.tokenizer import build_char_tokenizer
from perf_points import save_with_unreachable_eos

QWEN2_05B = {
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "tie_word_embeddings": True,
}


def save_model(out: Path, layers: int, seed: int) -> Path:
    """The Qwen2-0.5B-shaped random model with the character tokenizer and an unreachable eos."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tok = build_char_tokenizer()
    config = Qwen2Config(
        vocab_size=len(tok),
        num_hidden_layers=layers,
        max_position_embeddings=4096,
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id,
        **QWEN2_05B,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    return save_with_unreachable_eos(model, tok, out)


def peak_mb(device: str) -> float | None:
    return torch.cuda.max_memory_allocated() / 2**20 if device == "cuda" else None


def reset_peak(device: str) -> None:
    if device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def point(policy: str, length: int, args: argparse.Namespace) -> dict:
    """creditrl's iterations, then TRL's steps, at ``length`` generated tokens per row."""
    opts = BenchOptions(
        policy=policy,
        prompts=args.prompts,
        group=args.group,
        max_new_tokens=length,
        temperature=1.0,
        lr=5e-6,
        seed=0,
        trl=True,
    )
    overrides = [
        f"policy.device={args.device}",
        f"policy.precision={args.precision}",
        "optim.skip_zero_advantage=false",
    ]
    reset_peak(args.device)
    began = time.perf_counter()
    ours = creditrl_iterations(policy, opts, args.iterations, overrides)[1:]
    ours_wall = time.perf_counter() - began
    ours_peak = peak_mb(args.device)
    reset_peak(args.device)
    began = time.perf_counter()
    peer = trl_iterations(policy, opts, args.iterations, device=args.device, precision=args.precision)[1:]
    peer_wall = time.perf_counter() - began
    peer_peak = peak_mb(args.device)
    rows = args.prompts * args.group
    ours_s = [r["time/iter_s"] for r in ours]
    peer_s = [r["time_s"] for r in peer]
    return {
        "length": length,
        "rows": rows,
        "creditrl": {
            "iter_s": spread(ours_s),
            "rollout_s": spread([r["time/rollout_s"] for r in ours]),
            "update_s": spread([r["time/update_s"] for r in ours]),
            "generated_per_row": statistics.mean(r["response/length"] for r in ours),
            "tokens_per_s": spread([r["tokens/generated"] / r["time/iter_s"] for r in ours]),
            "peak_gpu_mb": ours_peak,
            "wall_s": ours_wall,
        },
        "trl": {
            "iter_s": spread(peer_s),
            "generated_per_row": statistics.mean(r["tokens"] for r in peer) / rows,
            "tokens_per_s": spread([r["tokens"] / r["time_s"] for r in peer]),
            "peak_gpu_mb": peer_peak,
            "wall_s": peer_wall,
        },
        "ratio_trl_vs_creditrl": statistics.median(peer_s) / statistics.median(ours_s),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--precision", default="bf16", choices=["bf16", "fp32"])
    parser.add_argument("--lengths", type=int, nargs="+", default=[256, 1024])
    parser.add_argument("--iterations", type=int, nargs="+", default=[3, 2], help="per length (last one repeats)")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print(json.dumps({"error": "torch sees no CUDA device", "torch": torch.__version__}))
        return 2
    out_path = Path(
        args.out
        or (Path(os.environ["OUT"]) / "gpu_realsize.json" if os.environ.get("OUT") else "runs/gpu_realsize.json")
    )
    import transformers
    import trl

    summary: dict = {
        "device": args.device,
        "gpu": torch.cuda.get_device_name(0) if args.device == "cuda" else None,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "trl": trl.__version__,
        "precision": args.precision,
        "points": [],
    }
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        policy = str(save_model(Path(tmp) / "model", args.layers, seed=0))
        model, _ = load_policy(policy)
        summary["engine"] = choose_engine(model.to(args.device), "auto")[0]  # creditrl's policy.engine=auto
        summary["model"] = {
            "shape": {**QWEN2_05B, "num_hidden_layers": args.layers, "vocab_size": model.config.vocab_size},
            "parameters": count_parameters(model),
        }
        del model
        print(json.dumps({"model": summary["model"]}), flush=True)
        for i, length in enumerate(args.lengths):
            its = args.iterations[min(i, len(args.iterations) - 1)]
            try:
                res = point(policy, length, argparse.Namespace(**{**vars(args), "iterations": its}))
            except Exception as exc:  # one length's failure is reported; the others still run
                res = {"length": length, "error": f"{type(exc).__name__}: {exc}"}
                ok = False
            summary["points"].append(res)
            print(json.dumps(res), flush=True)
            out_path.parent.mkdir(parents=True, exist_ok=True)
            out_path.write_text(json.dumps(summary, indent=2))  # what ran so far survives a timeout
    summary["passed"] = ok
    out_path.write_text(json.dumps(summary, indent=2))
    for p in summary["points"]:
        if "error" not in p:
            c, t = p["creditrl"], p["trl"]
            print(
                f"length {p['length']}: creditrl {c['iter_s']['median']:.2f} s/it ({c['tokens_per_s']['median']:,.0f} "
                f"tok/s, rollout {c['rollout_s']['median']:.2f} s, update {c['update_s']['median']:.2f} s, peak "
                f"{c['peak_gpu_mb'] or 0:,.0f} MB); TRL {t['iter_s']['median']:.2f} s/it "
                f"({t['tokens_per_s']['median']:,.0f} tok/s, peak {t['peak_gpu_mb'] or 0:,.0f} MB) -> "
                f"{p['ratio_trl_vs_creditrl']:.2f}x"
            )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
