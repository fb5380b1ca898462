"""The findings' figures across a claim's settings: one panel per setting (small multiples), and
the differences to the reference against the generated length where a task was measured at
several lengths."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path
from typing import Any

from creditrl.experiments.curves import arm_colours, plot_differences_by_length, plot_panels


def _length(finding: dict[str, Any]) -> int:
    """The generated length a setting's regime names (its first number: "about 155 generated tokens")."""
    found = re.search(r"\d+", finding["regime"])
    return int(found.group()) if found else 0


def _setting_order(item: tuple[dict[str, Any], dict[str, Any]]) -> tuple[str, int]:
    return item[0]["task"], _length(item[0])


def settings_figure(claim: str, panels: list[tuple[dict[str, Any], dict[str, Any]]], docs: Path, root: Path) -> str:
    """One panel per setting of the claim (by task, then length) and its markdown line."""
    shown = sorted(panels, key=_setting_order)
    dest = docs / f"{claim}_settings.png"
    plot_panels(
        [(textwrap.fill(f"{f['id']}: {f['regime']}", 38), results, f["reference"]) for f, results in shown],
        dest,
        f"{claim} in each setting: held-out exact match against generated samples, mean and 95% band over seeds",
    )
    ids = ", ".join(f["id"] for f, _ in shown)
    return f"{claim} in each of its settings ({ids}):\n\n![{dest.stem}]({dest.relative_to(root).as_posix()})\n"


def length_points(
    panels: list[tuple[dict[str, Any], dict[str, Any]]],
) -> tuple[str | None, dict[str, dict[str, list[tuple[int, dict[str, float]]]]]]:
    """Each arm's paired difference to the reference at the last evaluation (unadjusted 95%
    seed-level t), by task and generated length, for the tasks measured at two lengths or more:
    ``(reference, {task: {arm: [(length, {"mean", "lo", "hi"})]}})``; ``(None, {})`` when the
    settings have different references. An arm whose seeds differ from the reference's is left out."""
    from creditrl.experiments.verdicts import outcome_matrix, paired_difference

    references = {f["reference"] for f, _ in panels}
    if len(references) != 1:
        return None, {}
    reference = references.pop()
    by_task: dict[str, list[tuple[dict[str, Any], dict[str, Any]]]] = {}
    for item in sorted(panels, key=_setting_order):
        by_task.setdefault(item[0]["task"], []).append(item)
    points: dict[str, dict[str, list[tuple[int, dict[str, float]]]]] = {}
    for task, settings in by_task.items():
        if len({_length(f) for f, _ in settings}) < 2:
            continue
        arms = points.setdefault(task, {})
        for finding, results in settings:
            base = outcome_matrix(results[reference])
            for arm, histories in results.items():
                outcomes = outcome_matrix(histories)
                if arm != reference and outcomes.shape == base.shape:
                    d = paired_difference(outcomes, base)
                    arms.setdefault(arm, []).append((_length(finding), {"mean": d.mean, "lo": d.lo, "hi": d.hi}))
    return reference, points


def length_figure(claim: str, panels: list[tuple[dict[str, Any], dict[str, Any]]], docs: Path, root: Path) -> str:
    """The figure of :func:`length_points`, one panel per task, and its markdown ("" without a task)."""
    reference, points = length_points(panels)
    if not points:
        return ""
    colours = arm_colours([a for _, results in sorted(panels, key=_setting_order) for a in results])
    dest = docs / f"{claim}_by_length.png"
    plot_differences_by_length(
        points,
        colours,
        reference,
        dest,
        f"{claim}: difference to {reference} at the last evaluation against generated length, 95% intervals",
    )
    tasks = ", ".join(points)
    return (
        f"\n{claim}'s differences to **{reference}** against the generated length, where a task was measured at "
        f"several lengths ({tasks}; each point paired seed by seed over the same problems, with its unadjusted 95% "
        "seed-level t-interval):\n\n"
        f"![{dest.stem}]({dest.relative_to(root).as_posix()})\n"
    )
