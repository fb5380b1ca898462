"""The configuration error and the one-line messages every layer gives for a bad name.

:class:`ConfigError` is defined here, in the bottom layer, because loading raises it; every
other layer imports it from :mod:`creditrl.errors`.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class ConfigError(ValueError):
    """A configuration problem; the message names the key and what was expected."""


def did_you_mean(value: str, valid: Iterable[str]) -> str:
    """``"; did you mean 'x'?"`` for the closest of ``valid`` to ``value``, or ``""``."""
    close = difflib.get_close_matches(str(value), [str(v) for v in valid], n=1, cutoff=0.6)
    return f"; did you mean '{close[0]}'?" if close else ""


def unknown_choice(key: str, value: object, valid: Iterable[str]) -> ConfigError:
    """``key: unknown value 'v'; valid: a, b, c`` (sorted), with a suggestion for a near miss."""
    names = sorted(str(v) for v in valid)
    return ConfigError(f"{key}: unknown value '{value}'; valid: {', '.join(names)}{did_you_mean(str(value), names)}")
