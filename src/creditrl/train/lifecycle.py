"""How a training run stops: Ctrl-C (SIGINT) and SIGTERM alike, and the command that resumes it.

While :class:`Signals` is active, either signal raises :class:`Interrupted` in the main thread.
An iteration changes the run's state only from its score stage on, so the RL loop
:meth:`Signals.hold` s a signal from there until the iteration is logged and checkpointed, and
:meth:`Signals.release` raises it then: the trainer stops at a finished iteration. A second signal
while one is held stops at once (the iteration is abandoned and nothing of it is saved). Not
installed in a data-parallel launch (``torchrun`` forwards the signal to every rank, which would
have to agree on where to stop) nor off the main thread (Python delivers signals there only).
"""

from __future__ import annotations

import errno
import os
import shlex
import signal
import threading
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
# what a full disk, a quota or a read-only / unwritable directory raises
WRITE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM)


def resume_command(run_dir: Path) -> str:
    """The command line that continues the run in ``run_dir``."""
    return f"creditrl train --resume {shlex.quote(str(run_dir))}"


def os_error_line(exc: OSError) -> str:
    """An OSError as ``<file>: <reason>`` (its errno's text, without Python's ``[Errno N]``)."""
    reason = (exc.strerror or os.strerror(exc.errno)) if exc.errno else str(exc)
    return f"{exc.filename}: {reason}" if exc.filename else reason


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM stopped the run. ``str()`` is the one line the command line prints (empty
    until the trainer says where it stopped); the process's exit status is ``exit_code`` (128 + the
    signal's number, as a shell reports it)."""

    def __init__(self, signum: int, at_once: bool = False, message: str = "") -> None:
        super().__init__(message)
        self.signum = signum
        self.at_once = at_once  # a second signal: the iteration under way was abandoned

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name

    @property
    def exit_code(self) -> int:
        return 128 + self.signum

    def with_message(self, message: str) -> Interrupted:
        return Interrupted(self.signum, self.at_once, message)


class Signals:
    """SIGINT and SIGTERM raise :class:`Interrupted` while the block runs (``active``, on the main
    thread, outside a data-parallel launch); the handlers that were there before come back after
    it. Nested blocks are fine."""

    def __init__(self, active: bool = True) -> None:
        launched = int(os.environ.get("WORLD_SIZE", "1")) > 1  # torchrun / accelerate launch
        self.active = active and not launched and threading.current_thread() is threading.main_thread()
        self.pending: int | None = None  # a signal held until release()
        self.holding = False
        self._pid = os.getpid()
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> Signals:
        if self.active:
            for signum in STOP_SIGNALS:
                if signal.getsignal(signum) is not signal.SIG_IGN:  # as `nohup` or a shell's `&` left it
                    self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, kind: type | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if os.getpid() != self._pid:  # a forked worker inherited the handler: the trainer ends it
            return
        if self.holding and self.pending is None:
            self.pending = signum
            return
        raise Interrupted(signum, at_once=self.holding)

    def hold(self) -> None:
        """From here the run's state changes: a signal waits for :meth:`release`."""
        self.holding = True

    def release(self) -> None:
        """The iteration is finished and saved: raise a signal that came meanwhile."""
        self.holding = False
        signum, self.pending = self.pending, None
        if signum is not None:
            raise Interrupted(signum)

    def reset(self) -> None:
        """After an :class:`Interrupted` was caught: nothing held or pending."""
        self.holding, self.pending = False, None


# the keys ``--resume --set`` may change: none alters the iterations already trained
RESUMABLE = (
    "train.iterations",
    "train.max_tokens",
    "train.eval_every",
    "train.checkpoint_every",
    "train.inspect_every",
    "train.report_to",
    "train.log_completions",
    "train.progress",
    "train.threads",
    "train.push_to_hub",
)


def _sections(config: dict[str, Any]) -> dict[str, Any]:
    """A config's ``section.key`` -> value (a nested value, such as ``task.args``, as a whole)."""
    out: dict[str, Any] = {}
    for section, keys in config.items():
        out.update({f"{section}.{k}": v for k, v in keys.items()} if isinstance(keys, dict) else {section: keys})
    return out


def checked_resume_config(path: Path, overrides: list[str], *, launched: bool = False) -> Any:
    """A run's saved config (``path``) with ``overrides`` applied, when each changes a key of
    :data:`RESUMABLE`; otherwise a :class:`~creditrl.errors.ConfigError` naming the first other key.
    ``launched`` (a data-parallel launch): a ``backend.learner=fsdp`` run is refused, its checkpoints
    hold the weights but not the sharded optimizer state."""
    from creditrl.config import load_config
    from creditrl.errors import ConfigError

    saved = load_config(path)
    if launched and saved.backend.learner == "fsdp":
        raise ConfigError(
            f"{path.parent}: resuming a backend.learner=fsdp run is not supported (its checkpoints hold "
            "the weights but not the sharded optimizer state)"
        )
    if not overrides:
        return saved
    cfg = load_config(path, overrides)
    before, after = _sections(saved.to_dict()), _sections(cfg.to_dict())
    changed = [key for key in {**before, **after} if before.get(key) != after.get(key)]
    refused = [key for key in changed if key not in RESUMABLE]
    if refused:
        raise ConfigError(
            f"--resume: --set {refused[0]} would change what the run trains; "
            f"a resumed run may change only {', '.join(RESUMABLE)}"
        )
    return cfg
