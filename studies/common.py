"""What the studies share: their config and the task it names, their command line, their log
lines and their results pages.

Each study takes a config as ``creditrl train`` does (``CONFIG`` + ``--set key=value``); without
``CONFIG`` it is the packaged arith config (:func:`creditrl.config.loader.arith_config_path`), so
the published numbers are reproduced by the bare command. Any task with reasoning steps works: a
step separator, to cut responses into steps, and a step checker, for the oracle labels and the
true values the studies measure against. A task without them is refused with one line before
anything is loaded.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from creditrl.cli.common import add_config_args, add_report_args, add_threads_arg, quiet_libraries, set_threads
from creditrl.config import Config
from creditrl.config.loader import arith_config_path
from creditrl.errors import ConfigError
from creditrl.experiments.report import publish_report, task_phrase, write_results
from creditrl.tasks import Task
from creditrl.train.resolve import run_task

__all__ = [
    "base_config",
    "default_task_sets",
    "logger",
    "parser",
    "publish_report",
    "run",
    "step_task",
    "task_phrase",
    "write_results",
]


def base_config(config: str | Path | None, quick: bool) -> Path:
    """The config file a study starts from: ``config``, else the packaged arith config (under
    ``quick``, the demo's smoke-test sizes)."""
    return Path(config) if config else arith_config_path(quick)


def default_task_sets(config: str | Path | None, overrides: Sequence[str], defaults: Sequence[str]) -> list[str]:
    """A study's own task settings (``defaults``, e.g. harder problems than the config's RL task):
    they apply to the default config only, and only while ``overrides`` leave ``task.*`` alone,
    so a given config or task is used as it is."""
    touches_task = any(o.split("=", 1)[0].strip().split(".")[0] == "task" for o in overrides)
    return [] if config is not None or touches_task else list(defaults)


def step_task(cfg: Config, study: str) -> Task:
    """The task of ``cfg``, built once, for ``study``, which needs reasoning steps.

    Raises:
        ConfigError: Naming ``task.name`` when the task cannot be built, or has no step separator
            or no step checker (``check_steps``).
    """
    task = run_task(cfg)
    missing = (
        "a step separator"
        if task.step_separator is None
        else "a step checker"
        if not callable(getattr(task, "check_steps", None))
        else ""
    )
    if missing:
        raise ConfigError(
            f"task.name: {study} needs a task with reasoning steps (a step separator and a step "
            f"checker); task '{cfg.task.name}' has no {missing[2:]}"
        )
    return task


def logger(study: str) -> Callable[[str], None]:
    """``log(message)``: one line ``[study] <seconds since this call> s  message``, flushed."""
    start = time.time()
    return lambda msg: print(f"[{study}] {time.time() - start:6.0f} s  {msg}", flush=True)


def parser(study: str, doc: str | None, **report: str | None) -> argparse.ArgumentParser:
    """The command line of ``python -m studies.STUDY``: ``[CONFIG] --set ...``, the shared report
    arguments (:func:`creditrl.cli.common.add_report_args`, given ``report``: their helps) and
    ``--threads``; its description the first paragraph of ``doc`` (the study's module docstring)."""
    p = argparse.ArgumentParser(prog=f"python -m studies.{study}", description=(doc or "").split("\n\n", 1)[0])
    add_config_args(p)
    add_report_args(p, **report)  # type: ignore[arg-type]
    add_threads_arg(p)
    return p


def run(main: Callable[[argparse.Namespace], None], p: argparse.ArgumentParser, argv: list[str] | None = None) -> int:
    """Parse ``argv`` and run ``main``; an expected problem (a bad key, a task without steps, a
    missing file) ends it with one line on stderr and status 2, as ``creditrl`` does."""
    args = p.parse_args(argv)
    quiet_libraries()
    set_threads(args.threads)
    try:
        main(args)
    except (ConfigError, FileNotFoundError) as exc:
        print(f"{p.prog}: error: {exc}", file=sys.stderr)
        return 2
    return 0
