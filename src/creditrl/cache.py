"""Where creditrl caches what it trains once (SFT warm starts, PRMs), and the lock that makes
processes needing the same entry build it once."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from filelock import FileLock


def cache_root() -> Path:
    """``$CREDITRL_CACHE`` or ``~/.cache/creditrl``."""
    return Path(os.environ.get("CREDITRL_CACHE", Path.home() / ".cache" / "creditrl"))


@contextmanager
def cache_lock(path: Path) -> Iterator[None]:
    """An exclusive lock (``<path>.lock``) held while a cache entry is looked up and, if missing,
    built: processes that need the same entry build it once, the others wait and read it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path.with_name(path.name + ".lock"))):
        yield
