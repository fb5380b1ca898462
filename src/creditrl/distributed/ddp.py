"""The data-parallel learner on torch.distributed: process-group set-up from a ``torchrun`` /
``accelerate launch`` environment (both set ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``MASTER_ADDR``, ``MASTER_PORT``), DDP / FSDP2 wrapping, and the few collectives the trainer needs.

Gradients are averaged by DDP (or FSDP2); every other exchange is one ``torch.distributed``
collective. Without a launch (``WORLD_SIZE`` unset or 1) every helper is the identity of the
single-process code path: ``world_size() == 1``, ``rank() == 0``, sums of one rank are the local
value, ``wrap`` returns the module itself.

Global loss denominators: DDP *averages* gradients over the W ranks, so a loss aggregated with a
global denominator D (all-reduced, see :func:`creditrl.train.update.update`) and scaled by W on
every rank gives exactly the gradient of the single-process loss over the union of the ranks'
rows: ``(1/W) sum_r W * sum_{rows of r} l / D = sum_{all rows} l / D``.
"""

from __future__ import annotations

import contextlib
import gc
import math
import os
from collections.abc import Iterable, Iterator, Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from creditrl.config import ConfigError
from creditrl.policy.device import is_fsdp

STRATEGIES = ("ddp", "fsdp")


def launched() -> bool:
    """True inside a multi-process launch (``torchrun`` / ``accelerate launch``): ``WORLD_SIZE`` > 1."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def backend() -> str:
    """gloo for CPU tensors; with CUDA available, NCCL for CUDA tensors and gloo for CPU ones."""
    return "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"


def join_learner_group(cfg: Any) -> int:
    """Under a multi-process launch join the data-parallel process group; returns the number of
    ranks (1 otherwise). Every rank draws the same ``rollout.prompts_per_iter`` problems and
    trains on its own ``prompts_per_iter / W`` whole prompt groups, so the count must divide."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return 1
    if cfg.rollout.prompts_per_iter % world:
        raise ConfigError(
            f"rollout.prompts_per_iter={cfg.rollout.prompts_per_iter} is not divisible by the {world} data-parallel "
            f"ranks (WORLD_SIZE={world}): every rank trains on an equal share of whole prompt groups"
        )
    if cfg.backend.name != "local":
        raise ConfigError(
            f"backend.name={cfg.backend.name} under a {world}-rank torchrun launch is not supported: "
            "use backend.name=local (each rank generates its own share)"
        )
    init_from_env()
    return world_size()


def init_from_env(*, timeout_s: float = 1800.0) -> bool:
    """Join the process group of a launch; returns whether this process is one of several ranks.
    A no-op without a launch (False) and when the group already exists."""
    if not dist.is_available():
        return False
    if dist.is_initialized():
        return dist.get_world_size() > 1
    if not launched():
        return False
    missing = [v for v in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT") if v not in os.environ]
    if missing:
        raise RuntimeError(
            f"WORLD_SIZE={os.environ['WORLD_SIZE']} but {', '.join(missing)} not set: launch with "
            "`torchrun --nproc_per_node N -m creditrl.cli ...` or `accelerate launch`"
        )
    if torch.cuda.is_available() and local_rank() < torch.cuda.device_count():
        torch.cuda.set_device(local_rank())  # this rank's GPU (CUDA tensors of the rank go there)
    dist.init_process_group(backend=backend(), timeout=timedelta(seconds=timeout_s))
    return True


def shutdown() -> None:
    """Leave the process group (if this process joined one), all ranks together. DDP wrappers
    must be gone first (:meth:`creditrl.train.rl.RLTrainer.close` drops them): a DDP reducer that
    outlives the group destroys it when collected, and gloo's destructor then waits for peers
    that have already exited."""
    if dist.is_available() and dist.is_initialized():
        gc.collect()
        dist.barrier()
        dist.destroy_process_group()


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def world_size() -> int:
    return dist.get_world_size() if is_distributed() else 1


def rank() -> int:
    return dist.get_rank() if is_distributed() else 0


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))


def is_main() -> bool:
    return rank() == 0


def barrier() -> None:
    if is_distributed():
        dist.barrier()


@contextlib.contextmanager
def main_first() -> Iterator[None]:
    """Rank 0 runs the block first (e.g. builds a cache), the other ranks after it (and reuse it)."""
    if not is_main():
        barrier()
    try:
        yield
    finally:
        if is_main():
            barrier()


def share(items: Sequence[Any]) -> list[Any]:
    """This rank's contiguous block of ``items`` (whose length must be divisible by the world size)."""
    w, r = world_size(), rank()
    if len(items) % w:
        raise ValueError(f"{len(items)} items cannot be shared equally by {w} ranks")
    k = len(items) // w
    return list(items[r * k : (r + 1) * k])


