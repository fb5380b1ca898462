"""Sandbox launcher: a fresh process that limits and isolates itself, then runs the program.

Started by :func:`creditrl.sandbox.process.execute` as ``python -I -S /dev/fd/N`` (its own source,
passed by descriptor) with one JSON line of configuration and then the program text on stdin, so
its command line (``/proc/1/cmdline`` of the sandbox's init) holds nothing of the host. It is its
own single-threaded process, not a ``preexec_fn`` (which can deadlock in a multi-threaded parent
such as the trainer), and imports only the stdlib and its stdlib-only siblings :mod:`._rootfs`,
:mod:`._seccomp`, :mod:`._cgroup` and :mod:`._cleanup`.

Steps, in order (each namespace step is best-effort; what succeeded is reported):

1. read the configuration and the program from stdin, point stdin at ``/dev/null``; die with the
   caller (``PR_SET_PDEATHSIG``: SIGTERM, which ends the run as below) and adopt every orphan of
   the run (``PR_SET_CHILD_SUBREAPER``);
2. a memory cgroup of ``memory_bytes`` (:mod:`._cgroup`, where one can be made), which the
   program's process joins before its exec;
3. as root: new network (only a down loopback), IPC and UTS namespaces; not root: a user
   namespace (the caller's uid mapped to root) with new network and IPC namespaces, then a nested
   user namespace in which the program is the caller's uid again (no capability); either way, the
   new IPC namespace's SysV shared-memory limits are set to 0;
4. as root: a private mount namespace and in it the minimal root (:func:`._rootfs.build`), into
   which the launcher pivots, so nothing else of the host exists;
5. rlimits (CPU, file size, open files, processes, core = 0, and address space where no cgroup
   holds the memory);
6. as root: a new PID namespace whose init (still root, see :func:`_init`; it dies with the
   launcher) mounts its ``/proc`` and runs the program as PID 2; when the program exits the init
   exits and the kernel kills all that is left;
7. the program's process drops to ``uid``/``gid`` with no supplementary groups and
   ``no_new_privs`` (so RLIMIT_NPROC applies and it cannot signal its parent or other runs),
   loads the seccomp filter that the parent compiled (``seccomp`` in the config, hex) and execs
   ``python -I -B main.py`` with a clean environment;
8. at the end (the program exited, the parent asked with SIGTERM, or the caller died): every
   process of the run is killed (the PID namespace, or every descendant), the cgroup's OOM kills
   are reported and the cgroup removed, and the working directory is removed.

The status fd 4 (close-on-exec in the program) gets JSON lines: ``{"isolation": [...]}`` just
before the exec, ``{"error": "..."}`` if setup failed (exit 125), ``{"wait_status": N, "cpu_s": T}``
once the program has exited (written by whoever reaped it: the init, or the launcher; ``T`` its CPU
time) and ``{"oom_kills": K}`` when a cgroup held the run.
"""

from __future__ import annotations

import ctypes
import fcntl
import json
import os
import resource
import select
import signal
import sys

STDLIB = [p for p in sys.path if os.path.isabs(p)]  # under -I -S: the stdlib, the program's too
CLONE_NEWUTS, CLONE_NEWIPC = 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS = 1, 36, 38
CHANNEL_FD, STATUS_FD = 3, 4
MAX_PROGRAM_BYTES, MAX_CONFIG_BYTES = 1 << 20, 1 << 16
SETUP_FAILED = 125  # the exit status of a failed setup
SHM_LIMITS = ("shmmax", "shmall", "shmmni")  # /proc/sys/kernel/*, per IPC namespace
libc = ctypes.CDLL(None, use_errno=True)


class _Run:
    """What the end of the run must undo (see :func:`_finish`)."""

    pid_namespace = False
    program_pid = 0  # the child that the launcher waits for, once forked (see _on_sigterm)
    group = None  # the memory cgroup, once made
    channel_fd: int | None = None  # CHANNEL_FD where there is a channel
    tmp_fd: int | None = None  # the directory that holds the working directory
    workdir_name = ""


def _import_siblings(directory: str) -> None:
    """Import the stdlib-only siblings from the package directory named in the configuration."""
    global _cgroup, _cleanup, _rootfs, _seccomp
    sys.path.insert(0, directory)
    import _cgroup
    import _cleanup
    import _rootfs
    import _seccomp


def _unshare(flags: int) -> bool:
    return libc.unshare(flags) == 0


