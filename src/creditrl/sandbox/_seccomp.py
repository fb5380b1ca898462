"""The sandbox's system-call filter: compiled with libseccomp in the parent, loaded by the launcher.

Engine: **libseccomp** (behind the filters of runc, crun, systemd and QEMU) through
**pyseccomp**, a small ctypes binding (it needs ``libseccomp.so.2`` >= 2.5.0 on the machine).
libseccomp knows every architecture's syscall numbers, adds the architecture check (a syscall made
through another ABI, such as a 32-bit ``int 0x80`` or an x32 number, kills the process instead of
slipping past the rules) and compiles the rules to BPF.

The filter is compiled once per parent process (:func:`filter_program`) and exported as a BPF
program; the launcher loads those bytes with one ``prctl(PR_SET_SECCOMP)`` just before the exec
(:func:`install`, stdlib only), so a run loads no library and the filter needs nothing from the
minimal root. It needs no privileges, only ``no_new_privs``, which the launcher sets anyway.

Default: allow. Refused with EPERM (so Python raises ``PermissionError``):

* ``socket()`` of any family but AF_INET / AF_INET6 (AF_UNIX, AF_NETLINK, AF_PACKET, ...; the empty
  network namespace already makes those two useless), ``socketpair()`` other than AF_UNIX pairs of
  type SOCK_STREAM (asyncio's self-pipe): the type's low 4 bits (the flags SOCK_NONBLOCK and
  SOCK_CLOEXEC masked off) are compared with an allow-list of one, since on AF_UNIX the kernel
  treats SOCK_RAW as datagram, and a datagram socket could ``sendto()`` any socket path;
* memory outside the run's memory cgroup or address-space limit: ``memfd_create`` and
  ``memfd_secret`` (files with no path, whose pages a limit per process does not see) and
  ``shmget`` (SysV shared memory; the run's own IPC namespace allows none either, but without root
  the program could raise those limits);
* namespaces and the file view: ``unshare``, ``setns``, ``clone`` with a namespace flag, every
  mount call (old and new API), ``pivot_root``, ``chroot``; ``clone3`` gets ENOSYS (its flags sit
  in memory, where a filter cannot look), so glibc falls back to ``clone``, which is checked;
* other processes' memory: ``ptrace``, ``process_vm_readv/writev``, ``pidfd_getfd``;
* kernel facilities the sandbox has no use for: keyrings, ``bpf``, ``perf_event_open``,
  ``userfaultfd``, io_uring (its operations would bypass this filter), module and kexec loading,
  file handles, swap, reboot, the clock, ``syslog``, host names, ``acct``, ``quotactl``, port I/O.

Where pyseccomp or libseccomp is missing (or too old to know a syscall above),
:func:`filter_program` warns once and returns None: runs then go without a filter and their
``isolation`` lacks ``seccomp`` (the launcher never claims a filter it did not load).
"""

from __future__ import annotations

import ctypes
import errno
import os

__all__ = ["filter_program", "install"]

PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2
AF_INET, AF_INET6, AF_UNIX, SOCK_STREAM, SOCK_TYPE_MASK = 2, 10, 1, 1, 0xF
NAMESPACE_FLAGS = {  # clone() flags that make a namespace
    "CLONE_NEWNS": 0x00020000,
    "CLONE_NEWCGROUP": 0x02000000,
    "CLONE_NEWUTS": 0x04000000,
    "CLONE_NEWIPC": 0x08000000,
    "CLONE_NEWUSER": 0x10000000,
    "CLONE_NEWPID": 0x20000000,
    "CLONE_NEWNET": 0x40000000,
}
DENIED = (  # refused outright with EPERM; libseccomp >= 2.5.0 (Linux 5.8's syscall tables) knows each
    *("unshare", "setns", "pivot_root", "chroot", "mount", "umount2"),
    *("fsopen", "fsconfig", "fsmount", "fspick", "move_mount", "open_tree"),
    *("ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd"),
    *("keyctl", "add_key", "request_key", "bpf", "perf_event_open", "userfaultfd"),
    *("io_uring_setup", "io_uring_enter", "io_uring_register"),
    *("kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module"),
    *("open_by_handle_at", "name_to_handle_at", "swapon", "swapoff", "reboot", "acct", "quotactl"),
    *("settimeofday", "clock_settime", "clock_adjtime", "adjtimex", "syslog"),
    *("sethostname", "setdomainname", "iopl", "ioperm", "lookup_dcookie", "vhangup", "fanotify_init"),
    *("memfd_create", "shmget"),
)
DENIED_IF_KNOWN = ("memfd_secret",)  # Linux 5.14, libseccomp 2.5.2: an older library cannot name it


