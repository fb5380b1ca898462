"""Run an untrusted Python program in a sandboxed process and collect what it did.

:func:`run_python` starts :mod:`creditrl.sandbox._launcher` in a new session with an empty
environment; the launcher limits and isolates itself (see its docstring) and execs
``python -I -B main.py`` in a fresh temporary directory. This module is the parent's side:

* it waits at most ``timeout_s`` of wall time, then kills the run (its PID namespace, and its
  process group as a backstop) and returns only once nothing of it is left;
* it reads stdout, stderr and the harness channel concurrently, keeping at most
  ``output_bytes`` of stdout and of stderr (16 times that of the channel) and killing the
  program once one of them has written 8 times that, so a huge output never grows the
  parent's memory;
* it removes the working directory afterwards, whatever the program left in it.

No orphans: every run ends in the launcher, which also dies with its caller's thread
(``PR_SET_PDEATHSIG``): it kills the PID namespace or, without one, every descendant (it is a
child subreaper, so a ``setsid`` double-forked grandchild is still below it), removes the memory
cgroup and the working directory, and exits; so nothing a program starts outlives it.

Isolation depends on privileges; :attr:`SandboxResult.isolation` says what held:

==========  ==================================================================  ==============
name        meaning                                                             needs
==========  ==================================================================  ==============
uid         runs as a fresh per-run uid: RLIMIT_NPROC applies, it cannot        root
            signal the parent or other runs, nor read their files
net         own network namespace with only a down loopback: no connect at all  root, or
                                                                                user namespaces
pid         own PID namespace; everything in it dies with the program           root
proc        a /proc that shows only the sandbox's processes                     root
minroot     its root is a fresh tmpfs holding only the interpreter, its stdlib  root
            (site-packages empty), the shared libraries, a few devices, its
            /proc and the working directory, all read-only but that: no other
            host file exists for it, the project included (:mod:`._rootfs`)
readonly    all it sees is read-only except the working directory               root
tmpfs       the working directory is a size-capped tmpfs (``disk_mb``)          root
hidden      the creditrl package (its bundled tests) and ``hidden_paths`` are   root
            out of its root, or covered by empty directories where an exposed
            tree holds them
ipc         own IPC / UTS namespaces                                            root
shm         own IPC namespace whose SysV shared-memory limits (kernel.shmmax,   root, or
            shmall, shmmni) are 0: no segment can be made                       user namespaces
memcg       a memory cgroup per run bounds the whole run at ``memory_mb``,      root, or a
            shared memory and files included; past it the kernel kills          delegated
            (``memory limit``); RLIMIT_AS without one (:mod:`._cgroup`)         cgroup v2
seccomp     a syscall filter refuses (EPERM) sockets other than AF_INET/6,      pyseccomp and
            socketpairs other than AF_UNIX stream, memfd, shmget, namespaces,   libseccomp
            mounts, ptrace, bpf, io_uring and more (:mod:`._seccomp`)           >= 2.5.0, any user
==========  ==================================================================  ==============

Not root (the documented fallback): the program runs as the caller's uid under the same
rlimits and ``seccomp`` filter, in network and IPC namespaces where unprivileged user namespaces
are enabled (``net`` and ``shm`` absent otherwise; as the caller's uid it could raise its IPC
namespace's limits again, so there the filter's ``shmget`` refusal is what holds); memory is
bounded per process by RLIMIT_AS (no ``memcg`` unless a v2 cgroup subtree is delegated to the
user); it can read the caller's files, write where the caller may (``/dev/shm`` included, outside
any memory bound), and signal the caller. Without pyseccomp or libseccomp the first run warns and
``seccomp`` is absent from every run's isolation. Whatever the privileges, the environment is
clean and the program runs the base interpreter of a virtual environment
(``sys._base_executable``), never the environment itself.
"""

from __future__ import annotations

import json
import os
import secrets
import selectors
import shutil
import signal
import site
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from creditrl.sandbox import _cleanup, _seccomp
from creditrl.sandbox.result import Limits, SandboxResult, reason_for

__all__ = ["Limits", "SandboxResult", "execute", "run_python"]

_LAUNCHER = Path(__file__).with_name("_launcher.py")
_PACKAGE_DIR = str(Path(__file__).resolve().parents[1])  # creditrl/: holds the bundled tests
# the base installation's third-party packages (and their .pth start-up hooks): empty in the minimal root
_SITE_PACKAGES = site.getsitepackages([sys.base_prefix, sys.base_exec_prefix])
_UID_BASE, _UID_SPAN = 2_000_000_000, 100_000_000  # per-run uids, far from any real account
_KILL_FACTOR = 8  # kill once an output exceeds this many times what is kept of it
_GRACE_S = 0.5  # after the launcher exits, how long to wait for pipes held by stragglers
_STOP_WAIT_S = 2.0  # how long the launcher gets to empty the namespace before the group is killed