def _write_file(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _zero_shm_limits() -> bool:
    """Set this IPC namespace's SysV shared-memory limits to 0 (no segment can be made)."""
    try:
        for name in SHM_LIMITS:
            _write_file(f"/proc/sys/kernel/{name}", "0")
    except OSError:
        return False
    return True


def _user_namespaces(isolation: list[str]) -> None:
    """Not root: own network and IPC namespaces through a user namespace where the caller is root
    (to set the IPC limits), then a nested one where the program is the caller's uid again, so it
    execs without capabilities. The group maps are best-effort (an unmapped gid is the overflow gid)."""
    uid, gid = os.getuid(), os.getgid()
    if not _unshare(CLONE_NEWUSER | CLONE_NEWNET | CLONE_NEWIPC):
        return
    isolation.append("net")
    try:
        _write_file("/proc/self/uid_map", f"0 {uid} 1")
    except OSError:
        return  # unmapped: the program runs as the overflow uid, without capabilities
    _map_group(f"0 {gid} 1")
    if _zero_shm_limits():
        isolation.append("shm")
    _rootfs.check(libc.unshare(CLONE_NEWUSER), "unshare a nested user namespace")
    _write_file("/proc/self/uid_map", f"{uid} 0 1")  # raises: never exec as the namespace's root
    _map_group(f"{gid} 0 1")


def _map_group(line: str) -> None:
    try:
        _write_file("/proc/self/setgroups", "deny")  # required before an unprivileged gid_map
        _write_file("/proc/self/gid_map", line)
    except OSError:
        pass


def _set_limits(limits: dict, address_space: bool) -> None:
    cpu = limits["cpu_s"]
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))  # SIGXCPU, then SIGKILL a second later
    names = [("RLIMIT_FSIZE", "file_bytes"), ("RLIMIT_NOFILE", "open_files"), ("RLIMIT_NPROC", "processes")]
    if address_space:  # no cgroup: the address space per process is the only memory bound
        names.append(("RLIMIT_AS", "memory_bytes"))
    for name, key in names:
        resource.setrlimit(getattr(resource, name), (limits[key], limits[key]))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _report(payload: dict) -> None:
    try:
        os.write(STATUS_FD, json.dumps(payload).encode() + b"\n")
    except OSError:
        pass  # the parent is gone: the run is being cleaned up for nobody


def _fail(exc: Exception) -> None:
    """Report a setup failure and end: a program never runs half-isolated."""
    _report({"error": f"{type(exc).__name__}: {exc}"})
    _finish(SETUP_FAILED)


def _close(*fds: int | None) -> None:
    for fd in fds:
        if fd is None:
            continue
        try:
            os.close(fd)
        except OSError:
            pass


def _die_with_parent(signum: int, lifeline: int | None = None, parent: int | None = None) -> bool:
    """Ask for ``signum`` when the parent dies; False if it has died already (before the request)."""
    _rootfs.check(libc.prctl(PR_SET_PDEATHSIG, signum, 0, 0, 0), "pdeathsig")
    if lifeline is not None and select.select([lifeline], [], [], 0)[0]:  # EOF: its writer is gone
        return False
    return parent is None or os.getppid() == parent


def _program(cfg: dict, isolation: list[str], lifeline: int | None) -> None:
    """The program's process: drop privileges and exec the interpreter (never returns)."""
    signal.pthread_sigmask(signal.SIG_SETMASK, set())  # the mask survives exec
    os.chdir(cfg["workdir"])  # before dropping privileges: the uid need not reach it by path
    if _Run.group is not None:  # before dropping privileges: the cgroup's files are root's
        _Run.group.join()
        isolation.append("memcg")
    _close(_Run.tmp_fd, *(_Run.group.fds() if _Run.group else ()))
    uid = cfg["uid"]
    if uid is not None:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
        isolation.append("uid")
    _rootfs.check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    if lifeline is not None:  # no PID namespace to take it down: die with the launcher instead
        if not _die_with_parent(signal.SIGKILL, lifeline):  # after setuid, which clears it
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
    """Reap children until the program ``pid`` exits; report its raw wait status and CPU time."""
    while True:
        reaped, status, usage = os.wait4(-1, 0)
        if reaped == pid:
            break
    _Run.program_pid = 0  # reaped: its pid may be recycled, so SIGTERM must not kill it any more
    _report({"wait_status": status, "cpu_s": usage.ru_utime + usage.ru_stime})


def _init(cfg: dict, isolation: list[str], lifeline: int) -> None:
    """PID 1 of the new PID namespace (stays root, so the program cannot signal it): mount its
    /proc, run the program as PID 2 (ordinary signal semantics, unlike an init), reap orphans.
    It dies with the launcher; when it exits, the kernel kills everything left in the namespace."""
    if not _die_with_parent(signal.SIGKILL, lifeline):
        os._exit(SETUP_FAILED)
    _close(lifeline)
    if "minroot" in isolation:  # a root of our own, with an empty /proc to mount it on
        _rootfs.mount_proc()
        isolation.append("proc")
    pid = os.fork()
    if pid == 0:
        try:
            _program(cfg, isolation, None)
        except Exception as exc:  # noqa: BLE001
            _report({"error": f"{type(exc).__name__}: {exc}"})
            os._exit(SETUP_FAILED)
    _close(0, 1, 2, _Run.channel_fd, _Run.tmp_fd, *(_Run.group.fds() if _Run.group else ()))
    _wait_and_report(pid)
    os._exit(0)


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
        _Run.channel_fd = CHANNEL_FD  # else fd 3 is free, and the next descriptor opened gets it
    os.dup2(status, STATUS_FD, inheritable=False)
    os.close(status)


