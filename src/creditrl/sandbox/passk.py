"""Unbiased pass@k (Chen et al. 2021, "Evaluating Large Language Models Trained on Code",
https://arxiv.org/abs/2107.03374, section 2.1).

With ``n`` samples of which ``c`` are correct, the probability that a random subset of ``k``
of them holds at least one correct sample is::

    pass@k = 1 - C(n - c, k) / C(n, k) = 1 - prod_{i = n - c + 1}^{n} (1 - k / i)

The product form avoids the huge binomials; it equals 1 exactly when ``n - c < k`` (every
k-subset must contain a correct sample).
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["pass_at_k", "mean_pass_at_k"]


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one problem with ``n`` samples, ``c`` correct (module docstring).

    Raises:
        ValueError: Unless ``0 <= c <= n`` and ``1 <= k <= n``.
    """
    if not 0 <= c <= n:
        raise ValueError(f"need 0 <= c <= n, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"need 1 <= k <= n, got n={n}, k={k}")
    if n - c < k:
        return 1.0
    miss = 1.0
    for i in range(n - c + 1, n + 1):
        miss *= 1.0 - k / i
    return 1.0 - miss


def mean_pass_at_k(counts: Sequence[tuple[int, int]], k: int) -> float:
    """Mean of :func:`pass_at_k` over problems given as ``(n, c)`` pairs (0.0 for none)."""
    return sum(pass_at_k(n, c, k) for n, c in counts) / len(counts) if counts else 0.0
