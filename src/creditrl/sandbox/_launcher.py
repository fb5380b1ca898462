"""Sandbox launcher: a fresh process that limits and isolates itself, then runs the program.

Started by :func:`creditrl.sandbox.process.execute` as ``python -I -S _launcher.py CONFIG`` with
the program text on stdin. It is its own single-threaded process, not a ``preexec_fn`` (which
can deadlock in a multi-threaded parent such as the trainer), and imports only the stdlib and
its two stdlib-only siblings :mod:`._rootfs` (the minimal root) and :mod:`._seccomp` (the filter).

Steps, in order (each namespace step is best-effort; what succeeded is reported):

1. read the program from stdin, point stdin at ``/dev/null``;
2. as root: new network (only a down loopback: no connect anywhere), IPC and UTS namespaces;
3. as root: a private mount namespace and in it a minimal root (:func:`._rootfs.build`): a
   read-only tmpfs holding the interpreter, its stdlib, the shared libraries, a few devices, an empty
   ``/proc`` and the working directory, a fresh size-capped tmpfs owned by the run's uid (it
   vanishes with the namespace); the launcher pivots into it, so nothing else of the host exists;
   not root: a user namespace with a network namespace when the kernel allows it;
4. rlimits (CPU, address space, file size, open files, processes, core = 0);
5. as root: a new PID namespace whose init (still root, see :func:`_init`) mounts its ``/proc``
   and runs the program as PID 2; when the program exits the init exits and the kernel kills all
   that is left;
6. the program's process drops to ``uid``/``gid`` with no supplementary groups and
   ``no_new_privs`` (so RLIMIT_NPROC applies and it cannot signal its parent or other runs),
   loads the seccomp filter that the parent compiled (``seccomp`` in the config, hex; with or
   without root) and execs ``python -I -B main.py`` with a clean environment.

The status fd 4 (close-on-exec in the program) gets JSON lines: ``{"isolation": [...]}`` just
before the exec, ``{"error": "..."}`` if setup failed (exit 125), and ``{"wait_status": N}``
once the program has exited (written by whoever reaped it: the init, or the launcher).
"""

from __future__ import annotations

import fcntl
import json
import os
import resource
import select
import signal
import sys

STDLIB = [p for p in sys.path if os.path.isabs(p)]  # under -I -S: the stdlib, the program's too
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # its stdlib-only siblings
import _rootfs  # noqa: E402
import _seccomp  # noqa: E402

CLONE_NEWUTS, CLONE_NEWIPC = 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38
CHANNEL_FD, STATUS_FD = 3, 4
MAX_PROGRAM_BYTES, SETUP_FAILED = 1 << 20, 125  # SETUP_FAILED: the exit status of a failed setup
_program_pid = 0  # the child that the launcher waits for, once forked (see _on_sigterm)

libc = _rootfs.libc


def _unshare(flags: int) -> bool:
    return libc.unshare(flags) == 0


def _set_limits(limits: dict) -> None:
    cpu = limits["cpu_s"]
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))  # SIGXCPU, then SIGKILL a second later
    for name, key in (
        ("RLIMIT_AS", "memory_bytes"),
        ("RLIMIT_FSIZE", "file_bytes"),
        ("RLIMIT_NOFILE", "open_files"),
        ("RLIMIT_NPROC", "processes"),
    ):
        resource.setrlimit(getattr(resource, name), (limits[key], limits[key]))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _report(payload: dict) -> None:
    os.write(STATUS_FD, json.dumps(payload).encode() + b"\n")


def _fail(exc: Exception) -> None:
    """Report a setup failure and exit: a program never runs half-isolated."""
    _report({"error": f"{type(exc).__name__}: {exc}"})
    os._exit(SETUP_FAILED)


def _close(*fds: int) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


def _program(cfg: dict, isolation: list[str], lifeline: int | None) -> None:
    """The program's process: drop privileges and exec the interpreter (never returns)."""
    os.chdir(cfg["workdir"])  # before dropping privileges: the uid need not reach it by path
    uid = cfg["uid"]
    if uid is not None:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
        isolation.append("uid")
    _rootfs.check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    if lifeline is not None:  # no PID namespace to take it down: die with the launcher instead
        _rootfs.check(libc.prctl(PR_SET_PDEATHSIG, 9, 0, 0, 0), "pdeathsig")  # after setuid, which clears it
        if select.select([lifeline], [], [], 0)[0]:  # EOF: the launcher died before PDEATHSIG was set
            os._exit(SETUP_FAILED)
        os.close(lifeline)
    if cfg["seccomp"]:
        try:
            _seccomp.install(bytes.fromhex(cfg["seccomp"]))
            isolation.append("seccomp")
        except OSError:
            pass  # the kernel has no seccomp filters: the run goes on without, and says so
    _report({"isolation": sorted(isolation)})
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "HOME": cfg["workdir"],
        "TMPDIR": cfg["workdir"],
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    python = cfg["python"]
    os.execve(python, [python, "-I", "-B", "-X", "utf8", "main.py"], env)


