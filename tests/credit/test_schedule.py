"""linear_schedule: end points, midpoint, clamping, constant when end is None."""

import pytest

from creditrl.credit.schedule import linear_schedule


@pytest.mark.parametrize(
    "progress, expected",
    [(0.0, 0.5), (0.5, 0.725), (1.0, 0.95), (0.2, 0.59), (-0.3, 0.5), (1.7, 0.95)],
)
def test_lambda_schedule_values(progress, expected):
    assert linear_schedule(0.5, 0.95, progress) == pytest.approx(expected, abs=1e-12)


def test_end_none_is_constant():
    assert [linear_schedule(0.9, None, p) for p in (-1.0, 0.0, 0.4, 1.0, 3.0)] == [0.9] * 5


def test_decreasing_schedule_and_exact_end_points():
    assert linear_schedule(1.0, 0.0, 0.25) == 0.75
    assert linear_schedule(0.3, 0.7, 0.0) == 0.3
    assert linear_schedule(0.3, 0.7, 1.0) == 0.7


def test_over_a_training_run_it_is_monotone_and_stays_in_range():
    total = 37
    lams = [linear_schedule(0.5, 0.95, i / total) for i in range(total + 5)]  # runs past the end
    assert all(a <= b for a, b in zip(lams, lams[1:]))
    assert lams[0] == 0.5 and lams[-1] == 0.95
    assert all(0.5 <= x <= 0.95 for x in lams)
