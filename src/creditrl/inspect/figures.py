"""PNG figures of the inspector for papers: a group's token credit per estimator, and the metrics.

``credit_figure`` draws one group's responses as rows of token cells coloured by advantage on
the page's diverging scale (blue < 0, white at 0, red > 0, symmetric: ``RdBu_r`` over
``[-max|A|, max|A|]``, advantages under :data:`~creditrl.inspect.scale.ADV_FLOOR` in size white),
a bar after each step end, a dot over each placed reward, the oracle step label (a green tick or
red cross) after each step, and the outcome at the row's start; characters the font has no
glyph for are written as escapes (``\x08``). ``metrics_figure`` draws the page's per-iteration
charts.
"""

from __future__ import annotations

import functools
import textwrap
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; no display on servers or in CI
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.colors import Normalize  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.font_manager import FontProperties, findfont  # noqa: E402
from matplotlib.ft2font import FT2Font  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402
from matplotlib.ticker import FuncFormatter  # noqa: E402

from creditrl.inspect.scale import ADV_FLOOR, scale_label, shown  # noqa: E402

MAX_CELLS = 90  # token cells drawn per response; longer responses end in an ellipsis
TITLE_PT = 9


@functools.cache
def _glyphs(family: str) -> frozenset[int]:
    """The code points the font matplotlib uses for ``family`` has glyphs for."""
    return frozenset(FT2Font(findfont(FontProperties(family=[family]))).get_charmap())


def printable(text: str, family: str = "monospace") -> str:
    """``text`` with every character the ``family`` font cannot draw written as an escape
    (``"\\x08"``, ``"\\u2028"``), so that drawing it warns of no missing glyph."""
    glyphs = _glyphs(family)
    return "".join(c if ord(c) in glyphs and c.isprintable() else ascii(c)[1:-1] for c in text)


def _cells(response: dict[str, Any]) -> list[tuple[int, str]]:
    """(token index, shown text) per drawn cell."""
    newline = "⏎" if ord("⏎") in _glyphs("monospace") else "\\n"
    out = []
    for i, text in enumerate(response["texts"][:MAX_CELLS]):
        cell = response["special"].get(str(i), text)
        out.append((i, printable(cell.replace("\n", newline)) or "·"))
    return out


def _mark(ok: bool) -> tuple[str, str]:
    """A right (green tick) or wrong (red cross) mark and its colour."""
    return ("✓", "#1a7f37") if ok else ("✗", "#b42318")


def credit_figure(group: dict[str, Any], adv: list[list[float]], title: str, path: Path, max_abs: float) -> Path:
    """One group's responses with token-coloured advantages ``adv`` (response, token) -> ``path``."""
    fig = draw_credit(group, adv, title, max_abs)
    fig.savefig(path, dpi=200, bbox_inches="tight")
    plt.close(fig)
    return path


def draw_credit(group: dict[str, Any], adv: list[list[float]], title: str, max_abs: float) -> Figure:
    """The figure of :func:`credit_figure`; ``max_abs`` under the floor draws every cell white."""
    rows = group["responses"]
    top = max_abs if max_abs >= ADV_FLOOR else 1.0
    cmap, norm = plt.get_cmap("RdBu_r"), Normalize(-top, top)
    widths = [sum(max(1, len(t)) for _, t in _cells(r)) + 2 * len(r["steps"]) for r in rows]
    width = max([10] + widths) + 4
    fig, ax = plt.subplots(figsize=(min(18, 2 + 0.14 * width), 0.9 + 0.34 * len(rows)))
    for y, (r, a) in enumerate(zip(rows, adv)):
        mark, colour = _mark(r["outcome"] > 0.5)
        ax.text(-0.5, y + 0.5, mark, color=colour, ha="right", va="center", fontsize=10, fontweight="bold")
        ends, placed = set(r["step_ends"]), set(r["reward_mask"])
        step_of_end = {e: k for k, (_, e) in enumerate(r["steps"])}
        x = 0.0
        for i, text in _cells(r):
            w = max(1, len(text))
            level = norm(shown(a[i])) if max_abs >= ADV_FLOOR else 0.5  # 0.5: white, the scale's 0
            ax.add_patch(Rectangle((x, y + 0.08), w, 0.84, facecolor=cmap(level), edgecolor="none"))
            ax.text(
                x + w / 2,
                y + 0.5,
                text,
                ha="center",
                va="center",
                fontsize=7,
                family="monospace",
                color="white" if abs(level - 0.5) > 0.3 else "black",
            )
            if i in placed:
                ax.plot(x + w / 2, y + 0.97, marker="^", color="black", markersize=3)
            x += w
            if i in ends:
                ax.plot([x + 0.15, x + 0.15], [y + 0.05, y + 0.95], color="#333", linewidth=1.2)
            if r["labels"] is not None and i in step_of_end:
                mark, colour = _mark(r["labels"][step_of_end[i]])
                ax.text(x + 0.35, y + 0.25, mark, fontsize=6, color=colour)
            if i in ends or (r["labels"] is not None and i in step_of_end):
                x += 1.0
        if len(r["texts"]) > MAX_CELLS:
            ax.text(x + 0.3, y + 0.5, "…", va="center", fontsize=8)
    ax.set_xlim(-1.5, width)
    ax.set_ylim(len(rows), 0)
    ax.axis("off")
    # wrapped to the axes' width, so the title never runs over the colour bar
    chars = int(fig.get_figwidth() * 0.85 * 72 / (0.6 * TITLE_PT))
    ax.set_title(textwrap.fill(printable(title, "sans-serif"), chars), fontsize=TITLE_PT, loc="left")
    sm = plt.cm.ScalarMappable(norm=norm, cmap=cmap)
    bar = fig.colorbar(sm, ax=ax, fraction=0.02, pad=0.01, label="advantage")
    if max_abs < ADV_FLOOR:
        bar.set_ticks([0.0])
        bar.set_label(f"advantage (all under {ADV_FLOOR:g})")
    bar.formatter = FuncFormatter(lambda v, _: scale_label(v))  # each tick its own exponent: no offset text
    bar.update_ticks()
    return fig


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
