"""GPU check of ``policy.engine=vllm`` (:mod:`creditrl.policy.engines.vllm`) against the in-process engines.

Run on a machine with a CUDA GPU and vLLM. Not yet run with vLLM (the one GPU lent so far had no vLLM:
docs/results/gpu.md): written against vLLM's documented API, its plumbing dry-run on CPU with the test double
of tests/policy/test_vllm_engine.py. Expected 3-5 minutes, dominated by three vLLM start-ups
(``--skip-train`` drops one, ``--dtypes float32`` another)::

    PYTHONUNBUFFERED=1 python benchmarks/gpu_check.py [--out gpu_check.json] [--skip-train]

It prints one JSON summary (also written to ``--out``, default ``$OUT/gpu_check.json`` when
``$OUT`` is set, else ``runs/gpu_check.json``) and exits 0 when every check passed, 1 when one
failed, 2 when the machine has no CUDA GPU or no vLLM. Checks, for vLLM in float32 (eager) and
bfloat16 (CUDA graphs), on the tiny preset (Llama, 4 layers, head_dim 32) with re-drawn peaked
weights (near-uniform random-init logits would make greedy comparisons a matter of float ties):

1. ``greedy``: 64 arithmetic prompts, 48 new tokens; vLLM's tokens against the in-process engine
   (``make_engine(kind="auto")`` = StaticEngine, on CPU in float32). Pass: every sequence equal,
   or each divergence at a near tie (reference top-2 logit gap below ``TIE[dtype]``).
2. ``logprobs``: vLLM samples at temperature 0.8 / top_p 0.9 (n=4, 32 prompts, 32 tokens); the
   returned log-probs against a full forward pass of the HF model on the GPU in float32 (TF32
   off), raw log-softmax (temperature 1, no top-p). Pass: max |diff| < ``LOGP_TOL[dtype]``
   (float32: 1e-3; bfloat16: 0.25 max and 0.02 mean, a few bf16 ulps of logits of size ~10);
   also reports the diff against the tempered distribution, which must be far larger (raw mode).
3. ``sampling``: 8000 one-token samples of one prompt at (T=1.5, top_p=1) and (T=1, top_p=0.8);
   total-variation distance between the empirical and the model's (tempered, truncated) first
   token distribution. Pass: TV below max(0.03, 1.25 x the largest TV of 200 exact multinomial
   draws of the same size from the reference), i.e. indistinguishable from exact sampling noise.
4. ``sync``: perturb the HF weights in place; with auto-sync off vLLM must still give the old
   greedy tokens (stale), after ``sync()`` the new model's (criterion of 1); sync time.
5. ``throughput``: 128 prompts x 64 new tokens at temperature 1 (the peaked random model
   rarely emits eos): vLLM's generated tokens/s, with per-request seeds (the default) and
   without, vs StaticEngine on CPU and, if it runs there, on CUDA.
6. ``train`` (float32, unless --skip-train): ``creditrl train`` for 3 iterations with
   ``policy.engine=vllm`` (``train.init=policy``, small groups) in a subprocess; pass: exit 0 and
   3 iteration rows in metrics.jsonl. Runs first, while the GPU is still free.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

TIE = {"float32": 1e-3, "bfloat16": 0.25}
LOGP_TOL = {"float32": (1e-3, 1e-4), "bfloat16": (0.25, 0.02)}  # (max, mean) |diff|
TV_TOL = 0.03  # floor of the sampling bound (see check 3)
GPU_MEM = 0.2  # per vLLM instance; two live at once in this process
DEVICE = "cuda"  # where references run (a CPU dry run of the plumbing sets "cpu")


def synchronize() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def peaked_tiny(seed: int = 0):
    """The tiny preset with weights re-drawn at unit gain and final norm 3: peaked,
    context-dependent next-token distributions (as tests/conftest.py does at a smaller size)."""
    from creditrl.policy.model import build_tiny, sharpen

    model, tok = build_tiny(seed)
    return sharpen(model, 1000 + seed), tok


def prompts(tok, n: int, seed: int = 0) -> list[list[int]]:
    from creditrl.policy.tokenizer import encode_prompt
    from creditrl.tasks import make_task

    task = make_task("arithmetic")
    return [encode_prompt(tok, p.prompt) for p in task.sample(n, split="train", seed=seed)]


@torch.no_grad()
def full_logits(model_gpu, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    """Logits (len(tokens), V) in float32 predicting each of ``tokens`` after ``prompt``."""
    ids = torch.tensor([prompt + tokens], device=DEVICE)
    return model_gpu(ids).logits[0, len(prompt) - 1 : -1].float()


def greedy_agreement(gen_tokens, ref_tokens, gen_prompts, model_gpu, tie: float) -> dict:
    """Exact match per sequence; where they differ, the reference's top-2 gap at the divergence."""
    equal, gaps = 0, []
    for prompt, a, b in zip(gen_prompts, gen_tokens, ref_tokens):
        if a == b:
            equal += 1
            continue
        t = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        logits = full_logits(model_gpu, prompt, b[: t + 1])[t] if t < len(b) else None
        gaps.append(float(logits.topk(2).values[0] - logits.topk(2).values[1]) if logits is not None else float("inf"))
    return {
        "sequences": len(gen_tokens),
        "equal": equal,
        "divergence_gaps": gaps[:10],
        "pass": all(g < tie for g in gaps),
    }


