"""Section g of `benchmarks/performance.py`: where an iteration's time goes, by stage and by the
kind of work -- the profile behind the points that miss their targets.

A few iterations of a workload run under ``torch.profiler``; every op is attributed to the stage
whose ``creditrl/<stage>`` range holds it (:class:`~creditrl.train.metrics.StageTimer`), and its
own time (not its children's) to one kind:

- ``products``: the matrix products (``aten::mm``, ``addmm``, ``bmm``, ..., oneDNN's linear);
- ``attention``: PyTorch's scaled-dot-product attention kernels, forward and backward;
- ``other ops``: every other PyTorch op (elementwise, norms, indexing, copies, the optimizer's);
- ``outside ops``: the rest of the stage -- Python, the autograd engine's own work and the numba
  decode kernels, which run outside PyTorch's ops.

The profiler adds a few microseconds to every op, so the profiled iterations run slower than
unprofiled ones; the section states both.
"""

from __future__ import annotations

import statistics
import tempfile
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch.profiler import ProfilerActivity, profile

from creditrl.config import Config
from creditrl.train.metrics import STAGE_LABEL

KINDS = ("products", "attention", "other ops", "outside ops")
PRODUCT_OPS = frozenset(
    {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::mv", "aten::addmv", "mkldnn::_linear_pointwise"}
)
TORCH_OP_PREFIXES = ("aten::", "mkldnn::", "prim::", "quantized::")


def op_kind(name: str) -> str:
    """The kind of work of a profiler event named ``name`` (one of :data:`KINDS`)."""
    if name in PRODUCT_OPS:
        return "products"
    if "scaled_dot_product" in name:
        return "attention"
    if name.startswith(TORCH_OP_PREFIXES):
        return "other ops"
    return "outside ops"


def _stage_of(event: Any) -> str | None:
    while event is not None:
        if event.name.startswith(STAGE_LABEL):
            return event.name[len(STAGE_LABEL) :]
        event = event.cpu_parent
    return None


def tally(events: list[Any], acc: dict[str, dict[str, Any]] | None = None) -> dict[str, dict[str, Any]]:
    """Add ``events``' seconds into ``acc`` (a new one by default), per stage: the stage ranges'
    ``wall``, each kind's own time (the events' own times, so nothing is counted twice; the stage
    range's own time is ``outside ops``) and each op's (``ops``, every kind but ``outside ops``)."""
    acc = {} if acc is None else acc
    for e in events:
        stage = _stage_of(e)
        if stage is None:
            continue
        s = acc.setdefault(stage, {"wall": 0.0, **dict.fromkeys(KINDS, 0.0), "ops": defaultdict(float)})
        own = e.self_cpu_time_total / 1e6
        if e.name == STAGE_LABEL + stage:
            s["wall"] += e.cpu_time_total / 1e6
        kind = op_kind(e.name)
        s[kind] += own
        if kind != "outside ops":
            s["ops"][e.name] += own
    return acc


def per_iteration(acc: dict[str, dict[str, Any]], iterations: int) -> dict[str, dict[str, Any]]:
    """:func:`tally`'s sums as seconds per iteration, with each stage's five longest ops."""
    out: dict[str, dict[str, Any]] = {}
    for stage, s in acc.items():
        if s["wall"] <= 0:
            continue
        top = sorted(s["ops"].items(), key=lambda kv: -kv[1])[:5]
        out[stage] = {
            "wall_s": s["wall"] / iterations,
            **{k: s[k] / iterations for k in KINDS},
            "top_ops": [[name, sec / iterations] for name, sec in top],
        }
    return out


def profile_iterations(cfg: Config, init: str, warmup: int, iterations: int) -> dict[str, Any]:
    """``warmup`` unprofiled iterations of ``cfg`` from ``init``, then ``iterations`` more, each under
    its own profiler (the events of several long iterations at once took over 15 GB): the stage
    split (:func:`tally`, :func:`per_iteration`) and the unprofiled iterations' median seconds."""
    from creditrl.train.rl import RLTrainer

    acc: dict[str, dict[str, Any]] = {}
    rows = []
    with tempfile.TemporaryDirectory(prefix="creditrl-profile-") as run_dir:
        trainer = RLTrainer.from_config(cfg, Path(run_dir), init_path=init)
        plain = [trainer.iteration(i)["time/iter_s"] for i in range(warmup)]
        for i in range(warmup, warmup + iterations):
            with profile(activities=[ProfilerActivity.CPU]) as prof:  # with_flops (shapes) would add 6-17%
                rows.append(trainer.iteration(i))
            tally(prof.events(), acc)
            del prof
    return {
        "iterations": iterations,
        "plain_iter_s": statistics.median(plain[1:] or plain),
        "profiled_iter_s": statistics.median(r["time/iter_s"] for r in rows),
        "stages": per_iteration(acc, iterations),
    }


def profile_workloads(opts: Any, threads: int, log: Callable[[str], None]) -> dict[str, Any]:
    """Section g: the study's arith.yaml iteration (KL on) and the GRPO iteration of every length
    and size point of sections a and b, each profiled by stage and kind of work."""
    from bench import bench_config
    from creditrl.config.loader import packaged_config
    from creditrl.policy.model import load_policy
    from perf_points import can_stop, length_policy, point_settings, save_never_eos_model
    from perf_study import study_overrides_of, study_start

    out: dict[str, Any] = {}
    overrides = [o for o in study_overrides_of(opts, "arith", threads) if not o.startswith("train.iterations=")]
    cfg, start = study_start("arith", [*overrides, "train.eval_every=100000"])
    out["study arith"] = profile_iterations(cfg, start, opts.profile_warmup, opts.profile_iterations)
    with tempfile.TemporaryDirectory(prefix="creditrl-profile-models-") as tmp:
        policy = length_policy(opts, Path(tmp)) if opts.lengths else ""
        points = [(f"length {n:,}", policy, n) for n in opts.lengths]
        for size in opts.sizes:
            path = save_never_eos_model(size, Path(tmp) / size.name, opts.seed)
            points.append((f"size {size.name}", str(path), opts.size_length))
        for label, start, length in points:
            model, tok = load_policy(start)
            point = point_settings(start, length, opts, can_stop(model, tok))
            del model
            cfg = bench_config(point["settings"], point["overrides"], packaged_config("chain"))
            out[label] = profile_iterations(cfg, start, opts.profile_warmup, opts.profile_iterations)
    for label, r in out.items():
        parts = ", ".join(
            f"{stage} {s['wall_s']:.3f} s ({100 * s['products'] / s['wall_s']:.0f}% products)"
            for stage, s in r["stages"].items()
        )
        log(
            f"profile/{label}: {r['plain_iter_s']:.3f} s per iteration ({r['profiled_iter_s']:.3f} s profiled): {parts}"
        )
    return out


def _share(part: float, whole: float) -> str:
    return f"{part:.3f} ({100 * part / whole:.0f}%)" if whole > 0 else f"{part:.3f}"


def profile_lines(profiles: dict[str, Any]) -> list[str]:
    """Section g of the page: per workload and stage (those of at least 1% of the iteration), the
    seconds of each kind of work and the ops that took longest."""
    lines = [
        "## g. Where the time goes",
        "",
        "Each workload's iterations under `torch.profiler` (after unprofiled warm-up iterations): every op's own "
        "time, by the stage holding it and by kind -- *products* (`aten::mm`, `addmm`, `bmm`, oneDNN's linear), "
        "*attention* (PyTorch's scaled-dot-product kernels, forward and backward), *other ops* (every other "
        "PyTorch op: elementwise, norms, indexing, copies, the optimizer's) and *outside ops* (the rest of the "
        "stage: Python, the autograd engine and the numba decode kernels). Seconds per iteration. *study arith* "
        "is arith.yaml (KL on, no evaluation); the length and size points are sections a's and b's GRPO iterations.",
        "",
        "| workload | iteration s: plain / profiled | stage | stage s | products | attention | other ops | "
        "outside ops | longest ops |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for label, r in profiles.items():
        total = sum(s["wall_s"] for s in r["stages"].values())
        for stage, s in r["stages"].items():
            if s["wall_s"] < 0.01 * total:
                continue
            top = ", ".join(f"{name.split('::')[-1]} {sec:.3f}" for name, sec in s["top_ops"][:3])
            lines.append(
                f"| {label} | {r['plain_iter_s']:.3f} / {r['profiled_iter_s']:.3f} | {stage} | {s['wall_s']:.3f} | "
                f"{_share(s['products'], s['wall_s'])} | {_share(s['attention'], s['wall_s'])} | "
                f"{_share(s['other ops'], s['wall_s'])} | {_share(s['outside ops'], s['wall_s'])} | {top} |"
            )
    return lines
