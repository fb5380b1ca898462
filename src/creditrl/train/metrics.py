"""The RL iteration's metric row helpers: pass@k of the sampled groups, masked statistics, and
the reduction of every data-parallel rank's row to the row of the whole batch."""

from __future__ import annotations

from typing import Any

import torch

from creditrl.distributed import ddp
from creditrl.sandbox.passk import mean_pass_at_k


def reduce_row(row: dict[str, Any], upd: dict[str, float], rows: int, tokens: int) -> dict[str, Any]:
    """Data-parallel: every rank's metric row -> the row of the union of their batches (``row``
    itself in one process). Counts add up, response means are weighted by the rows and token
    statistics (``adv/*``, ``return/*``, ``value/*``) by the valid tokens, stds are pooled, wall
    times and largest magnitudes take the maximum; the update's metrics and the ``*/total``
    counters are already global."""
    return ddp.reduce_metrics(
        row,
        counts={"": rows, "adv": tokens, "return": tokens, "value": tokens},
        sums={"reward/errors", "reward/filtered", "tokens/generated", "tokens/padded",
              "value/mc_states", "value/mc_tokens", "value/tree_nodes"},
        mins={"train/pass_k"},
        same={*upd, "iteration", "credit/lam", "optim/lr", "policy/updated", "samples/total", "tokens/total"},
    )


def pass_at_k_metrics(group_ids: torch.Tensor, outcome: torch.Tensor) -> dict[str, float]:
    """Unbiased pass@k (Chen et al. 2021) of the sampled groups, for k = 1 and k = the smallest
    group's size: ``train/pass@1``, ``train/pass@k`` and ``train/pass_k`` (= that k)."""
    counts = [(int((group_ids == g).sum()), int(outcome[group_ids == g].sum())) for g in group_ids.unique()]
    k = min(n for n, _ in counts)
    return {"train/pass@1": mean_pass_at_k(counts, 1), "train/pass@k": mean_pass_at_k(counts, k), "train/pass_k": k}


def masked_stats(prefix: str, x: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """Mean, std and largest magnitude of ``x`` (B, T) over the valid tokens of ``mask``."""
    v = x[mask]
    return {
        f"{prefix}/mean": float(v.mean()) if v.numel() else 0.0,
        f"{prefix}/std": float(v.std()) if v.numel() > 1 else 0.0,
        f"{prefix}/abs_max": float(v.abs().max()) if v.numel() else 0.0,
    }
