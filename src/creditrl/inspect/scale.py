"""The inspector's colour scale for advantages: diverging and symmetric around 0, with a floor.

A group whose rewards are all equal gets advantages that are 0 up to float rounding, which a
scale fitted to its ``max |A|`` would draw fully saturated. So an advantage under
:data:`ADV_FLOOR` in size is shown as 0 (white), and a group whose every advantage is under it has
no scale (``max |A| = 0``). The page's JavaScript reads the same floor from the page data.
"""

from __future__ import annotations

from collections.abc import Iterable

ADV_FLOOR = 1e-6


def shown(a: float) -> float:
    """The advantage as the scale colours it: 0 under :data:`ADV_FLOOR` in size, else ``a``."""
    return 0.0 if abs(a) < ADV_FLOOR else a


def scale_max(values: Iterable[float]) -> float:
    """The scale's ``max |A|`` over ``values``: 0 when every one is under :data:`ADV_FLOOR` in size."""
    m = max((abs(a) for a in values), default=0.0)
    return m if m >= ADV_FLOOR else 0.0


def scale_label(x: float) -> str:
    """The scale's end as the legend and colour bar print it: ``0.250``, ``3.2e-05``, ``0``."""
    if x == 0:
        return "0"
    return f"{x:.3f}" if abs(x) >= 1e-3 else f"{x:.2g}"
