"""A run directory belongs to one run.

:func:`hold` takes an exclusive lock (``fcntl.flock`` on ``RUN_DIR/.lock``, which then holds the
holder's PID) for as long as a run lives; a second run on the same directory fails at once with a
one-line error naming that PID. The kernel drops the lock when its process dies, so a killed run
never leaves a stale lock. The lock is re-entrant within a process (the command line takes it
before the run is built, the trainer again while it runs). Not for a shared file system whose locks
are advisory across machines (NFS without lockd).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from creditrl.errors import ConfigError

LOCK = ".lock"
RUN_STATE = "run.json"  # what a run started from (its init path), for a resume before any checkpoint
RUN_FILES = (
    "config.yaml",
    RUN_STATE,
    "metrics.jsonl",
    "completions.jsonl",
    "checkpoints",
    "inspect",
    "launch.json",
    "final",
    "tensorboard",  # its event files would otherwise mix with a new run's
)
log = logging.getLogger("creditrl")

_held: dict[Path, tuple[int, int]] = {}  # this process's locks: resolved run dir -> (fd, depth)


def _drop_in_child() -> None:
    """A forked child (a worker process) must not hold the run's lock: it would outlive a killed run."""
    for fd, _ in _held.values():
        os.close(fd)
    _held.clear()


os.register_at_fork(after_in_child=_drop_in_child)


class RunDirBusy(ConfigError):
    """Another process holds the run directory's lock."""


@contextmanager
def hold(run_dir: Path) -> Iterator[None]:
    """Hold ``run_dir``'s lock for the block (created with the directory if missing). A directory
    it created is removed again when the run leaves nothing but the lock (a config error, say); one
    it cannot write is a one-line error."""
    key = Path(run_dir).resolve()
    created = False
    if key not in _held:
        created = not key.exists()
        _held[key] = (_lock(run_dir, key), 0)
    fd, depth = _held[key]
    _held[key] = (fd, depth + 1)
    try:
        yield
    finally:
        fd, depth = _held[key]
        if depth > 1:
            _held[key] = (fd, depth - 1)
        else:
            del _held[key]
            os.ftruncate(fd, 0)
            if created and [p.name for p in key.iterdir()] == [LOCK]:  # nothing of a run: leave no trace
                (key / LOCK).unlink()
                key.rmdir()
            os.close(fd)  # closing the last descriptor releases the flock


def _lock(run_dir: Path, key: Path) -> int:
    """The descriptor of ``key``'s lock file, locked, holding this process's PID."""
    try:
        key.mkdir(parents=True, exist_ok=True)
        fd = os.open(key / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise ConfigError(f"cannot write the run directory {run_dir}: {reason}; choose another --run-dir") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise RunDirBusy(
            f"{run_dir} is in use by another run (PID {holder}); wait for it to end or choose another --run-dir"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def holds_run(run_dir: Path) -> bool:
    """Whether ``run_dir`` already holds a run: metrics rows or checkpoints."""
    run_dir = Path(run_dir)
    metrics = run_dir / "metrics.jsonl"
    ckpts = run_dir / "checkpoints"
    return (metrics.exists() and metrics.stat().st_size > 0) or (ckpts.is_dir() and any(ckpts.iterdir()))


def check_fresh(run_dir: Path, *, overwrite: bool = False) -> None:
    """Before a new run in ``run_dir``: fail if it already holds one, or with ``overwrite`` clear it."""
    if not holds_run(run_dir):
        return
    if overwrite:
        clear_run(run_dir)
        return
    raise ConfigError(
        f"{run_dir} already holds a run (metrics.jsonl or checkpoints): continue it with --resume {run_dir}, "
        "or start afresh with --overwrite"
    )


def clear_run(run_dir: Path) -> None:
    """Remove a run's files from ``run_dir`` (:data:`RUN_FILES`); anything else there stays."""
    for name in RUN_FILES:
        path = Path(run_dir) / name
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()


def remove_partial_checkpoints(run_dir: Path) -> list[Path]:
    """Delete the ``checkpoints/*.tmp`` folders (and a stale ``latest.tmp``) a killed write left;
    returns what was removed."""
    ckpts = Path(run_dir) / "checkpoints"
    removed = sorted(ckpts.glob("*.tmp")) if ckpts.is_dir() else []
    for path in removed:
        shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
    if removed:
        log.warning("creditrl: removed %d partial checkpoint write(s) in %s", len(removed), ckpts)
    return removed


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """``metrics.jsonl``'s rows, a partial last line that a kill left dropped with a warning
    (:func:`creditrl.inspect.data.read_metrics`, imported when called: this module stays light, so
    the command line takes the lock before it imports torch)."""
    from creditrl.inspect.data import read_metrics as read

    return read(path)


def launch_rank() -> int:
    """This process's rank in a torchrun / accelerate launch (``RANK``; 0 without one), known
    before the process group exists."""
    return int(os.environ.get("RANK", "0"))


def write_metrics(path: Path, rows: list[dict[str, Any]]) -> None:
    """Rewrite ``metrics.jsonl`` with ``rows``, atomically."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w") as f:
        f.write("".join(json.dumps(r) + "\n" for r in rows))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
