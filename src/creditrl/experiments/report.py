"""Summaries of finished runs: the comparison table, ``report.md``, accuracy plots, and the
results pages under ``docs/results/`` that the measuring commands write (``--results PATH``)."""

from __future__ import annotations

import contextlib
import io
import os
import platform
import re
import resource
import shlex
import shutil
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; no display on servers or in CI
import matplotlib.pyplot as plt  # noqa: E402


def command_line(argv: list[str] | None = None, module: str | None = None) -> str:
    """The command as typed: ``creditrl findings``, ``python benchmarks/credit_speed.py`` or, for a
    module run with ``-m`` (``module``, by default ``__main__``'s), ``python -m studies.prm``."""
    argv = list(sys.argv if argv is None else argv)
    prog = Path(argv[0]).name
    if module is None:
        spec = getattr(sys.modules.get("__main__"), "__spec__", None)
        module = spec.name if spec is not None and Path(argv[0]).stem == spec.name.rsplit(".", 1)[-1] else None
    if prog in ("creditrl", "__main__.py"):
        head = ["creditrl"]
    elif module:
        head = ["python", "-m", module]
    else:
        head = ["python", os.path.relpath(argv[0])]
    return " ".join(shlex.quote(a) for a in head + argv[1:])


def _cpu_model() -> str:
    try:
        return next(
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        )
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def cpu_kind() -> str:
    """The kind of CPU a run's numbers belong to (another kind takes other times and, from the same
    seed, trains other numbers): model, the instruction set torch's kernels use, cores."""
    import torch

    return f"{_cpu_model()}, {torch.backends.cpu.get_cpu_capability()}, {os.cpu_count()} cores"


def machine() -> str:
    """This machine in one phrase: CPU model, cores, memory, torch version and threads, GPU if any."""
    import torch

    cpu = _cpu_model()
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    gpu = f", GPU {torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else ", no GPU"
    return (
        f"{os.cpu_count()} cores ({cpu}), {memory:.0f} GiB, torch {torch.__version__} with "
        f"{torch.get_num_threads()} threads{gpu}"
    )


def task_phrase(cfg: Any) -> str:
    """The task of a config as pages name it, e.g. ``arithmetic (min_ops=5, max_ops=7)``."""
    args = ", ".join(f"{k}={v}" for k, v in cfg.task.args.items())
    return f"{cfg.task.name} ({args})" if args else cfg.task.name


def utc_stamp(seconds: float | None = None) -> str:
    """``seconds`` since the epoch (now by default) as a results page dates it."""
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(seconds))


def results_page(title: str, body: str, command: str | None = None, stamp: str | None = None) -> str:
    """A results page: its title, the command that wrote it, the machine and the date (``stamp``)."""
    stamp = stamp or utc_stamp()
    return (
        f"# {title}\n\nWritten by `{command or command_line()}` on {stamp}; machine: {machine()}.\n\n{body.strip()}\n"
    )


def write_results(
    path: str | Path | None,
    title: str,
    body: str,
    command: str | None = None,
    figures: dict[str, Path] | None = None,
    stamp: str | None = None,
) -> Path | None:
    """Write :func:`results_page` to ``path`` (unless None) and copy ``figures`` (``{file name:
    source}``, linked by name from ``body``) beside it; returns the path."""
    if path is None:
        return None
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    for name, source in (figures or {}).items():
        if Path(source).resolve() != (path.parent / name).resolve():  # a run kept beside its page
            shutil.copyfile(source, path.parent / name)
    path.write_text(results_page(title, body, command, stamp))
    print(f"results page: {path}", flush=True)
    return path


def publish_report(report: Path, results: str | Path | None, title: str) -> Path | None:
    """A run's ``report.md`` as a results page at ``results`` (its first heading replaced by
    ``title``; every ``plots/NAME.png`` it shows copied beside the page as ``<page>_NAME.png``)."""
    if results is None:
        return None
    stem, text = Path(results).stem, Path(report).read_text()
    body = text.split("\n", 1)[1] if text.startswith("# ") else text
    figures = {}
    for name in sorted(set(re.findall(r"\(plots/([\w.-]+\.png)\)", body))):
        figures[f"{stem}_{name}"] = Path(report).parent / "plots" / name
        body = body.replace(f"(plots/{name})", f"({stem}_{name})")
    return write_results(results, title, body, figures=figures)


class _Tee(io.TextIOBase):
    def __init__(self, *streams: Any) -> None:
        self.streams = streams

    def write(self, text: str) -> int:
        for s in self.streams:
            s.write(text)
        return len(text)

    def flush(self) -> None:
        for s in self.streams:
            s.flush()