def _interpreter() -> str:
    """The base interpreter (that of a virtual environment's home), symlinks resolved: the
    program runs it, so its root needs the Python installation but never the environment."""
    base = os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)
    return base if os.access(base, os.X_OK) else os.path.realpath(sys.executable)


def _exited(pid: int) -> bool:
    """Whether the launcher has exited, without reaping it: its pid (= the group id) stays
    reserved until :meth:`Popen.wait`, so the final ``killpg`` cannot hit a recycled group."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def _stop(proc: subprocess.Popen) -> None:
    """End a run and return once nothing of it is left.

    SIGTERM asks the launcher to kill the program's PID namespace (or, without one, every
    descendant) and wait until the kernel has emptied it (a plain SIGKILL to the group would return
    while the namespace is still being torn down), then remove the cgroup and the working
    directory; SIGKILL to the whole group is the backstop. The launcher is reaped last, so its
    pid, which is the group id, cannot be recycled before the ``killpg``.
    """
    try:
        os.kill(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    end = time.monotonic() + _STOP_WAIT_S
    while not _exited(proc.pid) and time.monotonic() < end:
        time.sleep(0.005)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def _reap_uid(uid: int) -> None:
    """Without a PID namespace, kill whatever still runs as the run's uid (kill(-1) as that uid)."""
    code = f"import os,signal;os.setgroups([]);os.setgid({uid});os.setuid({uid});os.kill(-1,signal.SIGKILL)"
    subprocess.run([sys.executable, "-I", "-S", "-c", code], env={}, capture_output=True, timeout=10, check=False)


def _encoded(source: str) -> bytes | str:
    """The program's bytes, or why it has none: a lone surrogate (not one that ``surrogateescape``
    decoding made of a stray byte) has no UTF-8 encoding."""
    try:
        return source.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError as exc:
        return f"invalid source: character {source[exc.start]!r} at index {exc.start} is not encodable as UTF-8"


