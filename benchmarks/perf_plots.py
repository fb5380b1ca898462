"""``benchmarks/performance.py``'s plots: tokens/s against generated length and against model size."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def _plot(
    series: dict[str, tuple[list[float], list[float]]], ticks: dict[float, str], path: Path, xlabel: str, title: str
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for label, (xs, ys) in series.items():
        if xs:
            ax.plot(xs, ys, marker="o", label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xticks(list(ticks), list(ticks.values()))
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    ax.set_xlabel(xlabel)
    ax.set_ylabel("generated tokens / s")
    ax.set_title(title)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _series(points: list[dict[str, Any]], x: str) -> dict[str, tuple[list[float], list[float]]]:
    def pick(group: str, key: str) -> tuple[list[float], list[float]]:
        ps = [p for p in points if key in p[group]]
        return [p[x] for p in ps], [p[group][key]["median"] for p in ps]

    return {
        "creditrl decode (StaticEngine)": pick("decode", "creditrl_tokens_per_s"),
        "HF generate": pick("decode", "hf_generate_tokens_per_s"),
        "creditrl GRPO iteration": pick("iteration", "creditrl_tokens_per_s"),
        "TRL GRPOTrainer iteration": pick("iteration", "trl_tokens_per_s"),
    }


def plot_lengths(res: dict[str, Any], path: Path) -> None:
    ticks = {p["length"]: f"{p['length']:,}" for p in res["lengths"]}
    title = "Tokens/s against generated length"
    _plot(_series(res["lengths"], "length"), ticks, path, "generated length (tokens)", title)


def plot_sizes(res: dict[str, Any], path: Path) -> None:
    ticks = {p["parameters"]: f"{p['size']['name']}\n{p['parameters'] / 1e6:.2f}M" for p in res["sizes"]}
    _plot(_series(res["sizes"], "parameters"), ticks, path, "parameters", "Tokens/s against model size")
