"""What the PRM, search, value and tree reports share: their config and the task it names.

Each report takes a config as ``creditrl train`` does (``CONFIG`` + ``--set key=value``); without
``CONFIG`` it is the packaged arith config (:func:`creditrl.config.loader.arith_config_path`), so
the published numbers are reproduced by the bare command. Any task with reasoning steps works: a
step separator, to cut responses into steps, and a step checker, for the oracle labels and the
true values the reports measure against. A task without them is refused with one line before
anything is loaded.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from creditrl.config import Config
from creditrl.config.loader import arith_config_path
from creditrl.errors import ConfigError
from creditrl.tasks import Task
from creditrl.train.resolve import run_task


def base_config(config: str | Path | None, quick: bool) -> Path:
    """The config file a report starts from: ``config``, else the packaged arith config (under
    ``quick``, the demo's smoke-test sizes)."""
    return Path(config) if config else arith_config_path(quick)


def default_task_sets(config: str | Path | None, overrides: Sequence[str], defaults: Sequence[str]) -> list[str]:
    """A report's own task settings (``defaults``, e.g. harder problems than the config's RL task):
    they apply to the default config only, and only while ``overrides`` leave ``task.*`` alone,
    so a given config or task is used as it is."""
    touches_task = any(o.split("=", 1)[0].strip().split(".")[0] == "task" for o in overrides)
    return [] if config is not None or touches_task else list(defaults)


def step_task(cfg: Config, report: str) -> Task:
    """The task of ``cfg``, built once, for ``report``, which needs reasoning steps.

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
            f"task.name: {report} needs a task with reasoning steps (a step separator and a step "
            f"checker); task '{cfg.task.name}' has no {missing[2:]}"
        )
    return task


def task_phrase(cfg: Config) -> str:
    """The task as reports name it, e.g. ``arithmetic (min_ops=5, max_ops=7)``."""
    args = ", ".join(f"{k}={v}" for k, v in cfg.task.args.items())
    return f"{cfg.task.name} ({args})" if args else cfg.task.name