class _SockFprog(ctypes.Structure):
    """``struct sock_fprog``: the BPF program handed to the kernel."""

    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def _rules(sc) -> object:
    """The filter as a pyseccomp ``SyscallFilter`` (module docstring)."""
    f = sc.SyscallFilter(sc.ALLOW)
    f.set_attr(sc.Attr.ACT_BADARCH, sc.KILL_PROCESS)
    deny = sc.ERRNO(errno.EPERM)

    def add(action: int, name: str, *args, optional: bool = False) -> None:
        number = sc.resolve_syscall(sc.Arch.NATIVE, name)
        if number == -1:  # __NR_SCMP_ERROR: this libseccomp does not know the name
            if optional:
                return
            raise OSError(errno.ENOSYS, f"libseccomp does not know the syscall {name}")
        f.add_rule(action, number, *args)

    # socket(family, ...): one rule per refused value (a rule compares an argument once). The
    # comparisons are on all 64 bits and GT is unsigned, so a family with high bits set, which the
    # kernel would truncate to an int, is refused by the last rule.
    for family in (*range(AF_INET), *range(AF_INET + 1, AF_INET6)):
        add(deny, "socket", sc.Arg(0, sc.EQ, family))
    add(deny, "socket", sc.Arg(0, sc.GT, AF_INET6))
    add(deny, "socketpair", sc.Arg(0, sc.NE, AF_UNIX))
    for sock_type in range(SOCK_TYPE_MASK + 1):  # no "masked not-equal": every other type, one by one
        if sock_type != SOCK_STREAM:
            add(deny, "socketpair", sc.Arg(1, sc.MASKED_EQ, SOCK_TYPE_MASK, sock_type))
    for flag in NAMESPACE_FLAGS.values():
        add(deny, "clone", sc.Arg(0, sc.MASKED_EQ, flag, flag))
    add(sc.ERRNO(errno.ENOSYS), "clone3")
    for name in DENIED:
        add(deny, name)
    for name in DENIED_IF_KNOWN:
        add(deny, name, optional=True)
    return f


# filter_program's answer once computed (a dict, not functools.cache: the launcher imports this
# module too, and each import there is paid by every run)
_compiled: dict[str, bytes | None] = {}


def filter_program() -> bytes | None:
    """The BPF program of the filter, compiled once per process; None (and a warning, once)
    where pyseccomp or libseccomp is missing or cannot build it."""
    if "program" not in _compiled:
        _compiled["program"] = _compile()
    return _compiled["program"]


def _compile() -> bytes | None:
    """Build the rules with pyseccomp and export libseccomp's BPF (parent only: lazy imports)."""
    import tempfile
    import warnings

    try:
        import pyseccomp

        with tempfile.TemporaryFile() as out:
            _rules(pyseccomp).export_bpf(out)
            out.seek(0)
            program = out.read()
        if not program or len(program) % 8:
            raise OSError(errno.EINVAL, f"libseccomp exported {len(program)} bytes, not whole BPF instructions")
        return program
    except (ImportError, OSError, RuntimeError, ValueError, AttributeError) as exc:
        warnings.warn(
            f"creditrl.sandbox: no seccomp filter ({type(exc).__name__}: {exc}); runs go without one",
            RuntimeWarning,
            stacklevel=3,
        )
        return None


def install(program: bytes) -> None:
    """Load the BPF ``program`` into this process (needs ``no_new_privs`` or CAP_SYS_ADMIN).

    Raises:
        OSError: If the kernel refuses it (no seccomp filter support, a malformed program).
    """
    libc = ctypes.CDLL(None, use_errno=True)
    code = ctypes.create_string_buffer(program, len(program))
    fprog = _SockFprog(len(program) // 8, ctypes.addressof(code))
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"seccomp filter refused: {os.strerror(err)}")
