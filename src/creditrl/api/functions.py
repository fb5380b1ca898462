"""Reward functions held in this process, named ``python:NAME`` in a config.

:class:`creditrl.Trainer` takes reward functions as Python objects (TRL's ``reward_funcs``). A
function an import path finds again is named by that path, ``module:function``, so its run also
resumes from the command line. Any other (defined in ``__main__`` or a function, a lambda, a
``functools.partial``) is registered here under ``python:NAME``, resolved by the ``python`` source
prefix with TRL's contract (:func:`creditrl.rewards.functions.call_reward_function`); such a run
resumes from Python, through a trainer given the same functions.
"""

from __future__ import annotations

import importlib
import re
import sys
from collections.abc import Callable
from typing import Any

from creditrl.rewards import RewardSource, register_source_prefix
from creditrl.rewards.functions import callable_source

__all__ = ["PREFIX", "FUNCTIONS", "source_name"]

PREFIX = "python"
FUNCTIONS: dict[str, Callable[..., Any]] = {}  # python:NAME -> the function


def _import_path(fn: Callable[..., Any]) -> str | None:
    """``module:qualname`` when importing it finds ``fn`` itself, else None."""
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)
    if not module or not qualname or module == "__main__" or "<" in qualname:
        return None
    try:
        obj: Any = sys.modules.get(module) or importlib.import_module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except Exception:  # noqa: BLE001 - any failure means: not found by its path
        return None
    return f"{module}:{qualname}" if obj is fn else None


def source_name(fn: Callable[..., Any] | str) -> str:
    """The reward-source name of ``fn``: a string as it is (a source name, ``module:function``,
    ``rm:PATH``), a function its import path, else ``python:NAME`` (registered here; a second,
    different function of the same name gets ``NAME_2``, ...)."""
    if isinstance(fn, str):
        return fn
    if not callable(fn):
        raise TypeError(f"reward_funcs: expected callables or source names, got a {type(fn).__name__}")
    path = _import_path(fn)
    if path is not None:
        return path
    base = re.sub(r"\W+", "_", getattr(fn, "__name__", None) or type(fn).__name__).strip("_") or "reward"
    name, k = f"{PREFIX}:{base}", 1
    while FUNCTIONS.get(name, fn) is not fn:
        k += 1
        name = f"{PREFIX}:{base}_{k}"
    FUNCTIONS[name] = fn
    return name


@register_source_prefix(PREFIX)
def _resolve(name: str) -> RewardSource:
    """The source of a registered function, called once per batch as TRL calls it."""
    if name not in FUNCTIONS:
        known = ", ".join(sorted(FUNCTIONS)) or "none"
        raise ValueError(
            f"reward source '{name}' is a Python function of another process (registered here: {known}); "
            "resume such a run from Python with a Trainer given the same reward_funcs"
        )
    return callable_source(FUNCTIONS[name], name)
