"""The ``creditrl`` command line. Every subcommand lives in this package, one module per family:

- :mod:`.train`: ``demo``, ``sft``, ``train``, ``config``;
- :mod:`.prm`: ``prm label | train | eval | score``;
- :mod:`.search`: ``search``;
- :mod:`.inspect`: ``inspect``;
- :mod:`.experiments`: ``compare``, ``findings``, ``eval``.

An expected problem (a bad key, name or value, a missing file) ends the command with one line
on stderr and exit status 2, without a traceback; Ctrl-C with one line and status 130.
"""

from __future__ import annotations

import argparse
import logging
import sys

from creditrl.cli.common import quiet_libraries
from creditrl.errors import ConfigError


class _Stderr(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is when a record is emitted (not the stream of the first
    call: a caller may swap sys.stderr, as pytest's capture does)."""

    @property
    def stream(self):  # noqa: D102
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass


def log_to_stderr() -> None:
    """The ``creditrl`` logger's INFO lines (e.g. which engine a run chose) on stderr, once."""
    logger = logging.getLogger("creditrl")
    if not any(isinstance(h, _Stderr) for h in logger.handlers):
        handler = _Stderr()
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False


def build_parser() -> argparse.ArgumentParser:
    from creditrl.cli import experiments, inspect, prm, search, train

    parser = argparse.ArgumentParser(prog="creditrl", description="RL fine-tuning where credit assignment comes first")
    sub = parser.add_subparsers(dest="command", required=True)
    for module in (train, prm, search, inspect, experiments):
        module.add_parsers(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    quiet_libraries()
    log_to_stderr()
    try:
        return args.func(args)
    except (ConfigError, FileNotFoundError) as exc:
        print(f"creditrl: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:  # Ctrl-C in any command (train says where it stopped and how to resume)
        print(f"creditrl: {str(exc) or 'interrupted'}", file=sys.stderr)
        return getattr(exc, "exit_code", 130)
