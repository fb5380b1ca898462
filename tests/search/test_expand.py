"""Water-filling of a budget over requests, against a brute-force reference."""

from __future__ import annotations

import random

import pytest

from creditrl.search.expand import water_fill


def reference(wants: list[int], available: int, floor: int) -> list[int]:
    """Slow and obvious: the longest prefix whose minimum shares fit, then the highest level."""
    kept = 0
    while kept < len(wants) and sum(min(w, floor) for w in wants[: kept + 1]) <= available:
        kept += 1
    head = wants[:kept]
    level = max([c for c in range(0, max(head, default=0) + 1) if sum(min(w, c) for w in head) <= available], default=0)
    return [min(w, level) for w in head] + [0] * (len(wants) - kept)


def test_water_fill_matches_reference_and_never_exceeds() -> None:
    rng = random.Random(0)
    for _ in range(500):
        wants = [rng.randint(0, 40) for _ in range(rng.randint(0, 6))]
        available, floor = rng.randint(-5, 150), rng.choice([1, 4, 16])
        caps = water_fill(wants, available, floor)
        assert caps == reference(wants, available, floor)
        assert sum(caps) <= max(0, available)
        assert all(0 <= c <= w for c, w in zip(caps, wants))


def test_water_fill_examples() -> None:
    assert water_fill([10, 10, 10], 100) == [10, 10, 10]  # everything fits
    assert water_fill([50, 5, 50], 45) == [20, 5, 20]  # equal level, the small want leaves its share
    assert water_fill([9, 9, 9, 9], 2) == [1, 1, 0, 0]  # more requests than tokens
    assert water_fill([30, 30, 30], 40, floor=16) == [20, 20, 0]  # only two can get 16
    assert water_fill([30, 4], 20, floor=16) == [16, 4]  # the floor is min(want, floor)
    assert water_fill([30, 8], 20, floor=16) == [20, 0]  # 16 + 8 > 20: the second is not sent
    assert water_fill([30], 10, floor=16) == [0]
    with pytest.raises(ValueError, match="want must be >= 0"):
        water_fill([-1], 5)
    with pytest.raises(ValueError, match="floor must be >= 1"):
        water_fill([1], 5, floor=0)
