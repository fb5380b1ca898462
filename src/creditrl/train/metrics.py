"""The RL iteration's metrics: the per-stage timer, the record of one iteration's tensors, the row
``metrics.jsonl`` holds, and the reduction of every data-parallel rank's row to the whole batch's.

Metric names are grouped with prefixes: ``reward/``, ``train/`` (the sampled batch's accuracy
and pass@k), ``response/``, ``tokens/``, ``adv/``, ``return/``, ``value/``, ``credit/``,
``optim/``, ``policy/``, ``loss/``, ``kl/``, ``grad/``, ``update/``, ``time/`` (seconds per
stage and in total), ``samples/`` and ``eval/``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from creditrl.distributed import ddp
from creditrl.losses import explained_variance
from creditrl.rewards.stage import Scored
from creditrl.rollout.batch import TrajectoryBatch
from creditrl.sandbox.passk import mean_pass_at_k
from creditrl.train.outcomes import pack_outcomes, unpack_outcomes  # noqa: F401  (re-exported)
from creditrl.train.stages import generated_tokens
from creditrl.values.stage import ValueOut

STAGE_LABEL = "creditrl/"  # each stage is a ``torch.profiler`` range named STAGE_LABEL + stage


class StageTimer:
    """Wall time per stage: ``with timer("rollout"): ...``; ``times`` maps stage -> seconds. Each
    stage is also a ``torch.profiler.record_function`` range (``creditrl/rollout``, ...), so a
    profile of training attributes every op to its stage (nearly free when no profiler runs)."""

    def __init__(self) -> None:
        self.times: dict[str, float] = {}

    @contextmanager
    def __call__(self, stage: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            with torch.profiler.record_function(STAGE_LABEL + stage):
                yield
        finally:
            self.times[stage] = self.times.get(stage, 0.0) + time.perf_counter() - start

    @property
    def total(self) -> float:
        return sum(self.times.values())


@dataclass
class IterationRecord:
    """What the stages of one iteration produced (the tensors are (B, T) over the responses)."""

    iteration: int  # 1-based: the metrics.jsonl row
    batch: TrajectoryBatch
    scored: Scored
    values: ValueOut
    advantages: torch.Tensor
    returns: torch.Tensor
    update: dict[str, float]  # the update stage's metrics (already global over the ranks)
    lr: float
    lam: float
    policy_updated: bool  # False during the critic warm-up
    stats: dict[str, float] = field(default_factory=dict)  # backend statistics (Ray restarts, sync time)

    @property
    def mask(self) -> torch.Tensor:
        """bool (B, T): the tokens trained on (responses the error policy or the filter dropped are out)."""
        return self.batch.response_mask & self.scored.keep[:, None]


def masked_stats(prefix: str, x: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """Mean, std and largest magnitude of ``x`` (B, T) over the valid tokens of ``mask``."""
    v = x[mask]
    return {
        f"{prefix}/mean": float(v.mean()) if v.numel() else 0.0,
        f"{prefix}/std": float(v.std()) if v.numel() > 1 else 0.0,
        f"{prefix}/abs_max": float(v.abs().max()) if v.numel() else 0.0,
    }


def pass_at_k_metrics(group_ids: torch.Tensor, outcome: torch.Tensor) -> dict[str, float]:
    """Unbiased pass@k (Chen et al. 2021) of the sampled groups, for k = 1 and k = the smallest
    group's size: ``train/pass@1``, ``train/pass@k`` and ``train/pass_k`` (= that k)."""
    counts = [(int((group_ids == g).sum()), int(outcome[group_ids == g].sum())) for g in group_ids.unique()]
    k = min(n for n, _ in counts)
    return {"train/pass@1": mean_pass_at_k(counts, 1), "train/pass@k": mean_pass_at_k(counts, k), "train/pass_k": k}


def zero_spread_share(seq_reward: torch.Tensor, group_ids: torch.Tensor, keep: torch.Tensor) -> float:
    """The share of groups whose kept responses' sequence rewards (B,) all lie within 1e-6 of each
    other (a group of one kept response counts): groups a group-relative estimator gives no
    advantage, so no learning signal (``reward/zero_spread_groups``; 1.0 when nothing was kept)."""
    groups = [seq_reward[keep & (group_ids == g)] for g in group_ids[keep].unique()]
    flat = [float(r.max() - r.min()) <= 1e-6 for r in groups]
    return sum(flat) / len(flat) if flat else 1.0


def _batch_metrics(rec: IterationRecord) -> dict[str, Any]:
    batch, scored = rec.batch, rec.scored
    seq_reward = (scored.rewards * batch.response_mask).sum(-1)
    return {
        "reward/mean": float(seq_reward.mean()),
        "reward/std": float(seq_reward.std()) if batch.size > 1 else 0.0,
        "reward/zero_spread_groups": zero_spread_share(seq_reward, batch.group_ids, scored.keep),
        "reward/placed_per_response": float(scored.reward_mask.sum(-1).float().mean()),
        "reward/errors": scored.errors,
        **{f"reward/errors/{name}": n for name, n in sorted(scored.counts.errors.items())},
        **{f"reward/timeouts/{name}": n for name, n in sorted(scored.counts.timeouts.items())},
        "reward/filtered": scored.filtered,
        **scored.stats,
        "train/accuracy": float(scored.outcome.mean()),
        **pass_at_k_metrics(batch.group_ids, scored.outcome),
        "train/step_accuracy": float(scored.step_correct.mean()),
        "response/length": float(batch.response_lengths.float().mean()),
        "response/truncated": float((~batch.finished).float().mean()),
        "tokens/generated": generated_tokens(batch),  # a tree's shared segments counted once
        "tokens/padded": batch.size * (batch.prompt_ids.shape[1] + batch.response_ids.shape[1]),
        "tokens/prompt": int(batch.prompt_mask.sum()),  # every row's real prompt tokens (no padding)
    }


