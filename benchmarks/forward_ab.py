"""The packed response forward against the HF modules' pass, on a real rollout batch.

The reference log-probs (no gradient) and the update's forward + backward are timed both ways,
interleaved, on the same batch: the packed pass (:mod:`creditrl.rollout.packed`, the default
``policy.forward=auto``) and the HF pass (``policy.forward=hf``). Also the largest absolute
difference of the log-probs over the real response tokens and the relative distance of the
gradients -- the float rounding the packed pass is held to.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from creditrl.config import Config
from creditrl.rollout.batch import response_logprobs
from creditrl.train.rl import RLTrainer


def _timed(fn, repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return out


def forward_ab(cfg: Config, init_path: str, repeats: int = 3) -> dict[str, Any]:
    """Times and agreement of the two passes on iteration 0's rollout batch of ``cfg``."""
    with tempfile.TemporaryDirectory(prefix="creditrl-forward-") as run_dir:
        trainer = RLTrainer.from_config(cfg, Path(run_dir), init_path=init_path)
        batch = trainer._rollout(0, torch.Generator().manual_seed(cfg.train.seed))
    model = trainer.parts.model
    mask = batch.response_mask
    weights = torch.randn(mask.shape, generator=torch.Generator().manual_seed(0)) * mask

    def infer(packed: bool) -> torch.Tensor:
        model.eval()
        with torch.inference_mode():
            return response_logprobs(model, batch, packed=packed)

    def train(packed: bool) -> list[torch.Tensor]:
        model.train()
        model.zero_grad(set_to_none=True)
        (response_logprobs(model, batch, packed=packed) * weights).sum().backward()
        return [p.grad.clone() for p in model.parameters() if p.grad is not None]

    logp = {k: infer(k) for k in (True, False)}  # also the warm-up
    grads = {k: torch.cat([g.flatten() for g in train(k)]) for k in (True, False)}
    times: dict[str, list[float]] = {"infer_packed": [], "infer_hf": [], "train_packed": [], "train_hf": []}
    for _ in range(repeats):
        times["infer_packed"] += _timed(lambda: infer(True), 1)
        times["infer_hf"] += _timed(lambda: infer(False), 1)
        times["train_packed"] += _timed(lambda: train(True), 1)
        times["train_hf"] += _timed(lambda: train(False), 1)
    med = {k: statistics.median(v) for k, v in times.items()}
    return {
        "rows": batch.size,
        "response_tokens": int(mask.sum()),
        "padded_positions": int(batch.prompt_ids.numel() + batch.response_ids.numel()),
        "median_s": med,
        "speedup_infer": med["infer_hf"] / med["infer_packed"],
        "speedup_train": med["train_hf"] / med["train_packed"],
        "max_abs_logprob_diff": float((logp[True] - logp[False]).abs()[mask].max()),
        "grad_relative_distance": float((grads[True] - grads[False]).norm() / grads[False].norm().clamp_min(1e-30)),
    }