def _wait_and_report(pid: int) -> None:
    """Reap children until the program ``pid`` exits; report its raw wait status; exit."""
    global _program_pid
    while (reaped := os.wait())[0] != pid:
        pass
    _program_pid = 0  # reaped: its pid may be recycled, so SIGTERM must not kill it any more
    _report({"wait_status": reaped[1]})
    os._exit(0)


def _init(cfg: dict, isolation: list[str]) -> None:
    """PID 1 of the new PID namespace (stays root, so the program cannot signal it): mount its
    /proc, run the program as PID 2 (ordinary signal semantics, unlike an init), reap orphans.
    When it exits after the program, the kernel kills everything left in the namespace."""
    if "minroot" in isolation:  # a root of our own, with an empty /proc to mount it on
        _rootfs.mount_proc()
        isolation.append("proc")
    pid = os.fork()
    if pid == 0:
        try:
            _program(cfg, isolation, None)
        except Exception as exc:  # noqa: BLE001
            _fail(exc)
    _close(0, 1, 2, CHANNEL_FD)
    _wait_and_report(pid)


def _arrange_fds(cfg: dict) -> None:
    """fd 0 = /dev/null, 3 = the result channel (if any), 4 = status (close-on-exec), no others."""
    status = fcntl.fcntl(cfg["status_fd"], fcntl.F_DUPFD_CLOEXEC, 100)
    channel = None if cfg["channel_fd"] is None else fcntl.fcntl(cfg["channel_fd"], fcntl.F_DUPFD, 100)
    null = os.open("/dev/null", os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.closerange(3, 100)
    if channel is not None:
        os.dup2(channel, CHANNEL_FD, inheritable=True)
        os.close(channel)
    os.dup2(status, STATUS_FD, inheritable=False)
    os.close(status)


def _on_sigterm(signum, frame) -> None:
    """Stop the run: kill the child; main's wait returns once its whole namespace is gone."""
    if _program_pid:
        os.kill(_program_pid, signal.SIGKILL)
    else:
        os._exit(SETUP_FAILED)


def main() -> None:
    global _program_pid
    signal.signal(signal.SIGTERM, _on_sigterm)
    os.umask(0o022)
    cfg = json.loads(sys.argv[1])
    program = sys.stdin.buffer.read(MAX_PROGRAM_BYTES + 1)
    _arrange_fds(cfg)
    try:
        if len(program) > MAX_PROGRAM_BYTES:
            raise ValueError(f"program longer than {MAX_PROGRAM_BYTES} bytes")
        isolation: list[str] = []
        root = os.geteuid() == 0
        if root:
            if _unshare(CLONE_NEWNET):
                isolation.append("net")
            if _unshare(CLONE_NEWIPC | CLONE_NEWUTS):
                isolation.append("ipc")
            isolation += _rootfs.build(cfg, [cfg["python"], *STDLIB])
        else:
            cfg["uid"] = None  # only root can switch uid: the program runs as the caller
            if _unshare(CLONE_NEWUSER | CLONE_NEWNET):
                isolation.append("net")
        if "tmpfs" not in isolation and cfg["uid"] is not None:
            os.chown(cfg["workdir"], cfg["uid"], cfg["uid"])
        with open(os.path.join(cfg["workdir"], "main.py"), "wb") as f:
            f.write(program)
        if root and _unshare(CLONE_NEWPID):
            isolation.append("pid")
        _set_limits(cfg["limits"])
        lifeline_r, lifeline_w = os.pipe()
        pid = os.fork()
    except Exception as exc:  # noqa: BLE001
        _fail(exc)
    if pid == 0:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.close(lifeline_w)
        try:
            if "pid" in isolation:
                os.close(lifeline_r)
                _init(cfg, isolation)
            _program(cfg, isolation, lifeline_r)
        except Exception as exc:  # noqa: BLE001
            _fail(exc)
    _program_pid = pid
    _close(lifeline_r, 0, CHANNEL_FD)
    if "pid" not in isolation:
        _wait_and_report(pid)
    os.close(STATUS_FD)  # the namespace's init reports the program's status
    _, status = os.waitpid(pid, 0)
    _program_pid = 0
    if os.WIFSIGNALED(status):  # killed (on request): so is the launcher, for the parent to see
        os.kill(os.getpid(), signal.SIGKILL)
    os._exit(os.WEXITSTATUS(status))


if __name__ == "__main__":
    main()