def first_rows(group_ids: torch.Tensor, n: int) -> list[int]:
    """``n`` row indices of a batch, deterministic: the first row of each group (groups in the
    order they first appear), then each group's second row, and so on. group_ids long (B,)."""
    order: dict[int, int] = {}  # group id -> the order of its first appearance
    count: dict[int, int] = {}  # group id -> rows seen so far
    ranked = []
    for row, g in enumerate(group_ids.tolist()):
        order.setdefault(g, len(order))
        count[g] = count.get(g, 0) + 1
        ranked.append((count[g], order[g], row))  # (place in its group, group order, row)
    return [row for *_, row in sorted(ranked)[:n]]


def sample_completions(rec: IterationRecord, n: int) -> list[dict[str, Any]]:
    """``n`` completions of the iteration (:func:`first_rows`; ``train.log_completions``), each
    with its prompt, completion text, sequence reward (the placed rewards summed over the response,
    as ``reward/mean`` averages them) and mean advantage over its trained tokens (0 for a row the
    error policy or the filter dropped). On this rank's rows."""
    if n == 0:
        return []
    problems, texts = rec.batch.extras.get("problems"), rec.batch.extras.get("completions")
    seq_reward = (rec.scored.rewards * rec.batch.response_mask).sum(-1)
    mask = rec.mask
    out = []
    for row in first_rows(rec.batch.group_ids, n):
        adv = rec.advantages[row][mask[row]]
        out.append(
            {
                "iteration": rec.iteration,
                "row": row,
                "group": int(rec.batch.group_ids[row]),
                "reward": float(seq_reward[row]),
                "advantage": float(adv.mean()) if adv.numel() else 0.0,
                "prompt": problems[row].prompt if problems else "",
                "completion": texts[row] if texts else "",
            }
        )
    return out


def iteration_row(rec: IterationRecord, times: dict[str, float], totals: dict[str, float]) -> dict[str, Any]:
    """The metrics row of one iteration on this rank (see :func:`reduce_row` for the batch's)."""
    mask = rec.mask
    row: dict[str, Any] = {
        "iteration": rec.iteration,
        **_batch_metrics(rec),
        **masked_stats("adv", rec.advantages, mask),
        **masked_stats("return", rec.returns, mask),
        "credit/lam": rec.lam,
        "optim/lr": rec.lr,
        "policy/updated": float(rec.policy_updated),
        **rec.update,
        **rec.values.stats,
    }
    if rec.values.values is not None:
        row.update(masked_stats("value", rec.values.values, mask))
        row["value/explained_variance"] = explained_variance(rec.values.values, rec.returns, mask)
    row.update({f"time/{stage}_s": seconds for stage, seconds in times.items()})
    row.update(
        {
            "time/iter_s": sum(times.values()),
            "samples/total": totals["samples"],
            "tokens/total": totals["tokens"],
            "time/total_s": totals["time_s"],
            **rec.stats,
        }
    )
    return reduce_row(row, rec.update, rec.batch.size, int(mask.sum()))


def reduce_row(row: dict[str, Any], upd: dict[str, float], rows: int, tokens: int) -> dict[str, Any]:
    """Data-parallel: every rank's metric row -> the row of the union of their batches (``row``
    itself in one process). Counts add up, response means are weighted by the rows and token
    statistics (``adv/*``, ``return/*``, ``value/*``) by the valid tokens, stds are pooled, wall
    times and largest magnitudes take the maximum; the update's metrics and the ``*/total``
    counters are already global."""
    return ddp.reduce_metrics(
        row,
        counts={"": rows, "adv": tokens, "return": tokens, "value": tokens},
        sums={
            "reward/errors",
            *(k for k in row if k.startswith(("reward/errors/", "reward/timeouts/"))),
            "reward/filtered",
            "tokens/generated",
            "tokens/padded",
            "tokens/prompt",
            "value/mc_states",
            "value/check_errors",
            "value/check_timeouts",
            "value/mc_tokens",
            "value/tree_nodes",
        },
        mins={"train/pass_k"},
        same={*upd, "iteration", "credit/lam", "optim/lr", "policy/updated", "samples/total", "tokens/total"},
    )


def progress_line(row: dict[str, Any], iterations: int) -> str:
    """One plain line per iteration, for a log that is not a terminal (no carriage returns)."""
    parts = [
        f"iteration {row['iteration']}/{iterations}",
        f"reward {row['reward/mean']:.3f}",
        f"train accuracy {row.get('train/accuracy', float('nan')):.3f}",
    ]
    if "eval/accuracy" in row:
        parts.append(f"held-out accuracy {row['eval/accuracy']:.3f}")
    parts.append(f"{row.get('time/iter_s', 0.0):.2f} s")
    return "creditrl: " + ", ".join(parts)