def _on_sigterm(signum, frame) -> None:
    """Stop the run (the parent asks, or the caller died): kill the child; the wait in main then
    returns, and :func:`_finish` kills the rest. Blocked during setup, so it never interrupts one."""
    if _Run.program_pid:
        os.kill(_Run.program_pid, signal.SIGKILL)


def _finish(code: int, signum: int = 0) -> None:
    """End the run (module docstring, step 8), then exit with ``code`` or die of ``signum``."""
    if _Run.program_pid:
        os.kill(_Run.program_pid, signal.SIGKILL)
        _Run.program_pid = 0
    # with a PID namespace the init is the only child (killing it empties the namespace), and /proc
    # is the namespace's, whose pids mean other processes here: no scan then
    _cleanup.reap_descendants(scan=not _Run.pid_namespace)
    if _Run.group is not None:
        _report({"oom_kills": _Run.group.oom_kills()})
        _Run.group.remove()
    if _Run.tmp_fd is not None:
        try:
            _cleanup.remove_tree(_Run.workdir_name, _Run.tmp_fd)
        except OSError:
            pass  # the parent removes it as well
    if signum:  # the init was killed (on request): so is the launcher, for the parent to see
        os.kill(os.getpid(), signum)
    os._exit(code)


def _read_input() -> tuple[dict, bytes]:
    data = sys.stdin.buffer.read(MAX_CONFIG_BYTES + MAX_PROGRAM_BYTES + 2)
    header, _, program = data.partition(b"\n")
    return json.loads(header), program


def _setup(cfg: dict, program: bytes) -> list[str]:
    """Steps 2 to 5 of the module docstring; returns the isolation that held."""
    if len(program) > MAX_PROGRAM_BYTES:
        raise ValueError(f"program longer than {MAX_PROGRAM_BYTES} bytes")
    isolation: list[str] = []
    _Run.group = _cgroup.create(cfg["limits"]["memory_bytes"])
    root = os.geteuid() == 0
    if root:
        if _unshare(CLONE_NEWNET):
            isolation.append("net")
        if _unshare(CLONE_NEWIPC | CLONE_NEWUTS):
            isolation.append("ipc")
            if _zero_shm_limits():
                isolation.append("shm")
        isolation += _rootfs.build(cfg, [cfg["python"], *STDLIB])
    else:
        cfg["uid"] = None  # only root can switch uid: the program runs as the caller
        _user_namespaces(isolation)
    if "tmpfs" not in isolation and cfg["uid"] is not None:
        os.chown(cfg["workdir"], cfg["uid"], cfg["uid"])
    with open(os.path.join(cfg["workdir"], "main.py"), "wb") as f:
        f.write(program)
    if root and _unshare(CLONE_NEWPID):
        isolation.append("pid")
        _Run.pid_namespace = True
    _set_limits(cfg["limits"], address_space=_Run.group is None)
    return isolation


def main() -> None:
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # until the program runs
    signal.signal(signal.SIGTERM, _on_sigterm)
    os.umask(0o022)
    cfg, program = _read_input()
    _import_siblings(cfg["package_dir"])
    _arrange_fds(cfg)
    parent, workdir = cfg["parent_pid"], cfg["workdir"]
    _Run.tmp_fd = os.open(os.path.dirname(workdir), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    _Run.workdir_name = os.path.basename(workdir)
    if not _die_with_parent(signal.SIGTERM, parent=parent) or libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0):
        _finish(SETUP_FAILED)  # the caller is gone already (or no subreaper: orphans could escape)
    try:
        isolation = _setup(cfg, program)
        if not _die_with_parent(signal.SIGTERM, parent=parent):  # again: namespaces changed credentials
            _finish(SETUP_FAILED)
        lifeline_r, lifeline_w = os.pipe()
        pid = os.fork()
    except Exception as exc:  # noqa: BLE001
        _fail(exc)
    if pid == 0:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.close(lifeline_w)
        try:
            if "pid" in isolation:
                _init(cfg, isolation, lifeline_r)
            _program(cfg, isolation, lifeline_r)
        except Exception as exc:  # noqa: BLE001
            _report({"error": f"{type(exc).__name__}: {exc}"})
            os._exit(SETUP_FAILED)
    _Run.program_pid = pid
    _close(lifeline_r, 0, _Run.channel_fd)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    if "pid" not in isolation:
        _wait_and_report(pid)
        _finish(0)
    _, status = os.waitpid(pid, 0)  # the init: it reports the program's status
    _Run.program_pid = 0
    if os.WIFSIGNALED(status):
        _finish(SETUP_FAILED, os.WTERMSIG(status))
    _finish(os.WEXITSTATUS(status))


if __name__ == "__main__":
    main()
