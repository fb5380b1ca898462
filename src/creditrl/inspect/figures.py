"""PNG figures of the inspector for papers: a group's token credit per estimator, and the metrics.

``credit_figure`` draws one group's responses as rows of token cells coloured by advantage on
the page's diverging scale (blue < 0, white at 0, red > 0, symmetric: ``RdBu_r`` over
``[-max|A|, max|A|]``), a bar after each step end, a dot over each placed reward, the oracle
step label (a green tick or red cross) after each step, and the outcome at the row's start.
``metrics_figure`` draws the page's per-iteration charts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; no display on servers or in CI
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.colors import Normalize  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402

MAX_CELLS = 90  # token cells drawn per response; longer responses end in an ellipsis


def _cells(response: dict[str, Any]) -> list[tuple[int, str]]:
    """(token index, shown text) per drawn cell."""
    out = []
    for i, text in enumerate(response["texts"][:MAX_CELLS]):
        shown = response["special"].get(str(i), text)
        out.append((i, shown.replace("\n", "⏎") or "·"))
    return out


def credit_figure(group: dict[str, Any], adv: list[list[float]], title: str, path: Path, max_abs: float) -> Path:
    """One group's responses with token-coloured advantages ``adv`` (response, token) -> ``path``."""
    rows = group["responses"]
    cmap, norm = plt.get_cmap("RdBu_r"), Normalize(-max_abs if max_abs > 0 else -1, max_abs if max_abs > 0 else 1)
    widths = [sum(max(1, len(t)) for _, t in _cells(r)) + 2 * len(r["steps"]) for r in rows]
    width = max([10] + widths) + 4
    fig, ax = plt.subplots(figsize=(min(18, 2 + 0.14 * width), 0.9 + 0.34 * len(rows)))
    for y, (r, a) in enumerate(zip(rows, adv)):
        right = r["outcome"] > 0.5
        ax.text(
            -0.5,
            y + 0.5,
            "✓" if right else "✗",
            color="#1a7f37" if right else "#b42318",
            ha="right",
            va="center",
            fontsize=10,
            fontweight="bold",
        )
        ends, placed = set(r["step_ends"]), set(r["reward_mask"])
        step_of_end = {e: k for k, (_, e) in enumerate(r["steps"])}
        x = 0.0
        for i, text in _cells(r):
            w = max(1, len(text))
            ax.add_patch(Rectangle((x, y + 0.08), w, 0.84, facecolor=cmap(norm(a[i])), edgecolor="none"))
            ax.text(
                x + w / 2,
                y + 0.5,
                text,
                ha="center",
                va="center",
                fontsize=7,
                family="monospace",
                color="white" if abs(norm(a[i]) - 0.5) > 0.3 else "black",
            )
            if i in placed:
                ax.plot(x + w / 2, y + 0.97, marker="^", color="black", markersize=3)
            x += w
            if i in ends:
                ax.plot([x + 0.15, x + 0.15], [y + 0.05, y + 0.95], color="#333", linewidth=1.2)
            if r["labels"] is not None and i in step_of_end:
                ok = r["labels"][step_of_end[i]]
                ax.text(x + 0.35, y + 0.25, "✓" if ok else "✗", fontsize=6, color="#1a7f37" if ok else "#b42318")
            if i in ends or (r["labels"] is not None and i in step_of_end):
                x += 1.0
        if len(r["texts"]) > MAX_CELLS:
            ax.text(x + 0.3, y + 0.5, "…", va="center", fontsize=8)
    ax.set_xlim(-1.5, width)
    ax.set_ylim(len(rows), 0)
    ax.axis("off")
    ax.set_title(title, fontsize=9, loc="left")
    sm = plt.cm.ScalarMappable(norm=norm, cmap=cmap)
    fig.colorbar(sm, ax=ax, fraction=0.02, pad=0.01, label="advantage")
    fig.savefig(path, dpi=200, bbox_inches="tight")
    plt.close(fig)
    return path


def metrics_figure(
    metrics: list[dict[str, Any]], charts: list[dict[str, Any]], path: Path, saved: list[int] | None = None
) -> Path:
    """The per-iteration charts (one panel per chart spec), saved iterations marked."""
    fig, axes = plt.subplots(1, len(charts), figsize=(3.2 * len(charts), 2.6))
    for ax, spec in zip(axes, charts):
        drawn = False
        for s in spec["series"]:
            pts = [(m["iteration"], m[s["key"]]) for m in metrics if isinstance(m.get(s["key"]), (int, float))]
            if pts:
                ax.plot(*zip(*pts), marker="o" if len(pts) < 40 else None, markersize=2.5, label=s["label"])
                drawn = True
        if not drawn:
            ax.text(0.5, 0.5, spec["empty"], ha="center", va="center", fontsize=7, transform=ax.transAxes, wrap=True)
        elif len(spec["series"]) > 1:
            ax.legend(fontsize=7)
        for it in saved or []:
            ax.axvline(it, color="#b42318", alpha=0.15, linewidth=0.8)
        ax.set_title(spec["title"], fontsize=9)
        ax.set_xlabel("iteration", fontsize=8)
        ax.tick_params(labelsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=150)
    plt.close(fig)
    return path