def run_train(tmp: Path, timeout: int) -> dict:
    run_dir = tmp / "train"
    sets = [
        "policy.engine=vllm",
        "train.init=policy",
        "train.iterations=3",
        "train.eval_every=3",
        "train.eval_size=32",
        "rollout.prompts_per_iter=8",
        "rollout.group_size=4",
        "rollout.max_new_tokens=32",
        "train.progress=false",
        "train.inspect_every=0",
        "train.checkpoint_every=100",
    ]
    cmd = [sys.executable, "-m", "creditrl.cli", "train", "--run-dir", str(run_dir)] + [
        a for s in sets for a in ("--set", s)
    ]
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        rc, tail = proc.returncode, (proc.stdout + proc.stderr)[-1500:]
    except subprocess.TimeoutExpired as exc:
        rc, tail = "timeout", str(exc.stdout or "")[-1500:]
    rows = []
    metrics = run_dir / "metrics.jsonl"
    if metrics.exists():
        rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    iters = sorted({r.get("iteration") for r in rows if r.get("iteration")})
    return {
        "command": " ".join(cmd[1:]),
        "returncode": rc,
        "seconds": round(time.perf_counter() - start, 1),
        "iterations_logged": iters,
        "last_row": {k: v for k, v in (rows[-1] if rows else {}).items() if isinstance(v, (int, float))},
        "output_tail": tail if rc != 0 else "",
        "pass": rc == 0 and iters[-3:] == [1, 2, 3],
    }


