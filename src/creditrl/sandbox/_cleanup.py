"""What a run leaves behind, removed: its descendants and its working directory (stdlib only).

Used by :mod:`creditrl.sandbox._launcher` at the end of every run (and when its caller dies) and by
:mod:`creditrl.sandbox.process` as a backstop. Without a PID namespace the launcher is a child
subreaper (``PR_SET_CHILD_SUBREAPER``), so every orphan of the program, a ``setsid`` double-forked
grandchild included, is re-parented to it and :func:`reap_descendants` reaches it.
:func:`remove_tree` removes a tree the program may have made hostile (``chmod 0`` subdirectories, a
read-only top, symbolic links) through directory descriptors, so it also removes a host directory
out of the caller's view (the launcher after its pivot).
"""

from __future__ import annotations

import os
import signal
import stat
import time

__all__ = ["descendants", "reap_descendants", "remove_tree"]

_O_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def descendants(pid: int) -> list[int]:
    """The pids of every process below ``pid``, from /proc (a snapshot)."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        entries = []  # no /proc in view
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                text = f.read()
        except OSError:
            continue  # exited meanwhile
        ppid = int(text[text.rindex(b")") + 2 :].split()[1])  # the name may hold spaces and ')'
        children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def reap_descendants(*, scan: bool = True) -> None:
    """Kill every process below this one and reap them all (this process must be a subreaper, so
    that an orphan cannot leave its subtree): returns once it has no child left. Without ``scan``
    it only reaps (the caller has killed what must die)."""
    me = os.getpid()
    while True:
        for pid in descendants(me) if scan else ():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            if os.waitpid(-1, os.WNOHANG)[0] == 0:
                time.sleep(0.002)  # a child is still exiting, or one was born after the snapshot
        except ChildProcessError:
            return


def _empty(dir_fd: int) -> None:
    """Remove everything inside the directory ``dir_fd``."""
    for name in os.listdir(dir_fd):
        try:
            mode = os.lstat(name, dir_fd=dir_fd).st_mode
        except FileNotFoundError:
            continue
        if stat.S_ISDIR(mode):
            remove_tree(name, dir_fd)
        else:
            os.unlink(name, dir_fd=dir_fd)


def remove_tree(name: str, dir_fd: int | None = None) -> None:
    """Remove the directory ``name`` (relative to ``dir_fd``, or a path) with all it holds, whatever
    permissions the program gave it; a missing directory is no error. Call it once nothing of the
    run is left: a directory is checked not to be a link before it is opened with ``O_NOFOLLOW``.

    Raises:
        OSError: If something in it cannot be removed (e.g. a mount point).
    """
    try:
        if not stat.S_ISDIR(os.lstat(name, dir_fd=dir_fd).st_mode):
            os.unlink(name, dir_fd=dir_fd)
            return
        os.chmod(name, 0o700, dir_fd=dir_fd)  # the program's chmod 0 would stop listing it
        fd = os.open(name, _O_DIR, dir_fd=dir_fd)
    except FileNotFoundError:
        return
    try:
        _empty(fd)
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=dir_fd)