def _reduce(values: float | Sequence[float] | torch.Tensor, op: dist.ReduceOp) -> Any:
    if not is_distributed():
        return values
    if isinstance(values, torch.Tensor):
        out = values.detach().clone()
        dist.all_reduce(out, op=op)
        return out
    scalar = not isinstance(values, Sequence)
    t = torch.tensor([values] if scalar else list(values), dtype=torch.float64)
    dist.all_reduce(t, op=op)
    out = t.tolist()
    return out[0] if scalar else out


def all_reduce_sum(values: Any) -> Any:
    """Sum over ranks of a float, a sequence of floats (float64 on the wire) or a tensor (a
    reduced copy, same dtype)."""
    return _reduce(values, dist.ReduceOp.SUM)


def all_reduce_max(values: Any) -> Any:
    return _reduce(values, dist.ReduceOp.MAX)


def all_reduce_mean(values: Any) -> Any:
    """Unweighted mean over ranks (use sums of ``weight * x`` and of weights for a weighted one)."""
    total, w = all_reduce_sum(values), world_size()
    return [x / w for x in total] if isinstance(total, list) else total / w


def all_gather_objects(obj: Any) -> list[Any]:
    """Every rank's ``obj`` (picklable), in rank order."""
    if not is_distributed():
        return [obj]
    out: list[Any] = [None] * world_size()
    dist.all_gather_object(out, obj)
    return out


class DataParallel(DistributedDataParallel):
    """:class:`~torch.nn.parallel.DistributedDataParallel` that also answers the wrapped
    module's attributes (``config``, a critic's ``shared``), so code written for the plain model
    (e.g. :func:`creditrl.rollout.batch.response_forward`) runs on the wrapper unchanged."""

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            inner = self.__dict__.get("_modules", {}).get("module")
            if name == "module" or inner is None:
                raise
            return getattr(inner, name)


