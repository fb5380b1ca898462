"""The seeds harness: Student-t intervals over seeds, over a value and over a curve's columns."""

from __future__ import annotations

import numpy as np
import pytest

from creditrl.experiments.seeds import ci95_half, mean_ci95


def test_mean_ci95_uses_student_t():
    assert mean_ci95([0.5]) == (0.5, 0.0)
    mean, half = mean_ci95([0.2, 0.3, 0.4])
    assert mean == pytest.approx(0.3)
    assert half == pytest.approx(4.302653 * 0.1 / 3**0.5)  # sd 0.1, n 3, t(2) = 4.303
    mean, half = mean_ci95([float(i) for i in range(12)])  # past a small table: t(11) = 2.201, not 1.96
    assert mean == pytest.approx(5.5) and half == pytest.approx(2.201 * 13**0.5 / 12**0.5, rel=1e-3)
    with pytest.raises(ValueError, match="at least one value"):
        mean_ci95([])


def test_ci95_half_of_a_matrix_is_each_columns_interval():
    ys = np.random.default_rng(0).random((3, 50)) * 100  # 3 seeds x 50 points of a curve
    half = ci95_half(ys)
    assert half.shape == (50,)
    assert half.tolist() == [mean_ci95(list(col))[1] for col in ys.T]  # the same floats, column by column
    assert ci95_half(ys[:1]).tolist() == [0.0] * 50