def check_dtype(dtype: str, model_cpu, tok) -> dict:
    from creditrl.policy.engines import SamplingParams, make_engine
    from creditrl.policy.engines.vllm import VLLMEngine

    out: dict = {}
    eos, pad = tok.eos_token_id, tok.pad_token_id
    model = copy.deepcopy(model_cpu).to(getattr(torch, dtype))  # the "trainer's" HF policy, CPU
    ref_gpu = copy.deepcopy(model_cpu).float().to(DEVICE).eval()  # float32 reference on the GPU
    t0 = time.perf_counter()
    engine = VLLMEngine(
        model=model,
        eos_id=eos,
        pad_id=pad,
        dtype=dtype,
        gpu_memory_utilization=GPU_MEM,
        enforce_eager=dtype == "float32",
        max_model_len=160,
    )
    out["startup_s"] = round(time.perf_counter() - t0, 1)
    cpu_ref = make_engine(copy.deepcopy(model_cpu).float(), eos_id=eos, pad_id=pad, kind="auto")
    out["reference_engine"] = type(cpu_ref).__name__

    # 1. greedy
    ps = prompts(tok, 64)
    greedy = SamplingParams(max_new_tokens=48, temperature=0.0)
    gen = engine.generate(ps, 1, greedy)
    ref = cpu_ref.generate(ps, 1, greedy)
    out["greedy"] = greedy_agreement(gen.tokens, ref.tokens, gen.prompt_ids, ref_gpu, TIE[dtype])
    out["greedy"]["finished"] = [sum(gen.finished), sum(ref.finished)]

    # 2. raw log-probs of sampled tokens vs a full forward pass
    params = SamplingParams(max_new_tokens=32, temperature=0.8, top_p=0.9)
    gen = engine.generate(ps[:32], 4, params, generator=torch.Generator().manual_seed(0))
    diffs, tempered = [], []
    for prompt, toks, lps in zip(gen.prompt_ids, gen.tokens, gen.logprobs):
        if not toks:
            continue
        logits = full_logits(ref_gpu, prompt, toks)
        idx = torch.tensor(toks, device=DEVICE)[:, None]
        raw = torch.log_softmax(logits, -1).gather(-1, idx).squeeze(-1)
        hot = torch.log_softmax(logits / 0.8, -1).gather(-1, idx).squeeze(-1)
        got = torch.tensor(lps, device=DEVICE)
        diffs.append((got - raw).abs())
        tempered.append((got - hot).abs())
    d, h = torch.cat(diffs), torch.cat(tempered)
    tol_max, tol_mean = LOGP_TOL[dtype]
    out["logprobs"] = {
        "tokens": int(d.numel()),
        "max_abs_diff_raw": float(d.max()),
        "mean_abs_diff_raw": float(d.mean()),
        "max_abs_diff_tempered": float(h.max()),
        "tolerance_max_mean": [tol_max, tol_mean],
        "pass": float(d.max()) < tol_max and float(d.mean()) < tol_mean and float(h.mean()) > 10 * float(d.mean()),
    }

    # 3. sampling frequencies of the first token
    prompt = ps[0]
    with torch.no_grad():
        logits = full_logits(ref_gpu, prompt, [0])[0]
    freq = {}
    for name, (temp, top_p) in {"T1.5": (1.5, 1.0), "T1_p0.8": (1.0, 0.8)}.items():
        n = 8000
        g = engine.generate(
            [prompt],
            n,
            SamplingParams(max_new_tokens=1, temperature=temp, top_p=top_p),
            generator=torch.Generator().manual_seed(1),
        )
        counts = torch.bincount(torch.tensor([t[0] for t in g.tokens]), minlength=logits.numel()).double() / n
        probs = torch.softmax(logits.double() / temp, -1).cpu()
        if top_p < 1:
            sp, order = probs.sort(descending=True)
            sp[sp.cumsum(-1) - sp >= top_p] = 0
            probs = torch.zeros_like(probs).scatter(-1, order, sp)
            probs = probs / probs.sum()
        tv = 0.5 * float((counts - probs).abs().sum())
        # the TV that exact sampling gives at this n: 200 multinomial draws from the reference
        null = torch.distributions.Multinomial(n, probs=probs.float()).sample((200,)).double() / n
        null_tv = 0.5 * (null - probs).abs().sum(-1)
        bound = max(TV_TOL, 1.25 * float(null_tv.max()))
        freq[name] = {
            "samples": n,
            "tv_distance": tv,
            "exact_sampling_tv_mean_max": [float(null_tv.mean()), float(null_tv.max())],
            "bound": bound,
            "support": int((probs > 1e-3).sum()),
            "pass": tv < bound,
        }
    out["sampling"] = freq

    # 4. weight sync
    engine.auto_sync = False
    before = engine.generate(ps, 1, greedy)
    gen_ = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.add_((0.5 * torch.randn(p.shape, generator=gen_) / math.sqrt(p.shape[1])).to(p.dtype))
    stale = engine.generate(ps, 1, greedy)
    t0 = time.perf_counter()
    engine.sync()
    sync_s = time.perf_counter() - t0
    after = engine.generate(ps, 1, greedy)
    new_cpu = copy.deepcopy(model).float()
    new_ref = make_engine(new_cpu, eos_id=eos, pad_id=pad, kind="auto").generate(ps, 1, greedy)
    agree = greedy_agreement(after.tokens, new_ref.tokens, after.prompt_ids, new_cpu.to(DEVICE), TIE[dtype])
    out["sync"] = {
        "seconds": round(sync_s, 3),
        "stale_equals_before": stale.tokens == before.tokens,
        "changed": after.tokens != before.tokens,
        "after_vs_new_model": agree,
        "pass": stale.tokens == before.tokens and after.tokens != before.tokens and agree["pass"],
    }
    engine.auto_sync = True

    # 5. throughput at batch 128
    tp = {}
    batch = (ps * 2)[:128]
    params = SamplingParams(max_new_tokens=64, temperature=1.0)
    engine.generate(batch[:8], 1, params)  # warm-up
    synchronize()
    t0 = time.perf_counter()
    g = engine.generate(batch, 1, params, generator=torch.Generator().manual_seed(2))
    sec = time.perf_counter() - t0
    tp["vllm"] = {
        "tokens": sum(map(len, g.tokens)),
        "seconds": round(sec, 3),
        "tokens_per_s": round(sum(map(len, g.tokens)) / sec, 1),
        "enforce_eager": dtype == "float32",
    }
    engine.seeded = False  # vLLM's engine-wide RNG: no per-request generators
    t0 = time.perf_counter()
    g = engine.generate(batch, 1, params)
    sec = time.perf_counter() - t0
    engine.seeded = True
    tp["vllm_unseeded"] = {
        "tokens": sum(map(len, g.tokens)),
        "seconds": round(sec, 3),
        "tokens_per_s": round(sum(map(len, g.tokens)) / sec, 1),
    }
    t0 = time.perf_counter()
    g = cpu_ref.generate(batch, 1, params, generator=torch.Generator().manual_seed(2))
    sec = time.perf_counter() - t0
    tp["static_cpu"] = {
        "tokens": sum(map(len, g.tokens)),
        "seconds": round(sec, 3),
        "tokens_per_s": round(sum(map(len, g.tokens)) / sec, 1),
        "threads": torch.get_num_threads(),
    }
    try:  # the in-process engines allocate on the default device
        cuda_model = copy.deepcopy(model).to(DEVICE)
        with torch.device(DEVICE):
            cuda_engine = make_engine(cuda_model, eos_id=eos, pad_id=pad, kind="auto")
            cuda_engine.generate(batch[:8], 1, params)
            synchronize()
            t0 = time.perf_counter()
            g = cuda_engine.generate(batch, 1, params)
            synchronize()
            sec = time.perf_counter() - t0
        tp["static_cuda"] = {
            "tokens": sum(map(len, g.tokens)),
            "seconds": round(sec, 3),
            "tokens_per_s": round(sum(map(len, g.tokens)) / sec, 1),
        }
    except Exception as exc:  # noqa: BLE001 - reported, not a vLLM failure
        tp["static_cuda"] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
    out["throughput"] = tp
    out["pass"] = all(out[k]["pass"] for k in ("greedy", "logprobs", "sync")) and all(v["pass"] for v in freq.values())
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=None)
    parser.add_argument("--skip-train", action="store_true")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--train-timeout", type=int, default=150)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("gpu_check: needs a CUDA GPU; torch.cuda.is_available() is False on this machine", file=sys.stderr)
        return 2
    from creditrl.policy.engines.vllm import unavailable_message, vllm_unavailable_reason

    reason = vllm_unavailable_reason()
    if reason is not None:
        print(f"gpu_check: {unavailable_message(reason)}", file=sys.stderr)
        return 2
    import transformers
    import vllm

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    out_path = Path(
        args.out or (Path(os.environ["OUT"]) / "gpu_check.json" if os.environ.get("OUT") else "runs/gpu_check.json")
    )
    summary: dict = {
        "versions": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "vllm": vllm.__version__,
            "gpu": torch.cuda.get_device_name(0),
        },
        "tolerances": {"greedy_tie_gap": TIE, "logprob_max_mean": LOGP_TOL, "tv": TV_TOL},
    }
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        if not args.skip_train:
            summary["train"] = run_train(Path(tmp), args.train_timeout)
        model, tok = peaked_tiny(0)
        for dtype in args.dtypes.split(","):
            try:
                summary[dtype] = check_dtype(dtype, model, tok)
            except Exception as exc:  # noqa: BLE001 - one dtype failing should not hide the other
                summary[dtype] = {"error": f"{type(exc).__name__}: {str(exc)[:500]}", "pass": False}
            print(json.dumps({dtype: summary[dtype].get("pass")}), flush=True)
    summary["seconds"] = round(time.perf_counter() - start, 1)
    parts = [summary[d]["pass"] for d in args.dtypes.split(",")] + (
        [summary["train"]["pass"]] if "train" in summary else []
    )
    summary["pass"] = all(parts)
    text = json.dumps(summary, indent=2, default=str)
    print(text)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(text)
    return 0 if summary["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