@contextlib.contextmanager
def printed_results(path: str | Path | None, title: str) -> Iterator[None]:
    """Everything printed inside the block also becomes the body of a results page at ``path``
    (a benchmark script's ``--results PAGE``); nothing is written when ``path`` is None."""
    if path is None:
        yield
        return
    captured = io.StringIO()
    with contextlib.redirect_stdout(_Tee(sys.stdout, captured)):
        yield
    text = captured.getvalue()
    if not any(line.startswith("|") for line in text.splitlines()):  # aligned plain text: keep it as printed
        text = f"```\n{text.rstrip()}\n```"
    write_results(path, title, text)


def peak_rss_mb() -> float:
    """This process's own peak resident set so far (MB): ``VmHWM``, since a child's ``ru_maxrss`` can
    be its parent's (Linux carries the larger across the exec); ``ru_maxrss`` where /proc has none."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024  # kB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


@dataclass
class ArmSummary:
    name: str
    before_accuracy: float
    after_accuracy: float
    best_accuracy: float
    before_step_accuracy: float
    after_step_accuracy: float
    samples_to_target: int | None  # first evaluated sample count with accuracy >= target
    samples: int
    tokens: int
    wall_s: float  # RL wall time (rollout + score + credit + update), evaluations excluded

    @property
    def gain_points(self) -> float:
        return 100.0 * (self.after_accuracy - self.before_accuracy)


def eval_rows(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in history if "eval/accuracy" in r]


def summarise(name: str, history: list[dict[str, Any]], target: float) -> ArmSummary:
    evals = eval_rows(history)
    if not evals:
        raise ValueError(f"arm '{name}' has no evaluation rows")
    first, last = evals[0], evals[-1]
    reached = next((r["samples/total"] for r in evals if r["eval/accuracy"] >= target), None)
    return ArmSummary(
        name=name,
        before_accuracy=first["eval/accuracy"],
        after_accuracy=last["eval/accuracy"],
        best_accuracy=max(r["eval/accuracy"] for r in evals),
        before_step_accuracy=first["eval/step_accuracy"],
        after_step_accuracy=last["eval/step_accuracy"],
        samples_to_target=reached,
        samples=history[-1]["samples/total"],
        tokens=history[-1]["tokens/total"],
        wall_s=history[-1]["time/total_s"],
    )


def markdown_table(arms: list[ArmSummary], target: float) -> str:
    head = (
        "| arm | exact match before | after | gain (points) | best | step acc before | after "
        f"| samples to {100 * target:.0f}% | samples | tokens | RL wall time |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|\n"
    )
    rows = []
    for a in arms:
        reach = "not reached" if a.samples_to_target is None else f"{a.samples_to_target:,}"
        rows.append(
            f"| {a.name} | {100 * a.before_accuracy:.1f}% | {100 * a.after_accuracy:.1f}% | {a.gain_points:+.1f} "
            f"| {100 * a.best_accuracy:.1f}% | {100 * a.before_step_accuracy:.1f}% | {100 * a.after_step_accuracy:.1f}%"
            f" | {reach} | {a.samples:,} | {a.tokens:,} | {a.wall_s:.0f} s |"
        )
    return head + "\n".join(rows) + "\n"


# one style per arm, so coinciding lines stay distinguishable (hollow markers over filled ones)
ARM_STYLES = [("o", "-", "full"), ("s", "--", "none"), ("^", ":", "none"), ("D", "-.", "none")]


def accuracy_limits(values: list[float]) -> tuple[float, float]:
    """A percentage axis within [0, 100]: from 0 up to a little above the largest value (at least 5)."""
    return 0.0, min(100.0, max(5.0, 1.1 * max(values, default=0.0)))


def plot_accuracy(histories: dict[str, list[dict[str, Any]]], path: Path, title: str) -> None:
    """Held-out exact match and step accuracy against RL samples, one line (style) per arm."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), dpi=120)
    seen: list[list[float]] = [[], []]
    for k, (name, history) in enumerate(histories.items()):
        evals = eval_rows(history)
        xs = [r["samples/total"] for r in evals]
        marker, line, fill = ARM_STYLES[k % len(ARM_STYLES)]
        for ax, key, values in zip(axes, ("eval/accuracy", "eval/step_accuracy"), seen):
            ys = [100 * r[key] for r in evals]
            values += ys
            ax.plot(xs, ys, marker=marker, linestyle=line, fillstyle=fill, markersize=7 - k, label=name)
    for ax, ylabel, values in zip(axes, ("held-out exact match (%)", "held-out step accuracy (%)"), seen):
        ax.set_xlabel("RL samples")
        ax.set_ylabel(ylabel)
        ax.set_ylim(*accuracy_limits(values))
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
