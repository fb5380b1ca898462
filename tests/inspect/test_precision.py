"""Credit precision against a hand-computed example."""

from __future__ import annotations

import pytest

from creditrl.inspect.precision import NegativeCredit, negative_credit, percent, pooled

# Response A: three steps, the first correct, the other two wrong.
#   tokens        0     1     2  |   3    4     5  |  6     7
#   A_t         0.5  -0.5  -1.0  | -2.0  0.0  -1.0 | 1.0  -0.5
#   max(0,-A)     0   0.5   1.0  |  2.0    0   1.0 |   0   0.5
# negative credit: correct step 1.5, wrong steps 3.0 + 0.5 = 3.5 -> precision 3.5 / 5.0 = 0.7
A_ADV = [0.5, -0.5, -1.0, -2.0, 0.0, -1.0, 1.0, -0.5]
A_STEPS = [[0, 2], [3, 5], [6, 7]]
A_LABELS = [True, False, False]
# Response B: a correct step carrying 2.0 of negative credit, then an unlabelled step (skipped).
B_ADV = [-1.0, -1.0, -4.0, -4.0]
B_STEPS = [[0, 1], [2, 3]]
B_LABELS = [True, None]


def test_one_response_by_hand() -> None:
    a = negative_credit(A_ADV, A_STEPS, A_LABELS)
    assert (a.wrong, a.labelled) == (3.5, 5.0)
    assert a.precision == pytest.approx(0.7, abs=1e-12)
    b = negative_credit(B_ADV, B_STEPS, B_LABELS)
    assert (b.wrong, b.labelled) == (0.0, 2.0)  # the unlabelled step's 8.0 never counts
    assert b.precision == 0.0


def test_pooled_is_a_ratio_of_sums_not_a_mean_of_ratios() -> None:
    both = pooled([negative_credit(A_ADV, A_STEPS, A_LABELS), negative_credit(B_ADV, B_STEPS, B_LABELS)])
    assert both.precision == pytest.approx(3.5 / 7.0, abs=1e-12)  # not (0.7 + 0.0) / 2 = 0.35
    assert percent(both.precision) == "50.0%"
    assert percent(0.7) == "70.0%"


def test_no_negative_credit_is_undefined() -> None:
    only_positive = negative_credit([1.0, 2.0, 0.0], [[0, 1], [2, 2]], [True, False])
    assert only_positive.precision is None and percent(None) == "n/a"
    assert pooled([]).precision is None
    assert NegativeCredit(1.0, 4.0).precision == 0.25


def test_precision_is_one_when_all_negative_credit_hits_wrong_steps() -> None:
    nc = negative_credit([0.3, 0.3, -0.2, -0.7], [[0, 1], [2, 3]], [True, False])
    assert nc.precision == 1.0


def test_labels_must_match_steps() -> None:
    with pytest.raises(ValueError, match="one label per step"):
        negative_credit(A_ADV, A_STEPS, [True, False])
