"""What the speed benchmarks share: the spread of repeated timings, peer / creditrl ratios, a timed
log, the JSON a benchmark keeps, and the machine's limits they measure against (the fp32 matmul peak,
by the faster of torch's and oneDNN's products, and a STREAM-style copy bandwidth).

The benchmarks are scripts (``python benchmarks/<name>.py``), not part of the package; their
modules import each other by name, as the script's own folder is on ``sys.path``."""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch


def spread(xs: list[float]) -> dict[str, float]:
    return {"min": min(xs), "median": statistics.median(xs), "max": max(xs), "n": len(xs)}


def median_ratio(peer: list[float], ours: list[float]) -> float:
    """Peer / creditrl median seconds: creditrl's speed-up."""
    return statistics.median(peer) / statistics.median(ours)


def log_fn(name: str, start: float) -> Callable[[str], None]:
    """A ``log(msg)`` printing ``[name] <seconds since start> s  msg``."""

    def log(msg: str) -> None:
        print(f"[{name}] {time.time() - start:6.0f} s  {msg}", flush=True)

    return log


def write_json(path: Path, result: dict[str, Any], indent: int = 2) -> None:
    """A benchmark's result as JSON (paths and other objects as strings)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=indent, default=str))


def matmul_peak(n: int, repeats: int = 5) -> dict[str, Any]:
    """fp32 GFLOP/s of an n x n x n matmul, per repeat, by torch's ``@`` (MKL here) and, where this
    torch has it, oneDNN's linear: the spread of the faster library (``library``), and each
    library's best in ``by_library`` (on this machine's AMD cores oneDNN's is the higher)."""
    from creditrl.policy.engines.decoder import onednn_available, onednn_linear

    a, b = torch.randn(n, n), torch.randn(n, n)
    products: dict[str, Callable[[], Any]] = {"torch": lambda: a @ b}
    if onednn_available():
        products["onednn"] = lambda: onednn_linear(a, b, None)
    found = {}
    with torch.inference_mode():
        for name, product in products.items():
            product()
            rates = []
            for _ in range(repeats):
                start = time.perf_counter()
                product()
                rates.append(2 * n**3 / (time.perf_counter() - start) / 1e9)
            found[name] = spread(rates)
    best = max(found, key=lambda k: found[k]["max"])
    return {**found[best], "library": best, "by_library": {k: v["max"] for k, v in found.items()}}


def copy_bandwidth(mb: int, repeats: int) -> dict[str, float]:
    """STREAM-style copy: ``dst.copy_(src)`` of an ``mb`` MB fp32 buffer; GB/s with bytes moved =
    2 x size (read + write), per repeat (after one untimed copy)."""
    src = torch.rand(mb * 2**20 // 4)
    dst = torch.empty_like(src)
    dst.copy_(src)
    rates = []
    for _ in range(repeats):
        start = time.perf_counter()
        dst.copy_(src)
        rates.append(2 * src.numel() * 4 / (time.perf_counter() - start) / 1e9)
    return spread(rates)
