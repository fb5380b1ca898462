"""The error types every layer may raise or catch.

``ConfigError`` (a ``ValueError``) is the one expected error of a run: a bad key, name, value or
combination, a missing file. The CLI prints its one-line message and exits with status 2,
without a traceback. Its definition lives in :mod:`creditrl.config.errors`, the bottom layer,
because loading a config raises it.
"""

from creditrl.config.errors import ConfigError, did_you_mean, unknown_choice

__all__ = ["ConfigError", "did_you_mean", "unknown_choice"]
