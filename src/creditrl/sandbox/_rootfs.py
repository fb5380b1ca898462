"""The sandbox's file view as root: a fresh minimal root that holds only what ``python -I`` needs.

Used by :mod:`creditrl.sandbox._launcher` (stdlib only, like it). :func:`build` unshares a
private mount namespace, mounts a small tmpfs over the run's (empty) host directory and fills it:

* the interpreter (the base interpreter of a virtual environment, never the environment) and its
  stdlib directories (the launcher's own ``sys.path`` under ``-I -S``: the same interpreter),
  bind-mounted read-only (nosuid, nodev) at their own paths;
* the shared libraries, likewise: the loader's directories ``/lib``, ``/lib64``, ``/usr/lib``,
  ``/usr/lib64`` (where they exist), the directory of every shared object the launcher itself has
  mapped (libpython and the like, wherever they live), ``/etc/ld.so.cache``, and the time-zone
  data ``/usr/share/zoneinfo``; the symlinks on the way to each (``/lib -> usr/lib``) are
  recreated;
* ``/dev/null``, ``/dev/zero``, ``/dev/random``, ``/dev/urandom`` bound from the host, and
  ``/dev/fd``, ``/dev/stdin``, ``/dev/stdout``, ``/dev/stderr`` as links into ``/proc/self/fd``;
* an empty ``/proc``, where the PID namespace's init mounts its own proc.

Then it pivots into that tree (``pivot_root(".", ".")``, then a lazy unmount of the old root;
``chroot`` where pivot_root is refused, as on an initramfs root) and, inside it, mounts the
working directory (a size-capped tmpfs owned by the run's uid, at the same path as on the host),
covers with empty read-only tmpfs the ``hidden`` directories and the installation's
``site_packages`` (third-party packages and their ``.pth`` start-up hooks: the program gets the
stdlib only) wherever an exposed tree holds them, and makes the root read-only. Nothing else of
the host exists for the program: not the project, its virtual environment, ``/tmp``, ``/home``,
``/etc`` (but ``ld.so.cache``), ``/sys`` or ``/run``.
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat

__all__ = ["build", "check", "libc", "mount", "mount_proc"]

CLONE_NEWNS = 0x00020000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MNT_DETACH = 2
LIBRARY_DIRS = ("/lib", "/lib64", "/usr/lib", "/usr/lib64")  # where the dynamic loader looks
HOST_DATA = ("/etc/ld.so.cache", "/usr/share/zoneinfo")  # the loader's index of libraries; time zones
DEVICES = ("null", "zero", "random", "urandom")
DEV_LINKS = {
    "fd": "/proc/self/fd",
    "stdin": "/proc/self/fd/0",
    "stdout": "/proc/self/fd/1",
    "stderr": "/proc/self/fd/2",
}
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "loongarch64": 41}  # glibc has no wrapper
ROOT_OPTIONS = "size=1m,nr_inodes=4096,mode=0755"  # the new root: directories, links and mount points
READ_ONLY = MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV

libc = ctypes.CDLL(None, use_errno=True)
libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]


def check(ret: int, what: str) -> None:
    """Raise OSError (errno and ``what``) when a libc call returned non-zero."""
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    """mount(2); raises OSError naming the target."""
    enc = lambda s: None if s is None else os.fsencode(s)  # noqa: E731
    check(libc.mount(enc(source), enc(target), enc(fstype), flags, enc(data)), f"mount {target}")


def mount_proc() -> None:
    """Mount a proc of the current PID namespace on ``/proc`` (the init does, once it exists)."""
    mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)


def _within(path: str, trees: list[str]) -> bool:
    return any(path == t or path.startswith(t.rstrip("/") + "/") for t in trees)


def _bind(source: str, target: str, flags: int = READ_ONLY) -> None:
    """Bind ``source`` (a directory or a file) on ``target``, creating the mount point."""
    if os.path.isdir(source):
        os.makedirs(target, mode=0o755, exist_ok=True)
    else:
        os.close(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644))
    mount(source, target, None, MS_BIND)  # not recursive: mounts below the source stay out
    mount(None, target, None, flags)  # a bind ignores flags; the re-mount applies them


def _mirror(root: str, path: str, bound: list[str]) -> None:
    """Make the host ``path`` appear at the same path under ``root``: recreate each symlink on
    the way (the links themselves, so ``/lib/x`` and ``/usr/lib/x`` both resolve) and bind what it
    finally names, read-only, unless a tree in ``bound`` (host paths bound so far) holds it."""
    todo = [c for c in path.split("/") if c]
    real, hops = "", 0  # the host path resolved so far (no symlinks in it)
    while todo:
        part = todo.pop(0)
        if part in (".", ".."):
            real = real.rsplit("/", 1)[0] if part == ".." else real
            continue
        host = f"{real}/{part}"
        if stat.S_ISLNK(os.lstat(host).st_mode):
            target, hops = os.readlink(host), hops + 1
            if hops > 40:
                raise OSError(errno.ELOOP, f"too many symbolic links on {path}")
            if not os.path.lexists(root + host):
                os.symlink(target, root + host)
            todo = [c for c in target.split("/") if c] + todo
            real = "" if target.startswith("/") else real
            continue
        real = host
        if _within(real, bound):
            return  # visible already, through a bind of a directory above it
        if todo:
            os.makedirs(root + real, mode=0o755, exist_ok=True)
    if real:
        _bind(real, root + real)
        bound.append(real)


def _loaded_library_dirs() -> set[str]:
    """Directories of the shared objects this process (the same interpreter) has mapped."""
    dirs = set()
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.rstrip("\n").split(None, 5)
            if len(fields) == 6 and fields[5].startswith("/") and ".so" in os.path.basename(fields[5]):
                dirs.add(os.path.dirname(fields[5]))
    return dirs


def _exposed(expose: list[str]) -> list[str]:
    """The host paths to bind, parents before what they contain ("/" itself never)."""
    wanted = {*expose, *LIBRARY_DIRS, *HOST_DATA, *_loaded_library_dirs()}
    found = {p: os.path.realpath(p) for p in wanted if os.path.exists(p)}
    return sorted((p for p, real in found.items() if real != "/"), key=lambda p: found[p])


def _populate(root: str, expose: list[str]) -> None:
    """Fill the new root (module docstring) while the host is still in view."""
    bound: list[str] = []
    for path in _exposed(expose):
        _mirror(root, path, bound)
    os.makedirs(f"{root}/dev", mode=0o755, exist_ok=True)
    for name in DEVICES:
        if os.path.exists(f"/dev/{name}"):  # device nodes work on a read-only mount, but not on a nodev one
            _bind(f"/dev/{name}", f"{root}/dev/{name}", MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NOEXEC)
    for name, target in DEV_LINKS.items():
        os.symlink(target, f"{root}/dev/{name}")
    os.makedirs(f"{root}/proc", mode=0o555, exist_ok=True)


def _enter(root: str) -> None:
    """Make ``root`` the root directory of this mount namespace and the current directory."""
    os.chdir(root)
    number = SYS_PIVOT_ROOT.get(os.uname().machine)
    if number is not None and libc.syscall(number, b".", b".") == 0:
        check(libc.umount2(b".", MNT_DETACH), "umount the old root")  # it was stacked on the new one
    else:
        os.chroot(".")  # e.g. EINVAL on an initramfs root; the program cannot leave it (no capabilities)
    os.chdir("/")


def build(cfg: dict, expose: list[str]) -> list[str]:
    """Give this process the minimal root (module docstring), with the host paths ``expose`` (the
    interpreter, its stdlib) besides the libraries; returns the isolation names that held
    (``minroot``, ``readonly``, ``hidden``, ``tmpfs``), none without a mount namespace.

    Raises:
        OSError: If a mount fails after the namespace exists (the launcher then refuses to run).
    """
    if libc.unshare(CLONE_NEWNS) != 0:
        return []
    mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing of what follows reaches the host
    root = cfg["workdir"]  # an empty host directory of this run: the new root's mount point
    mount("none", root, "tmpfs", MS_NOSUID | MS_NODEV, ROOT_OPTIONS)
    _populate(root, expose)
    _enter(root)
    workdir, uid = cfg["workdir"], cfg["uid"]
    os.makedirs(workdir, mode=0o755, exist_ok=True)
    options = f"size={cfg['disk_bytes']},nr_inodes=4096,mode=0700,uid={uid},gid={uid}"
    mount("none", workdir, "tmpfs", MS_NOSUID | MS_NODEV, options)
    for path in [*cfg["hidden"], *cfg["site_packages"]]:
        if os.path.isdir(path):  # only where an exposed tree holds it: nothing else is here
            mount("none", path, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=4k,mode=0555")
    mount(None, "/", None, READ_ONLY)
    return ["hidden", "minroot", "readonly", "tmpfs"]
