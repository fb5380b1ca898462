"""The accuracy plot: axes within [0, 100], arms that coincide still told apart."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import pytest

from creditrl.experiments import report
from creditrl.experiments.report import accuracy_limits, plot_accuracy


def test_accuracy_limits_stay_within_0_and_100() -> None:
    assert accuracy_limits([0.0, 0.0]) == (0.0, 5.0)  # all zero: not a -0.04% axis
    assert accuracy_limits([20.0, 50.0]) == (0.0, pytest.approx(55.0))
    assert accuracy_limits([97.0, 100.0]) == (0.0, 100.0)


def test_coinciding_arms_get_their_own_styles(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    history = [
        {"iteration": 0, "samples/total": 0, "eval/accuracy": 0.0, "eval/step_accuracy": 0.0},
        {"iteration": 2, "samples/total": 64, "eval/accuracy": 0.0, "eval/step_accuracy": 0.0},
    ]
    figures = []
    monkeypatch.setattr(report.plt, "close", figures.append)
    plot_accuracy({"outcome + grpo": history, "oracle steps + grpo_process": history}, tmp_path / "a.png", "t")
    assert (tmp_path / "a.png").stat().st_size > 0
    (fig,) = figures
    for ax in fig.axes:
        assert ax.get_ylim() == (0.0, 5.0)
        a, b = ax.get_lines()
        assert (a.get_marker(), a.get_linestyle()) != (b.get_marker(), b.get_linestyle())
        assert list(a.get_ydata()) == list(b.get_ydata())  # the same numbers, two visible lines
    plt.close(fig)


def _run(acc: float) -> list[dict]:
    """Two evaluations of one seed: 20% at the start, ``acc`` after 640 samples."""
    return [
        {"iteration": 0, "samples/total": 0, "eval/accuracy": 0.2},
        {"iteration": 5, "samples/total": 640, "eval/accuracy": acc},
    ]


def test_seed_curves_keep_colours_mark_the_reference_and_put_the_legend_outside(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from creditrl.experiments import curves

    results = {f"arm {i}": [_run(0.2 + i / 100), _run(0.21 + i / 100)] for i in range(12)}
    figures = []
    monkeypatch.setattr(curves.plt, "close", figures.append)
    curves.plot_seed_curves(results, tmp_path / "c.png", "t", "samples/total", "samples", "ci95", reference="arm 3")
    (fig,) = figures
    ax = fig.axes[0]
    means = [line for line in ax.get_lines() if line.get_label().startswith("arm")]
    assert [line.get_label().split(",")[0] for line in means] == [
        f"arm {i}" + (" (reference)" if i == 3 else "") for i in range(12)
    ]
    assert len({line.get_color() for line in means}) == 12  # no colour reused within the panel
    assert [line.get_linestyle() for line in means].count("--") == 1 and means[3].get_linestyle() == "--"
    fig.canvas.draw()
    legend, axes = ax.get_legend().get_window_extent(), ax.get_window_extent()
    assert legend.x0 > axes.x1  # outside the data, to the right


def test_panels_give_an_arm_one_colour_in_every_panel_and_one_legend_entry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from matplotlib.colors import to_hex

    from creditrl.experiments import curves

    short = {"gae": [_run(0.3), _run(0.31)], "step": [_run(0.25), _run(0.26)]}
    long = {"gae": [_run(0.1), _run(0.12)], "token": [_run(0.4), _run(0.42)], "step": [_run(0.5), _run(0.52)]}
    figures = []
    monkeypatch.setattr(curves.plt, "close", figures.append)
    curves.plot_panels([("short", short, "gae"), ("long", long, "gae")], tmp_path / "p.png", "C1")
    assert (tmp_path / "p.png").stat().st_size > 10_000
    (fig,) = figures
    (left, right), legend = fig.axes, fig.legends[0]

    def colours(ax) -> dict[str, str]:
        lines = [line for line in ax.get_lines() if ", mean of" in line.get_label()]
        return {line.get_label().split(" (")[0].split(",")[0]: to_hex(line.get_color()) for line in lines}

    assert [ax.get_title() for ax in (left, right)] == ["short", "long"]
    assert colours(left)["step"] == colours(right)["step"] and colours(left)["gae"] == colours(right)["gae"]
    assert len(set(colours(right).values())) == 3  # no colour reused within a panel
    assert [t.get_text() for t in legend.get_texts()] == ["gae (reference)", "step", "token"]
    fig.canvas.draw()
    assert legend.get_window_extent().x0 > right.get_window_extent().x1  # outside the panels, to the right
    with pytest.raises(ValueError, match="no panel to draw"):
        curves.plot_panels([], tmp_path / "q.png", "C1")