def wrap(module: nn.Module, *, strategy: str = "ddp") -> nn.Module:
    """The module as the learner of a data-parallel run; ``module`` itself in one process.

    ``ddp``: :class:`DataParallel` (DDP) over the module's trainable parameters, broadcasting
    rank 0's weights once at construction; buffers are not re-broadcast at each forward (they are
    not learned, and ranks run different numbers of forwards per step). The module and its inputs
    already live on this rank's device (CPU, or ``cuda:LOCAL_RANK``).

    ``fsdp`` (``backend.learner=fsdp``): FSDP2 :func:`torch.distributed.fsdp.fully_shard` on every
    transformer block (the classes Hugging Face lists in ``_no_split_modules``) and the root. FSDP
    all-gathers parameters in every forward, so every rank must run the same sequence of forward
    passes: :func:`creditrl.train.update.update` pads the ranks' micro-batch counts to the largest
    with zero-weight passes, and the shared-prompt / plain forward choice of
    :func:`creditrl.rollout.batch.response_forward` agrees across ranks when micro-batches hold
    whole groups of one size. The update trains the sharded copy, and every rank gathers it
    (:func:`full_state_dict`) into the plain model that generates, evaluates and is saved.
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown data-parallel strategy {strategy!r}; valid: {', '.join(STRATEGIES)}")
    if not is_distributed() or not any(p.requires_grad for p in module.parameters()):
        return module
    if strategy == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for block in _blocks(module):
            fully_shard(block)
        fully_shard(module)
        return module
    return DataParallel(module, forward_sync_buffers=False)


def _blocks(module: nn.Module) -> list[nn.Module]:
    """The transformer blocks FSDP shards one by one: the modules whose class a Hugging Face
    model inside ``module`` names in ``_no_split_modules`` (also the backbones of a critic)."""
    names: set[str] = set()
    for m in module.modules():
        names.update(getattr(m, "_no_split_modules", None) or ())
    return [m for m in module.modules() if type(m).__name__ in names]


def full_state_dict(module: nn.Module) -> dict[str, torch.Tensor]:
    """The full (unsharded) state dict of an FSDP2 learner on every rank (a collective: every
    rank calls it), through ``torch.distributed.checkpoint``; the plain state dict otherwise."""
    if not is_fsdp(module):
        return unwrap(module).state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(module, options=StateDictOptions(full_state_dict=True, cpu_offload=False))


def unwrap(module: nn.Module) -> nn.Module:
    """The plain module inside a DDP wrapper (the module itself otherwise)."""
    return module.module if isinstance(module, DistributedDataParallel) else module


@contextlib.contextmanager
def no_sync(modules: Iterable[nn.Module], enabled: bool = True) -> Iterator[None]:
    """Accumulate gradients locally in ``modules`` (no all-reduce in this block's backward):
    DDP's ``no_sync()``, FSDP2's ``set_requires_gradient_sync(False)``; plain modules and
    ``enabled=False`` do nothing. The forward *and* the backward must run inside the block."""
    with contextlib.ExitStack() as stack:
        if enabled:
            for m in modules:
                if isinstance(m, DistributedDataParallel):
                    stack.enter_context(m.no_sync())
                elif is_fsdp(m):
                    m.set_requires_gradient_sync(False)
                    stack.callback(m.set_requires_gradient_sync, True)
        yield


def batch_whitening(advantages: torch.Tensor, mask: torch.Tensor, eps: float) -> torch.Tensor:
    """``(A - mean) / (std + eps)`` over the valid tokens of *every* rank's batch (sample std,
    n - 1), 0 on masked tokens: the ``batch`` normaliser of the union of the ranks' rows.

    Three float64 all-reduces: the count and sum (a first mean), the residual sum (the mean's
    one-step refinement, as :func:`creditrl.credit.estimators.group_mean` does) and the sum of
    squared deviations. Every rank must call it, also one with no rows.
    """
    x = advantages.double()
    m = mask.to(x.dtype)
    n, s = all_reduce_sum([float(m.sum()), float((x * m).sum())])
    first = s / max(1.0, n)
    mean = first + all_reduce_sum(float(((x - first) * m).sum())) / max(1.0, n)
    ss = all_reduce_sum(float((((x - mean) * m) ** 2).sum()))
    std = math.sqrt(ss / max(1.0, n - 1))
    out = (x - mean) / (std + eps)
    return torch.where(mask, out.to(advantages.dtype), 0)


def reduce_metrics(
    row: dict[str, Any],
    *,
    counts: dict[str, float] | None = None,
    sums: Iterable[str] = (),
    maxes: Iterable[str] = (),
    mins: Iterable[str] = (),
    same: Iterable[str] = (),
) -> dict[str, Any]:
    """Every rank's metric ``row`` -> one row for the union of the ranks' batches (the same on
    every rank; ``row`` itself in one process).

    Per key: ``sums`` add up (counts), ``maxes`` / ``mins`` take the extreme (wall times, largest
    magnitudes), ``same`` are already equal on every rank (rank 0's value); ``P/std`` with a
    ``P/mean`` in the row is the pooled sample standard deviation of the ranks' (mean, std, count)
    and every other number is a weighted mean. The weight of ``P/...`` is ``counts[P]`` (e.g. the
    valid tokens behind ``adv/*``), else ``counts[""]``, else 1. Keys ending ``/abs_max`` and
    starting ``time/`` default to the maximum. Non-numbers are taken from rank 0.
    """
    if not is_distributed():
        return row
    gathered = all_gather_objects((row, counts or {}))
    rows = [r for r, _ in gathered]
    rank_counts = [c for _, c in gathered]
    sums, maxes, mins, same = set(sums), set(maxes), set(mins), set(same)
    out: dict[str, Any] = {}

    def weights(key: str) -> list[float]:
        prefix = key.rsplit("/", 1)[0] if "/" in key else ""
        return [float(c.get(prefix, c.get("", 1.0))) for c in rank_counts]

    for key, value in row.items():
        values = [r.get(key) for r in rows]
        first = rows[0].get(key, value)
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            out[key] = first
            continue
        if key in same:
            out[key] = first
        elif key in sums:
            out[key] = type(value)(sum(values)) if isinstance(value, int) else float(sum(values))
        elif key in mins:
            out[key] = min(values)
        elif key in maxes or key.endswith("/abs_max") or key.startswith("time/"):
            out[key] = max(values)
        elif key.endswith("/std") and key[: -len("std")] + "mean" in row:
            mean_key = key[: -len("std")] + "mean"
            ns = weights(key)
            ms = [float(r[mean_key]) for r in rows]
            n = sum(ns)
            grand = sum(k * m for k, m in zip(ns, ms)) / n if n else 0.0
            ss = sum((k - 1) * float(s) ** 2 + k * (m - grand) ** 2 for k, s, m in zip(ns, values, ms) if k > 0)
            out[key] = math.sqrt(ss / (n - 1)) if n > 1 else 0.0
        else:
            ws = weights(key)
            total = sum(ws)
            out[key] = (
                sum(w * float(v) for w, v in zip(ws, values)) / total if total else float(sum(values) / len(values))
            )
    return out
