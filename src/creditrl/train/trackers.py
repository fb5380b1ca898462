"""Experiment trackers, as TRL's ``report_to``: ``train.report_to`` names any of ``tensorboard``,
``wandb``, ``mlflow`` and ``trackio`` (each where its library is installed: the ``trackers`` extra).

Every tracker gets each ``metrics.jsonl`` row under the same ``/``-grouped names, at the row's
``iteration`` as its step, and the run's resolved config as hyperparameters. ``wandb`` follows
``WANDB_MODE`` (``offline`` writes under ``RUN_DIR/wandb``); ``tensorboard`` writes to
``RUN_DIR/tensorboard``; ``mlflow`` logs to ``MLFLOW_TRACKING_URI`` (default ``RUN_DIR/mlruns``);
``trackio`` to its local store. On a resume, TensorBoard drops what it holds from the first replayed
iteration on (its ``purge_step``); the others start a new run of their own.

``train.log_completions``: each iteration's sample completions (:data:`COMPLETION_COLUMNS`) go to
TensorBoard as a markdown table and to wandb as a ``wandb.Table``; mlflow and trackio skip them.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from creditrl.errors import ConfigError

__all__ = ["COMPLETION_COLUMNS", "TRACKERS", "Tracker", "make_trackers", "markdown_table", "numeric"]

# the fields of one logged completion (train.log_completions), in the order tables show them
COMPLETION_COLUMNS = ("iteration", "row", "group", "reward", "advantage", "prompt", "completion")


def numeric(row: dict[str, Any]) -> dict[str, float]:
    """The finite numbers of a metrics row (the iteration itself is the step, not a metric)."""
    out = {}
    for key, value in row.items():
        if key != "iteration" and isinstance(value, (int, float)) and not isinstance(value, bool):
            if math.isfinite(value):
                out[key] = float(value)
    return out


def _flat(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested config as ``section.key`` -> scalar (lists and dicts as JSON text)."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and prefix == "":
            out.update(_flat(value, name + "."))
        elif isinstance(value, (bool, int, float, str)) or value is None:
            out[name] = "null" if value is None else value
        else:
            out[name] = json.dumps(value)
    return out


def markdown_table(completions: list[dict[str, Any]]) -> str:
    """The completions as a markdown table of :data:`COMPLETION_COLUMNS` (``|`` escaped, line
    breaks as ``<br>``, so that every completion stays one table row)."""

    def cell(value: Any) -> str:
        text = f"{value:.4g}" if isinstance(value, float) else str(value)
        return text.replace("\\", "\\\\").replace("|", "\\|").replace("\r", "").replace("\n", "<br>")

    lines = ["| " + " | ".join(COMPLETION_COLUMNS) + " |", "|" + "---|" * len(COMPLETION_COLUMNS)]
    lines += ["| " + " | ".join(cell(c[k]) for k in COMPLETION_COLUMNS) + " |" for c in completions]
    return "\n".join(lines)


class Tracker(Protocol):
    """One tracker of a run (``log_completions`` is a no-op for one without tables), made with
    ``(run_dir, config, first)``: ``first`` is the first iteration this process logs (after a
    resume, what the tracker holds from there on is superseded)."""

    def log(self, row: dict[str, Any]) -> None: ...

    def log_completions(self, iteration: int, completions: list[dict[str, Any]]) -> None: ...

    def close(self) -> None: ...


class TensorBoard:
    def __init__(self, run_dir: Path, config: dict[str, Any], first: int = 0) -> None:
        from torch.utils.tensorboard import SummaryWriter

        # purge_step: TensorBoard hides the events of earlier files from that step on
        self.writer = SummaryWriter(log_dir=str(run_dir / "tensorboard"), purge_step=first or None)
        self.writer.add_text("config", "\n".join(f"    {k}: {v}" for k, v in _flat(config).items()))

    def log(self, row: dict[str, Any]) -> None:
        for key, value in numeric(row).items():
            self.writer.add_scalar(key, value, global_step=row["iteration"])
        self.writer.flush()

    def log_completions(self, iteration: int, completions: list[dict[str, Any]]) -> None:
        self.writer.add_text("completions", markdown_table(completions), global_step=iteration)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class Wandb:
    def __init__(self, run_dir: Path, config: dict[str, Any], first: int = 0) -> None:
        import wandb

        self.wandb = wandb
        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT", "creditrl"),
            name=run_dir.name,
            dir=str(run_dir),
            config=config,
            reinit="create_new",
        )

    def log(self, row: dict[str, Any]) -> None:
        self.run.log(numeric(row), step=row["iteration"])

    def log_completions(self, iteration: int, completions: list[dict[str, Any]]) -> None:
        data = [[c[k] for k in COMPLETION_COLUMNS] for c in completions]
        self.run.log({"completions": self.wandb.Table(columns=list(COMPLETION_COLUMNS), data=data)}, step=iteration)

    def close(self) -> None:
        self.run.finish()


class Mlflow:
    def __init__(self, run_dir: Path, config: dict[str, Any], first: int = 0) -> None:
        import mlflow

        self.mlflow = mlflow
        if "MLFLOW_TRACKING_URI" not in os.environ:
            mlflow.set_tracking_uri((run_dir / "mlruns").resolve().as_uri())
        mlflow.start_run(run_name=run_dir.name)
        mlflow.log_params({k: str(v)[:250] for k, v in _flat(config).items()})

    def log(self, row: dict[str, Any]) -> None:
        self.mlflow.log_metrics({k.replace(":", "_"): v for k, v in numeric(row).items()}, step=row["iteration"])

    def log_completions(self, iteration: int, completions: list[dict[str, Any]]) -> None:
        """Skipped: the completions are in ``RUN_DIR/completions.jsonl``."""

    def close(self) -> None:
        self.mlflow.end_run()


class Trackio:
    def __init__(self, run_dir: Path, config: dict[str, Any], first: int = 0) -> None:
        import trackio

        self.trackio = trackio
        trackio.init(project=os.environ.get("TRACKIO_PROJECT", "creditrl"), name=run_dir.name, config=config)

    def log(self, row: dict[str, Any]) -> None:
        self.trackio.log(numeric(row), step=row["iteration"])

    def log_completions(self, iteration: int, completions: list[dict[str, Any]]) -> None:
        """Skipped: the completions are in ``RUN_DIR/completions.jsonl``."""

    def close(self) -> None:
        self.trackio.finish()


# name -> (tracker, the module its library imports as, the pip package)
TRACKERS: dict[str, tuple[Callable[[Path, dict[str, Any], int], Tracker], str, str]] = {
    "tensorboard": (TensorBoard, "tensorboard", "tensorboard"),
    "wandb": (Wandb, "wandb", "wandb"),
    "mlflow": (Mlflow, "mlflow", "mlflow"),
    "trackio": (Trackio, "trackio", "trackio"),
}


def make_trackers(names: list[str], run_dir: Path, config: dict[str, Any], first: int = 0) -> list[Tracker]:
    """The trackers ``names`` (``train.report_to``) of a run that logs from iteration ``first`` on;
    a tracker whose library is missing is a one-line error naming what to install."""
    import importlib.util

    out = []
    for name in names:
        if name == "none":
            continue
        if name not in TRACKERS:
            raise ConfigError(f"train.report_to: unknown tracker '{name}'; valid: none, {', '.join(TRACKERS)}")
        make, module, package = TRACKERS[name]
        if importlib.util.find_spec(module) is None:
            raise ConfigError(
                f"train.report_to: '{name}' needs the '{package}' package: pip install {package} "
                "(or pip install 'creditrl[trackers]')"
            )
        out.append(make(Path(run_dir), config, first))
    return out
