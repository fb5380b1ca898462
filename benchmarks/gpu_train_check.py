"""GPU check of ``policy.device`` / ``policy.precision`` (training on a GPU in fp32, bf16, fp16).

Needs only torch with CUDA (no vLLM). Ran on an H200 (every check passed, 72 s; docs/results/gpu.md);
``--device cpu`` dry-runs it::

    PYTHONUNBUFFERED=1 python benchmarks/gpu_train_check.py [--device cuda] [--out gpu_train_check.json]

Prints one JSON summary (also written to ``--out``, default ``$OUT/gpu_train_check.json`` when
``$OUT`` is set, else ``runs/gpu_train_check.json``); exits 0 when every check passed, 1 when
one failed, 2 when ``--device cuda`` and torch sees no GPU. Checks, on the tiny preset:

1. ``greedy``: 32 arithmetic prompts, 24 new tokens, greedy, fp32: the HF engine with the
   model on the device gives the CPU StaticEngine's tokens (TF32 off), and its log-probs agree
   to 1e-3.
2. ``train_<precision>`` for fp32, bf16, fp16: ``RLTrainer`` for 3 iterations (SFT warm start
   of 60 steps on the device, then outcome GRPO with KL to the reference, a separate critic
   with GAE so that every model is on the device); pass: every metric finite, the weights
   float32 and moved, and for bf16/fp16 ``policy/sampler_logprob_gap`` below 0.1 and no
   clipped token (the update recomputes the old log-probs). Reports seconds per iteration and
   the peak device memory.
3. ``prm``: ``reward.prm=auto`` (one-operation problems after 150 SFT steps; a PRM labelled on
   16 x 2 samples, trained 30 steps on the device) as ``hybrid.dense_source=prm``, 2 RL iterations in fp32; pass:
   finite metrics,
   ``prm_info.json`` written, PRM rewards placed.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

from creditrl.config import load_config
from creditrl.policy.engines import HFEngine, SamplingParams, StaticEngine
from creditrl.policy.model import load_policy
from creditrl.policy.tokenizer import encode_prompt
from creditrl.tasks import make_task
from creditrl.train.rl import RLTrainer

BASE = [
    "task.args={min_ops: 1, max_ops: 3}",
    "sft.steps=60",
    "sft.batch_size=32",
    "sft.task_args={min_ops: 1, max_ops: 3}",
    "rollout.prompts_per_iter=8",
    "rollout.group_size=8",
    "rollout.max_new_tokens=32",
    "loss.kl_coef=0.05",
    "credit.estimator=gae",
    "value.source=critic",
    "train.iterations=3",
    "train.eval_every=3",
    "train.eval_size=32",
    "train.progress=false",
]


def greedy(device: str) -> dict:
    torch.backends.cuda.matmul.allow_tf32 = False
    model, tok = load_policy("tiny", seed=1)
    task = make_task("arithmetic", min_ops=1, max_ops=3)
    prompts = [encode_prompt(tok, p.prompt) for p in task.sample(32, split="heldout", seed=0)]
    params = SamplingParams(max_new_tokens=24, temperature=0.0)
    ref = StaticEngine(model, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id).generate(prompts, 1, params)
    model.to(device)
    got = HFEngine(model, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id).generate(prompts, 1, params)
    equal = sum(a == b for a, b in zip(ref.tokens, got.tokens))
    gap = max((abs(x - y) for a, b in zip(ref.logprobs, got.logprobs) for x, y in zip(a, b)), default=0.0)
    return {
        "equal_sequences": equal,
        "of": len(prompts),
        "max_logprob_diff": gap,
        "passed": equal == len(prompts) and gap < 1e-3,
    }


def train(device: str, precision: str, root: Path) -> dict:
    os.environ["CREDITRL_CACHE"] = str(root / "cache")
    cfg = load_config(overrides=BASE + [f"policy.device={device}", f"policy.precision={precision}"])
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    trainer = RLTrainer.from_config(cfg, root / f"run-{precision}")
    start = [p.detach().clone().cpu() for p in trainer.parts.model.parameters()]
    began = time.perf_counter()
    history = trainer.run().history
    elapsed = time.perf_counter() - began
    rows = [r for r in history if r["iteration"] > 0]
    numbers = [v for r in history for v in r.values() if isinstance(v, float)]
    out = {
        "iterations": len(rows),
        "s_per_iteration": elapsed / max(1, len(rows)),  # trainer.run() over the iterations: first uses included
        # each iteration's stages (the first iteration carries the first use of the precision's kernels)
        "stages_s": [
            {k[5:]: round(v, 4) for k, v in r.items() if k.startswith("time/") and k != "time/total_s"} for r in rows
        ],
        "finite": all(math.isfinite(v) for v in numbers),
        "float32_weights": all(p.dtype == torch.float32 for p in trainer.parts.model.parameters()),
        "weights_moved": any(
            not torch.equal(a, p.detach().cpu()) for a, p in zip(start, trainer.parts.model.parameters())
        ),
        "on_device": str(next(trainer.parts.model.parameters()).device),
        "eval_accuracy": history[-1].get("eval/accuracy"),
        "sampler_logprob_gap": [r.get("policy/sampler_logprob_gap") for r in rows],
        "clipfrac": [r.get("policy/clipfrac") for r in rows],
        "loss_scale": [r.get("optim/loss_scale") for r in rows],
    }
    if device.startswith("cuda"):
        out["peak_memory_mb"] = torch.cuda.max_memory_allocated() / 2**20
    ok = out["iterations"] == 3 and out["finite"] and out["float32_weights"] and out["weights_moved"]
    if precision != "fp32":
        ok = (
            ok
            and all(g is not None and g < 0.1 for g in out["sampler_logprob_gap"])
            and all(c == 0 for c in out["clipfrac"])
        )
    out["passed"] = ok
    return out


def prm(device: str, root: Path) -> dict:
    os.environ["CREDITRL_CACHE"] = str(root / "cache")
    over = BASE + [
        f"policy.device={device}",
        "train.iterations=2",
        "train.eval_every=2",
        "reward.prm=auto",
        "hybrid.dense_source=prm",
        "hybrid.dense_weight=0.5",
        "credit.estimator=grpo_process",
        "value.source=none",
        "prm.problems=16",
        "prm.samples=2",
        "prm.steps=30",
        # one-operation problems: a short SFT gets some right, so the PRM's labels hold both classes
        "task.args={min_ops: 1, max_ops: 1}",
        "sft.task_args={min_ops: 1, max_ops: 1}",
        "sft.steps=150",
    ]
    trainer = RLTrainer.from_config(load_config(overrides=over), root / "run-prm")
    history = trainer.run().history
    rows = [r for r in history if r["iteration"] > 0]
    info = Path(trainer.cfg.reward.prm) / "prm_info.json"
    out = {
        "iterations": len(rows),
        "finite": all(math.isfinite(v) for r in history for v in r.values() if isinstance(v, float)),
        "placed_per_response": [r["reward/placed_per_response"] for r in rows],
        "prm_heldout_auroc": json.loads(info.read_text()).get("prm/heldout_auroc") if info.exists() else None,
    }
    out["passed"] = (
        len(rows) == 2 and out["finite"] and info.exists() and all(p > 1 for p in out["placed_per_response"])
    )
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print(json.dumps({"error": "torch sees no CUDA device", "torch": torch.__version__}))
        return 2
    out_path = Path(
        args.out
        or (Path(os.environ["OUT"]) / "gpu_train_check.json" if os.environ.get("OUT") else "runs/gpu_train_check.json")
    )
    summary: dict = {"device": args.device, "torch": torch.__version__}
    if args.device.startswith("cuda"):
        summary["gpu"] = torch.cuda.get_device_name(0)
    with tempfile.TemporaryDirectory() as tmp:
        checks = {"greedy": lambda: greedy(args.device)}
        for precision in ("fp32", "bf16", "fp16"):
            checks[f"train_{precision}"] = lambda p=precision: train(args.device, p, Path(tmp))
        checks["prm"] = lambda: prm(args.device, Path(tmp))
        for name, fn in checks.items():
            try:
                summary[name] = fn()
            except Exception as exc:  # a failed check is reported, the others still run
                summary[name] = {"passed": False, "error": f"{type(exc).__name__}: {exc}"}
            print(name, json.dumps(summary[name]), flush=True)
    summary["passed"] = all(v.get("passed") for k, v in summary.items() if isinstance(v, dict))
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(summary, indent=2))
    print(json.dumps({"passed": summary["passed"], "out": str(out_path)}))
    return 0 if summary["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
