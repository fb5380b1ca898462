"""What ``optim.skip_zero_advantage_kl`` changes: the update's gradient with and without the
zero-advantage rows' KL term, on the batches a real run trains on.

With a KL term a row whose advantages are all 0 still has the KL's gradient, so leaving it out
of the forward/backward is an approximation. At chosen iterations of a run, the update is taken
twice on copies of the policy from the same batch -- every row (exact), and the zero-advantage
rows left out (approximate) -- with a zero learning rate and no clipping, and the two gradients
are compared: cosine, relative distance ``|g_approx - g_exact| / |g_exact|``, the share of rows
left out, and the two update times. The run itself trains exactly.
"""

from __future__ import annotations

import copy
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from creditrl.config import Config
from creditrl.train import stages
from creditrl.train.rl import RLTrainer
from creditrl.train.update import update


def _gradient(parts: Any, batch, scored, advantages, ref_logprobs, cfg: Config, skip_kl: bool) -> tuple:
    model = copy.deepcopy(parts.model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    changed = cfg.updated({"optim": {"grad_clip": 1e30, "skip_zero_advantage_kl": skip_kl}})
    mask = batch.response_mask & scored.keep[:, None]
    start = time.perf_counter()
    logs = update(
        model, optimizer, batch, advantages, mask, changed, torch.Generator().manual_seed(0), ref_logprobs=ref_logprobs
    )
    elapsed = time.perf_counter() - start
    grad = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    return grad, elapsed, logs


def kl_skip_effect(cfg: Config, init_path: str, iterations: int, at: tuple[int, ...]) -> dict[str, Any]:
    """Run ``iterations`` of ``cfg`` (KL on) from ``init_path``; at the iterations in ``at``
    (0-based) compare the exact and approximate update gradients (see the module docstring)."""
    if cfg.loss.kl_coef <= 0:
        raise ValueError("kl_skip_effect: the config has no KL term (loss.kl_coef = 0)")
    rows: list[dict[str, float]] = []
    real_learn = stages.learn
    current = {"it": -1}

    def learn(parts, batch, scored, adv, ret, values, ref_logp, gen, *, train_policy):
        if current["it"] in at and train_policy:
            exact, t_exact, _ = _gradient(parts, batch, scored, adv, ref_logp, parts.config, False)
            approx, t_approx, logs = _gradient(parts, batch, scored, adv, ref_logp, parts.config, True)
            rows.append(
                {
                    "iteration": current["it"],
                    "cosine": float(torch.nn.functional.cosine_similarity(exact, approx, dim=0)),
                    "relative_distance": float((approx - exact).norm() / exact.norm().clamp_min(1e-30)),
                    "skipped_rows": logs.get("update/skipped_rows", 0.0),
                    "update_s_exact": t_exact,
                    "update_s_approx": t_approx,
                }
            )
        return real_learn(parts, batch, scored, adv, ret, values, ref_logp, gen, train_policy=train_policy)

    with tempfile.TemporaryDirectory(prefix="creditrl-klskip-") as run_dir:
        trainer = RLTrainer.from_config(cfg, Path(run_dir), init_path=init_path)
        stages.learn = learn
        try:
            for it in range(iterations):
                current["it"] = it
                trainer.iteration(it)
        finally:
            stages.learn = real_learn
    summary = {
        k: statistics.median(r[k] for r in rows)
        for k in ("cosine", "relative_distance", "skipped_rows", "update_s_exact", "update_s_approx")
    }
    return {"rows": rows, "median": summary}
