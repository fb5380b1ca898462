"""Learning curves of arms x seeds: the mean over seeds with an interval band per arm, one colour
per arm (:func:`arm_colours`), in one panel (:func:`plot_seed_curves`) or as small multiples, one
panel per setting (:func:`plot_panels`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from creditrl.experiments.report import eval_rows, plt
from creditrl.experiments.seeds import ci95_half


def arm_colours(names: list[str]) -> dict[str, Any]:
    """One colour per arm name, by first appearance: tab10, then tab20's lighter shades (none
    reused up to 30 arms; past that they cycle)."""
    palette = list(plt.get_cmap("tab10").colors) + list(plt.get_cmap("tab20").colors[1::2])
    return {name: palette[i % len(palette)] for i, name in enumerate(dict.fromkeys(names))}


def draw_arms(
    ax,
    results: dict[str, list[list[dict[str, Any]]]],
    colours: dict[str, Any],
    x_key: str,
    band: str,
    y_key: str = "eval/accuracy",
    reference: str | None = None,
) -> None:
    """On ``ax``: per arm the mean over seeds of ``y_key`` against ``x_key`` (each seed's curve
    interpolated on a common grid up to the smallest seed's last x) with a band (``minmax`` over
    seeds, or ``ci95``: the Student-t 95% interval), seeds thin; the ``reference`` arm dashed."""
    if band not in ("minmax", "ci95"):
        raise ValueError(f"plot_seed_curves: band must be 'minmax' or 'ci95', got {band!r}")
    for name, histories in results.items():
        color = colours[name]
        ref = name == reference
        scale = 100.0 if y_key.endswith("accuracy") else 1.0
        curves = [([r[x_key] for r in eval_rows(h)], [scale * r[y_key] for r in eval_rows(h)]) for h in histories]
        grid = np.linspace(0, min(max(xs) for xs, _ in curves), 50)
        ys = np.array([np.interp(grid, xs, y) for xs, y in curves])
        for xs, y in curves:
            ax.plot(xs, y, color=color, alpha=0.25, linewidth=0.8)
        mean = ys.mean(0)
        label = f"{name}{' (reference)' if ref else ''}, mean of {len(curves)} seeds"
        ax.plot(grid, mean, color=color, linewidth=2.5 if ref else 2, linestyle="--" if ref else "-", label=label)
        if band == "minmax":
            lo, hi = ys.min(0), ys.max(0)
        else:
            half = ci95_half(ys)
            lo, hi = mean - half, mean + half
        ax.fill_between(grid, lo, hi, color=color, alpha=0.15)
    ax.grid(alpha=0.3)


def plot_seed_curves(
    results: dict[str, list[list[dict[str, Any]]]],
    path: Path,
    title: str,
    x_key: str = "tokens/total",
    x_label: str = "generated tokens",
    band: str = "minmax",
    y_key: str = "eval/accuracy",
    y_label: str = "held-out exact match (%)",
    reference: str | None = None,
) -> None:
    """Held-out exact match (or ``y_key``, in percent if it is an accuracy) against ``x_key``, as
    :func:`draw_arms`, the legend outside the data on the right."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(9, 4.5), dpi=120)
    draw_arms(ax, results, arm_colours(list(results)), x_key, band, y_key, reference)
    ax.set_xlabel(x_label)
    ax.set_ylabel(y_label)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot_panels(
    panels: list[tuple[str, dict[str, list[list[dict[str, Any]]]], str | None]],
    path: Path,
    title: str,
    x_key: str = "samples/total",
    x_label: str = "generated samples",
) -> None:
    """Small multiples: one panel per ``(title, results, reference)`` (held-out exact match against
    ``x_key``, 95% bands), each with its own axes; an arm has one colour in every panel and one
    entry in the shared legend, outside the panels on the right."""
    if not panels:
        raise ValueError("plot_panels: no panel to draw")
    path.parent.mkdir(parents=True, exist_ok=True)
    colours = arm_colours([a for _, results, _ in panels for a in results])
    fig, axes = plt.subplots(1, len(panels), figsize=(3.6 * len(panels) + 2.8, 4.2), dpi=120, squeeze=False)
    for ax, (name, results, reference) in zip(axes[0], panels, strict=True):
        draw_arms(ax, results, colours, x_key, "ci95", reference=reference)
        lo, hi = ax.get_ylim()  # each panel its own range, within [0, 100] and at least 5 points tall
        mid, half = (lo + hi) / 2, max(hi - lo, 5.0) / 2
        ax.set_ylim(max(0.0, mid - half), min(100.0, mid + half))
        ax.set_title(name, fontsize=9)
        ax.set_xlabel(x_label, fontsize=8)
        ax.tick_params(labelsize=7)
    axes[0][0].set_ylabel("held-out exact match (%)")
    handles = {}
    for ax in axes[0]:  # one legend entry per arm; "(reference)" where an arm is some panel's reference
        for h, label in zip(*ax.get_legend_handles_labels(), strict=True):
            arm = label.rsplit(", mean of", 1)[0]
            if arm.removesuffix(" (reference)") not in handles or arm.endswith("(reference)"):
                handles[arm.removesuffix(" (reference)")] = (h, arm)
    _legend_outside_and_save(
        fig, [h for h, _ in handles.values()], [label for _, label in handles.values()], title, path
    )


