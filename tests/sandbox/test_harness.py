"""run_tests and same_value: verdicts come from returned data, compared in the parent."""

from __future__ import annotations

import math

import pytest

from creditrl.sandbox import Limits, run_tests, same_value

INPUTS = [[1, 2], [0, 0], [-3, 5], [10, 7]]
EXPECTED = [3, 0, 2, 17]


def fraction(source: str, **kw) -> float:
    return run_tests(source, "add", INPUTS, EXPECTED, **kw).fraction


def test_correct_partial_and_wrong_programs() -> None:
    assert fraction("def add(a, b): return a + b") == 1.0
    assert fraction("def add(a, b): return a + b if a < 5 else 0") == 0.75
    assert fraction("def add(a, b): return a - b") == 0.25  # right only on (0, 0)
    assert fraction("def plus(a, b): return a + b") == 0.0  # wrong name
    report = run_tests("def add(a, b): return b / a", "add", INPUTS, EXPECTED)
    assert report.passed == (False, False, False, False) and report.sandbox.ok  # wrong values and a ZeroDivisionError


def test_syntax_errors_are_rejected_without_a_process() -> None:
    report = run_tests("def add(a, b): return a +", "add", INPUTS, EXPECTED)
    assert report.passed == (False,) * 4 and report.reason == "syntax error" and report.sandbox is None


def test_a_timeout_keeps_the_tests_reported_before_it() -> None:
    src = "def add(a, b):\n    while a == 10: pass\n    return a + b"
    report = run_tests(src, "add", INPUTS, EXPECTED, limits=Limits(timeout_s=1.0))
    assert report.passed == (True, True, True, False) and report.reason == "timeout"


def test_expected_values_never_enter_the_sandbox() -> None:
    """The program sees its whole source text (the runner included): no expected value in it."""
    marker = 987654321
    src = "import sys\nTEXT = open(sys.argv[0]).read()\ndef add(a, b): return TEXT"
    report = run_tests(src, "add", [[1, 2]], [marker])
    assert report.sandbox.ok and str(marker) not in report.sandbox.channel.decode()


def test_argument_checks() -> None:
    with pytest.raises(ValueError, match="2 test inputs but 1"):
        run_tests("", "add", [[1], [2]], [1])
    with pytest.raises(ValueError, match="identifier"):
        run_tests("", "add(", [[1]], [1])


@pytest.mark.parametrize(
    ("expected", "actual", "same"),
    [
        (3, 3, True),
        (3, 3.0, True),
        (2.5, 2.5 + 1e-12, True),
        (2.5, 2.6, False),
        (True, 1, False),
        (1, True, False),
        (False, False, True),
        (0.1, math.nan, False),
        ("ab", "ab", True),
        ("1", 1, False),
        (None, None, True),
        (None, 0, False),
        ([1, [2, 3]], [1, [2, 3]], True),
        ([1, 2], [1, 2, 3], False),
        ([1, 2], "12", False),
        ({"a": 1}, {"a": 1.0}, True),
        ({"a": 1}, {"a": 1, "b": 2}, False),
    ],
)
def test_same_value(expected, actual, same: bool) -> None:
    assert same_value(expected, actual) is same
