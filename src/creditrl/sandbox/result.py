"""The limits of a sandboxed run and the record of what it did."""

from __future__ import annotations

import math
import signal
from dataclasses import dataclass, field

__all__ = ["Limits", "SandboxResult", "reason_for"]

_CPU_SLACK_S = 0.25  # the CPU time a killed process reports lags the limit check


@dataclass(frozen=True)
class Limits:
    """Resource limits of one run (per process but ``memory_mb``; RLIMIT_NPROC counts processes
    and threads).

    ``memory_mb`` bounds the whole run where a memory cgroup can be made (root, or a delegated
    cgroup v2 subtree; ``memcg`` in :attr:`SandboxResult.isolation`): every page it pins, shared
    memory and the files of its working directory included; a program past it is killed by the
    kernel (``memory limit``). Elsewhere it is an address-space limit per process (RLIMIT_AS), so a
    run uses at most about ``processes * memory_mb`` of anonymous memory (``MemoryError``), and
    the filter refuses the shared memory (``memfd_create``, ``shmget``) that RLIMIT_AS does not see.
    """

    timeout_s: float = 5.0  # wall time, then the group is killed
    memory_mb: int = 512  # the run's memory cgroup; RLIMIT_AS per process without one
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
    ``exit status N``, ``setup failed: ...`` or ``invalid source: ...`` (no process started).
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


def reason_for(
    returncode: int | None,
    *,
    timed_out: bool = False,
    flooded: bool = False,
    setup_error: str | None = None,
    cpu_s: float | None = None,
    cpu_limit_s: int | None = None,
    oom_kills: int = 0,
) -> str:
    """The :attr:`SandboxResult.reason` of a run (``""`` when it went well).

    A limit is named only when it fired: ``memory limit`` when the run's memory cgroup counted an
    OOM kill (``oom_kills``), ``cpu limit`` when the program died of SIGXCPU after its soft CPU limit
    ``cpu_limit_s`` or of SIGKILL after the hard one (``cpu_limit_s + 1``, what a program that
    catches SIGXCPU meets), by its CPU time ``cpu_s``. What the program prints never counts: a
    ``MemoryError`` under RLIMIT_AS alone (no cgroup) is its ``exit status``.
    """
    if setup_error:
        return f"setup failed: {setup_error}"
    if timed_out:
        return "timeout"
    if flooded:
        return "output limit"
    if returncode == 0:
        return ""
    if oom_kills > 0:
        return "memory limit"
    if returncode is not None and returncode < 0:
        signum = -returncode
        if cpu_s is not None and cpu_limit_s is not None:
            reached = {signal.SIGXCPU: cpu_limit_s, signal.SIGKILL: cpu_limit_s + 1}.get(signum)
            if reached is not None and cpu_s >= reached - _CPU_SLACK_S:
                return "cpu limit"
        if signum == signal.SIGXFSZ:
            return "file size limit"
        try:
            return f"signal {signal.Signals(signum).name}"
        except ValueError:
            return f"signal {signum}"
    return f"exit status {returncode}"
