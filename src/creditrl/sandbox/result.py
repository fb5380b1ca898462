"""The limits of a sandboxed run and the record of what it did."""

from __future__ import annotations

import math
import signal
from dataclasses import dataclass, field

__all__ = ["Limits", "SandboxResult", "reason_for"]


@dataclass(frozen=True)
class Limits:
    """Resource limits of one run (per process; RLIMIT_NPROC counts processes and threads).

    Memory is an address-space limit per process, so a run uses at most about
    ``processes * memory_mb``; there is no cgroup.
    """

    timeout_s: float = 5.0  # wall time, then the group is killed
    memory_mb: int = 512  # RLIMIT_AS per process
    cpu_s: int | None = None  # RLIMIT_CPU per process; None = ceil(timeout_s) + 1
    processes: int = 16  # RLIMIT_NPROC for the run's uid (threads count)
    file_mb: int = 16  # RLIMIT_FSIZE: largest file it may write
    disk_mb: int = 32  # size of the tmpfs working directory
    open_files: int = 64  # RLIMIT_NOFILE
    output_bytes: int = 64 * 1024  # kept of stdout and of stderr each

    def __post_init__(self) -> None:
        for name, low in (
            ("timeout_s", 0.0),
            ("memory_mb", 32),
            ("processes", 1),
            ("file_mb", 1),
            ("disk_mb", 1),
            ("open_files", 8),
            ("output_bytes", 1),
        ):
            value = getattr(self, name)
            if not value >= low or (name == "timeout_s" and not 0 < value < math.inf):
                raise ValueError(f"Limits.{name}: must be {'> 0 and finite' if low == 0 else f'>= {low}'}, got {value}")
        if self.cpu_s is not None and self.cpu_s < 1:
            raise ValueError(f"Limits.cpu_s: must be >= 1 or None, got {self.cpu_s}")

    def rlimits(self) -> dict[str, int]:
        return {
            "cpu_s": self.cpu_s or math.ceil(self.timeout_s) + 1,
            "memory_bytes": self.memory_mb << 20,
            "file_bytes": self.file_mb << 20,
            "open_files": self.open_files,
            "processes": self.processes,
        }


@dataclass(frozen=True)
class SandboxResult:
    """What a sandboxed run did.

    ``ok`` is True iff the program exited with status 0 within every limit. ``returncode`` is
    the exit status, ``-N`` for death by signal N (a kill on timeout gives ``-9``) and 125 when
    the sandbox could not be set up. ``reason`` is ``""`` when ok, else one of ``timeout``,
    ``output limit``, ``cpu limit``, ``memory limit``, ``file size limit``, ``signal NAME``,
    ``exit status N`` or ``setup failed: ...``.
    """

    ok: bool
    returncode: int | None
    stdout: str
    stderr: str
    timed_out: bool
    reason: str
    isolation: tuple[str, ...] = ()  # the isolation that held (module docstring)
    wall_s: float = 0.0
    output_truncated: bool = False  # stdout or stderr was cut at ``output_bytes``
    channel: bytes = field(default=b"", repr=False)  # what the program wrote to fd 3 (the harness)

    @property
    def network_isolated(self) -> bool:
        return "net" in self.isolation


def reason_for(returncode: int | None, timed_out: bool, flooded: bool, stderr: str, setup_error: str | None) -> str:
    """The :attr:`SandboxResult.reason` of a run (``""`` when it went well)."""
    if setup_error:
        return f"setup failed: {setup_error}"
    if timed_out:
        return "timeout"
    if flooded:
        return "output limit"
    if returncode == 0:
        return ""
    if returncode is not None and returncode < 0:
        named = {signal.SIGXCPU: "cpu limit", signal.SIGXFSZ: "file size limit"}
        try:
            return named.get(-returncode, f"signal {signal.Signals(-returncode).name}")
        except ValueError:
            return f"signal {-returncode}"
    if "MemoryError" in stderr[-2000:]:
        return "memory limit"
    return f"exit status {returncode}"
