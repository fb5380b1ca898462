"""pass@k against a brute-force count of k-subsets, and its edge cases."""

from __future__ import annotations

import itertools
import math

import pytest

from creditrl.sandbox import mean_pass_at_k, pass_at_k


def brute_force(n: int, c: int, k: int) -> float:
    """Share of the k-subsets of n samples (the first c correct) holding a correct one."""
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(i < c for i in s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n", range(1, 9))
def test_matches_enumeration_of_subsets(n: int) -> None:
    for c in range(n + 1):
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(brute_force(n, c, k), abs=1e-12), (n, c, k)


def test_matches_the_binomial_formula_where_it_is_exact() -> None:
    for n, c, k in [(200, 3, 10), (100, 50, 1), (1000, 1, 100), (50, 0, 5)]:
        exact = 1 - math.comb(n - c, k) / math.comb(n, k)
        assert pass_at_k(n, c, k) == pytest.approx(exact, rel=1e-12, abs=1e-15)


def test_edge_cases() -> None:
    assert pass_at_k(10, 0, 3) == 0.0  # nothing correct
    assert pass_at_k(10, 8, 3) == 1.0  # n - c = 2 < k: every 3-subset holds a correct sample
    assert pass_at_k(5, 5, 5) == 1.0
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)  # pass@1 is the share correct
    assert pass_at_k(10_000, 1, 1) == pytest.approx(1e-4, rel=1e-9)  # stable for large n
    with pytest.raises(ValueError, match="k <= n"):
        pass_at_k(3, 1, 4)
    with pytest.raises(ValueError, match="1 <= k"):
        pass_at_k(3, 1, 0)
    with pytest.raises(ValueError, match="c <= n"):
        pass_at_k(3, 4, 1)
    with pytest.raises(ValueError, match="0 <= c"):
        pass_at_k(3, -1, 1)


def test_monotone_in_k_and_c_and_mean() -> None:
    for k in range(1, 10):
        assert pass_at_k(10, 2, k) <= pass_at_k(10, 2, k + 1)
        assert pass_at_k(10, 2, k) <= pass_at_k(10, 3, k)
    assert mean_pass_at_k([(4, 1), (4, 0)], 1) == pytest.approx(0.125)
    assert mean_pass_at_k([], 1) == 0.0
