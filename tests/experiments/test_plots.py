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