def _legend_outside_and_save(fig, handles: list, labels: list[str], title: str, path: Path) -> None:
    """The small multiples' shared legend outside the panels on the right, the title, and the file."""
    fig.legend(handles, labels, fontsize=8, loc="upper left", bbox_to_anchor=(1.0 - 2.7 / fig.get_figwidth(), 0.93))
    fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0, 1.0 - 2.8 / fig.get_figwidth(), 1))
    fig.savefig(path)
    plt.close(fig)


def plot_differences_by_length(
    tasks: dict[str, dict[str, list[tuple[int, dict[str, float]]]]],
    colours: dict[str, Any],
    reference: str,
    path: Path,
    title: str,
) -> None:
    """One panel per task: each arm's paired difference to ``reference`` (points, 95% error bars)
    against the generated length of the task's settings (log axis), the reference as the zero line;
    ``tasks[task][arm]`` holds ``(length, {"mean", "lo", "hi"})`` pairs (fractions)."""
    if not tasks:
        raise ValueError("plot_differences_by_length: no task to draw")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, axes = plt.subplots(1, len(tasks), figsize=(4.2 * len(tasks) + 2.8, 4.2), dpi=120, squeeze=False)
    for ax, (task, arms) in zip(axes[0], tasks.items(), strict=True):
        ax.axhline(0.0, color="0.3", linestyle="--", linewidth=1.2, label=f"{reference} (reference)")
        lengths = sorted({n for points in arms.values() for n, _ in points})
        for i, (arm, points) in enumerate(arms.items()):
            points = sorted(points, key=lambda p: p[0])
            shift = 1.0 + 0.02 * (i - (len(arms) - 1) / 2)  # side by side at one length, not on top
            x = [n * shift for n, _ in points]
            mean = [100 * d["mean"] for _, d in points]
            err = [[100 * (d["mean"] - d["lo"]) for _, d in points], [100 * (d["hi"] - d["mean"]) for _, d in points]]
            ax.errorbar(x, mean, yerr=err, color=colours[arm], marker="o", capsize=3, linewidth=1.5, label=arm)
        ax.set_xscale("log")
        ax.set_xticks(lengths, [str(n) for n in lengths])
        ax.minorticks_off()
        ax.set_title(task, fontsize=9)
        ax.set_xlabel("generated tokens (about)", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel(f"difference to {reference} (points)")
    handles = {}
    for ax in axes[0]:
        for h, label in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(label, h)
    _legend_outside_and_save(fig, list(handles.values()), list(handles), title, path)
