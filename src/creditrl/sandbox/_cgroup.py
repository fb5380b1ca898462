"""A memory cgroup per run: every page the run touches (anonymous memory, shared memory, memfd and
tmpfs files, kernel memory) is charged to it, so ``memory_mb`` bounds the run as a whole.

Used by :mod:`creditrl.sandbox._launcher` (stdlib only, like it), which creates the group below its
own memory cgroup and removes it at the end of the run; the program's process joins it before its
exec, so the group holds the program and its descendants only: the launcher and the namespace's
init stay outside, and an OOM kill in the group can only end the program's processes.

Either hierarchy, whichever carries the memory controller:

* cgroup v1 (a ``cgroup`` mount with the ``memory`` option): ``memory.limit_in_bytes`` and
  ``memory.memsw.limit_in_bytes`` (no swap beyond it); the OOM kills are the ``oom_kill`` line of
  ``memory.oom_control``;
* cgroup v2 (``cgroup2``, where ``memory`` can be passed down: below this process's group, or
  beside it; :func:`_candidates`): ``memory.max``, ``memory.swap.max = 0``, ``oom_kill`` of
  ``memory.events``, and ``cgroup.kill`` at the end.

Creating a group needs write access to the caller's own group (root, or a delegated v2 subtree);
:func:`create` returns None where there is none, and the run falls back on RLIMIT_AS. Every file the
group needs later is reached through directory descriptors opened here, so the launcher can still
remove the group after it has pivoted into the minimal root, where ``/sys`` does not exist.
"""

from __future__ import annotations

import os
import secrets
import signal
import time

__all__ = ["MemoryGroup", "create"]

_O_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


def _mounts() -> list[tuple[str, str, str, set[str]]]:
    """(root, mount point, fstype, super options) of each cgroup mount, from mountinfo."""
    found = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fields, tail = left.split(), right.split()
            if len(fields) >= 5 and len(tail) >= 3 and tail[0] in ("cgroup", "cgroup2"):
                found.append((fields[3], fields[4], tail[0], set(tail[2].split(","))))
    return found


def _own_groups() -> dict[str, str]:
    """This process's group per v1 controller, and ``""`` (the key) for the v2 group."""
    groups = {}
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            for name in controllers.split(",") if controllers else [""]:
                groups[name] = path
    return groups


def _host_path(mount_root: str, mount_point: str, group: str) -> str:
    relative = group[len(mount_root) :] if group.startswith(mount_root) and mount_root != "/" else group
    return os.path.join(mount_point, relative.lstrip("/"))


def _candidates() -> list[tuple[int, str]]:
    """(version, directory to make the group in) where a memory controller is mounted, v1 first.

    v2 offers this process's own group, then its parent: a v2 group that holds processes cannot
    pass a controller to its children (the "no internal processes" rule), but its parent can
    already pass ``memory`` to a new sibling."""
    groups, out = _own_groups(), []
    for root, point, fstype, options in _mounts():
        if fstype == "cgroup" and "memory" in options and "memory" in groups:
            out.append((1, _host_path(root, point, groups["memory"])))
        elif fstype == "cgroup2" and "" in groups:
            own = os.path.normpath(_host_path(root, point, groups[""]))
            out += [(2, own)] if own == os.path.normpath(point) else [(2, own), (2, os.path.dirname(own))]
    return sorted(out, key=lambda c: c[0])


def _write(dir_fd: int, name: str, value: str) -> None:
    fd = os.open(name, os.O_WRONLY | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def _read(dir_fd: int, name: str) -> str:
    fd = os.open(name, os.O_RDONLY | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        return os.read(fd, 1 << 16).decode()
    finally:
        os.close(fd)


class MemoryGroup:
    """One run's memory cgroup (module docstring), reached through descriptors."""

    def __init__(self, version: int, parent_fd: int, name: str, fd: int) -> None:
        self.version, self.parent_fd, self.name, self.fd = version, parent_fd, name, fd
        self.procs_fd = os.open("cgroup.procs", os.O_WRONLY | os.O_CLOEXEC, dir_fd=fd)  # opened as root

    def fds(self) -> tuple[int, ...]:
        return self.fd, self.parent_fd, self.procs_fd

    def join(self) -> None:
        """Move the calling process into the group (its children are born there); works after it
        has dropped its privileges and left the host's view, through the descriptor opened here."""
        os.write(self.procs_fd, b"0")

    def oom_kills(self) -> int:
        """How many processes of the group the kernel's OOM killer ended (the limit fired)."""
        text = _read(self.fd, "memory.oom_control" if self.version == 1 else "memory.events")
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        return 0

    def _kill_members(self) -> None:
        try:
            if self.version == 2:
                _write(self.fd, "cgroup.kill", "1")
            else:
                for pid in _read(self.fd, "cgroup.procs").split():
                    os.kill(int(pid), signal.SIGKILL)
        except (OSError, ValueError):
            pass

    def remove(self) -> None:
        """Kill what is left in the group and remove it (this process is not in it)."""
        for _ in range(200):
            self._kill_members()
            try:
                os.rmdir(self.name, dir_fd=self.parent_fd)
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.005)  # EBUSY while the last members finish exiting
        for fd in self.fds():
            os.close(fd)


def _limit(version: int, fd: int, limit_bytes: int) -> None:
    if version == 1:
        memory, swap, swap_value = "memory.limit_in_bytes", "memory.memsw.limit_in_bytes", str(limit_bytes)
    else:
        memory, swap, swap_value = "memory.max", "memory.swap.max", "0"
    _write(fd, memory, str(limit_bytes))
    try:  # absent without swap accounting; then there is no swap to escape to
        _write(fd, swap, swap_value)
    except OSError:
        pass


def create(limit_bytes: int) -> MemoryGroup | None:
    """A fresh memory cgroup limited to ``limit_bytes``, below this process's own; None where no
    memory controller is mounted or none is writable by this process."""
    for version, directory in _candidates():
        try:
            parent_fd = os.open(directory, _O_DIR)
        except OSError:
            continue
        name = f"creditrl-sandbox-{secrets.token_hex(6)}"
        try:
            os.mkdir(name, 0o755, dir_fd=parent_fd)
        except OSError:
            os.close(parent_fd)
            continue
        fd = os.open(name, _O_DIR, dir_fd=parent_fd)
        try:
            group = MemoryGroup(version, parent_fd, name, fd)
        except OSError:
            os.close(fd)
            os.rmdir(name, dir_fd=parent_fd)
            os.close(parent_fd)
            continue
        try:
            if version == 2 and "memory" not in _read(fd, "cgroup.controllers").split():
                _write(parent_fd, "cgroup.subtree_control", "+memory")  # refused where the parent holds processes
            _limit(version, fd, limit_bytes)
            return group
        except OSError:
            group.remove()
    return None