def _start(cfg: dict, program: bytes, fds: list[int], workdir: str) -> subprocess.Popen:
    """Start the launcher: its source by descriptor (its command line names no host path), the
    configuration as the first line of its stdin, then the program."""
    source_fd = os.open(_LAUNCHER, os.O_RDONLY | os.O_CLOEXEC)
    try:
        proc = subprocess.Popen(
            [cfg["python"], "-I", "-S", f"/dev/fd/{source_fd}"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            pass_fds=[source_fd, *fds],
            start_new_session=True,
            env={},
            cwd=workdir,
        )
    finally:
        os.close(source_fd)
    try:
        proc.stdin.write(json.dumps(cfg).encode() + b"\n" + program)
        proc.stdin.close()
    except BrokenPipeError:
        pass
    return proc


def execute(source: str, limits: Limits, *, hidden_paths: tuple[str, ...] = (), channel: bool = False) -> SandboxResult:
    """Run ``source`` as ``main.py`` under ``limits``; with ``channel``, fd 3 is a pipe whose
    bytes (at most ``limits.output_bytes * 16``) come back in :attr:`SandboxResult.channel`.
    A source that cannot be encoded (a lone surrogate) gives a result whose reason says so."""
    start = time.monotonic()
    program = _encoded(source)
    if isinstance(program, str):
        return SandboxResult(ok=False, returncode=None, stdout="", stderr="", timed_out=False, reason=program)
    root = os.geteuid() == 0
    uid = _UID_BASE + secrets.randbelow(_UID_SPAN) if root else None
    workdir = tempfile.mkdtemp(prefix="creditrl-sandbox-")
    status_r, status_w = os.pipe()
    chan_r, chan_w = os.pipe() if channel else (None, None)
    cfg = {
        "python": _interpreter(),
        "package_dir": str(_LAUNCHER.parent),
        "parent_pid": os.getpid(),
        "site_packages": _SITE_PACKAGES,
        "seccomp": None if (bpf := _seccomp.filter_program()) is None else bpf.hex(),
        "workdir": workdir,
        "uid": uid,
        "hidden": [_PACKAGE_DIR, *map(str, hidden_paths)],
        "limits": limits.rlimits(),
        "disk_bytes": limits.disk_mb << 20,
        "status_fd": status_w,
        "channel_fd": chan_w,
    }
    proc = None
    try:
        try:
            proc = _start(cfg, program, [fd for fd in (status_w, chan_w) if fd is not None], workdir)
            for fd in (status_w, chan_w):
                if fd is not None:
                    os.close(fd)
            status_w = chan_w = None
            out_fd, err_fd = proc.stdout.fileno(), proc.stderr.fileno()
            caps = {out_fd: limits.output_bytes, err_fd: limits.output_bytes, status_r: 1 << 16}
            if chan_r is not None:
                caps[chan_r] = limits.output_bytes * 16
            data, seen = _collect(proc, caps, start + limits.timeout_s)
        finally:
            if proc is not None:
                _stop(proc)
                proc.stdout.close()
                proc.stderr.close()
            for fd in (status_r, status_w, chan_r, chan_w):
                if fd is not None:
                    os.close(fd)
        status = _status(data[status_r])
        if root and "pid" not in status.get("isolation", ()):
            _reap_uid(uid)
    finally:
        try:
            _cleanup.remove_tree(workdir)  # the launcher removed it already, unless it failed early
        except OSError:
            shutil.rmtree(workdir, ignore_errors=True)
    returncode = proc.returncode
    if "wait_status" in status:  # the program's own status, not the launcher's
        returncode = os.waitstatus_to_exitcode(status["wait_status"])
    timed_out, flooded = seen.pop("timed_out"), seen.pop("flooded")
    reason = reason_for(
        returncode,
        timed_out=timed_out,
        flooded=flooded,
        setup_error=status.get("error"),
        cpu_s=status.get("cpu_s"),
        cpu_limit_s=cfg["limits"]["cpu_s"],
        oom_kills=status.get("oom_kills", 0),
    )
    return SandboxResult(
        ok=reason == "",
        returncode=returncode,
        stdout=data[out_fd].decode("utf-8", "replace"),
        stderr=data[err_fd].decode("utf-8", "replace"),
        timed_out=timed_out,
        reason=reason,
        isolation=tuple(status.get("isolation", ())),
        wall_s=time.monotonic() - start,
        output_truncated=seen[out_fd] > caps[out_fd] or seen[err_fd] > caps[err_fd],
        channel=data[chan_r] if chan_r is not None else b"",
    )


def _collect(proc: subprocess.Popen, caps: dict[int, int], deadline: float) -> tuple[dict[int, bytes], dict]:
    """Read every fd of ``caps`` until EOF, the deadline, or a flood (an fd past ``_KILL_FACTOR``
    times its cap); keep the first ``caps[fd]`` bytes of each."""
    chunks: dict[int, bytearray] = {fd: bytearray() for fd in caps}
    seen: dict = {fd: 0 for fd in caps}
    seen.update(timed_out=False, flooded=False)
    exited_at = None
    with selectors.DefaultSelector() as sel:
        for fd in caps:
            os.set_blocking(fd, False)
            sel.register(fd, selectors.EVENT_READ)
        while sel.get_map():
            now = time.monotonic()
            if now >= deadline:
                seen["timed_out"] = True
                break
            if exited_at is None and _exited(proc.pid):
                exited_at = now
            if exited_at is not None and now - exited_at > _GRACE_S:
                break  # the launcher is gone; whatever still holds a pipe is killed below
            for key, _ in sel.select(min(deadline - now, 0.25)):
                fd = key.fd
                try:
                    block = os.read(fd, 1 << 16)
                except BlockingIOError:
                    continue
                if not block:
                    sel.unregister(fd)
                    continue
                seen[fd] += len(block)
                room = caps[fd] - len(chunks[fd])
                if room > 0:
                    chunks[fd] += block[:room]
            if any(seen[fd] > _KILL_FACTOR * cap for fd, cap in caps.items()):
                seen["flooded"] = True
                break
    return {fd: bytes(b) for fd, b in chunks.items()}, seen


def _status(raw: bytes) -> dict:
    """The launcher's status lines merged in order (``isolation``, ``error``, ``wait_status``)."""
    merged: dict = {}
    for line in raw.splitlines():
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            merged.update(value)
    return merged


def run_python(
    source: str,
    *,
    timeout_s: float = 5.0,
    memory_mb: int = 512,
    processes: int = 16,
    file_mb: int = 16,
    output_bytes: int = 64 * 1024,
    hidden_paths: tuple[str, ...] = (),
) -> SandboxResult:
    """Run the Python program ``source`` in the sandbox (module docstring) and return what it did.

    Example:
        >>> run_python("print(6 * 7)").stdout
        '42\\n'
    """
    limits = Limits(
        timeout_s=timeout_s, memory_mb=memory_mb, processes=processes, file_mb=file_mb, output_bytes=output_bytes
    )
    return execute(source, limits, hidden_paths=hidden_paths)
