"""Hostile programs against the minimal root and the seccomp filter (root, like CI).

Each program prints what it got, one ``key value`` line per attempt (an errno name such as
``EPERM``, or what it saw); the test asserts that exact outcome, and that the run's isolation
lists ``minroot`` and ``seccomp``. The raw-syscall cases use x86_64 numbers and skip elsewhere.
Python 3.11 has no ``os.unshare``: the programs call libc's through ctypes (``os.unshare`` where
it exists).
"""

from __future__ import annotations

import ast
import email
import os
import platform
import re
import secrets
import socket
import sys
import tempfile
import warnings
from pathlib import Path

import pytest

from creditrl.sandbox import SandboxResult, _rootfs, _seccomp, run_python

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the minimal root needs root (CI runs as root)")
x86_64 = pytest.mark.skipif(platform.machine() != "x86_64", reason="raw syscall numbers of x86_64")

REPO = Path(__file__).resolve().parents[2]
VENV = Path(sys.prefix)
LAYERS = {"minroot", "seccomp", "readonly", "hidden", "tmpfs", "uid", "net", "pid", "proc", "ipc", "shm", "memcg"}

PRELUDE = """\
import ctypes, errno, os, socket, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def name(err): return errno.errorcode.get(err, str(err))
def c(ret): return "ok" if ret >= 0 else name(ctypes.get_errno())
def attempt(key, fn):
    try: value = fn()
    except OSError as exc: value = name(exc.errno)
    print(key, value)
def unshare(flags):
    if hasattr(os, "unshare"):
        os.unshare(flags)
        return "ok"
    return c(libc.unshare(flags))
CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWNET = 0x00020000, 0x10000000, 0x40000000
"""


def run(body: str, **values: object) -> tuple[dict[str, str], SandboxResult]:
    """Run ``PRELUDE + body`` (``NAME`` placeholders replaced by ``repr(value)``); its lines as a dict."""
    for key, value in values.items():
        body = body.replace(key, repr(value))
    result = run_python(PRELUDE + body, timeout_s=10)
    assert result.ok, (result.reason, result.stderr[-800:])
    assert set(result.isolation) == LAYERS, result.isolation
    seen = dict(line.split(" ", 1) for line in result.stdout.splitlines())
    return seen, result


def test_a_host_unix_socket_is_unreachable() -> None:
    """A 0777 listening socket in a 0777 host directory: not in the root, and AF_UNIX is refused."""
    directory = Path(tempfile.mkdtemp(prefix="creditrl-unix-"))
    os.chmod(directory, 0o777)
    path = directory / "service.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(str(path))
        os.chmod(path, 0o777)
        listener.listen(8)
        listener.setblocking(False)
        seen, _ = run(
            "print('visible', os.path.exists(PATH))\n"
            "attempt('unix', lambda: socket.socket(socket.AF_UNIX, socket.SOCK_STREAM).connect(PATH))\n"
            "attempt('unix_dgram', lambda: socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM).sendto(b'x', PATH))\n"
            "attempt('dgram_pair', lambda: socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM))\n"
            "attempt('raw_pair', lambda: socket.socketpair(socket.AF_UNIX, socket.SOCK_RAW))\n"  # datagram on AF_UNIX
            "attempt('seqpacket_pair', lambda: socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET))\n"
            "flagged = socket.SOCK_DGRAM | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC\n"
            "attempt('flagged_dgram_pair', lambda: socket.socketpair(socket.AF_UNIX, flagged))\n"
            "a, b = socket.socketpair()\n"  # a stream pair (asyncio's self-pipe) still works
            "a.send(b'x')\nprint('stream_pair', b.recv(1).decode())\n"
            "a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_NONBLOCK)\n"
            "a.send(b'y')\nprint('flagged_stream_pair', b.recv(1).decode())",
            PATH=str(path),
        )
        assert seen == {
            "visible": "False",
            "unix": "EPERM",
            "unix_dgram": "EPERM",
            "dgram_pair": "EPERM",
            "raw_pair": "EPERM",
            "seqpacket_pair": "EPERM",
            "flagged_dgram_pair": "EPERM",
            "stream_pair": "x",
            "flagged_stream_pair": "y",
        }
        with pytest.raises(BlockingIOError):
            listener.accept()
    finally:
        listener.close()
        path.unlink(missing_ok=True)
        directory.rmdir()


@x86_64
def test_a_socket_family_with_high_bits_is_refused() -> None:
    """socket(0x1_00000001): the kernel truncates the family to AF_UNIX; the 64-bit rule refuses it."""
    seen, _ = run("print('raw_unix', c(libc.syscall(41, ctypes.c_long(0x100000001), socket.SOCK_STREAM, 0)))")
    assert seen == {"raw_unix": "EPERM"}


def test_the_init_s_command_line_holds_nothing_of_the_host() -> None:
    """The launcher gets its configuration on stdin and its own source by descriptor: /proc/1/cmdline
    (the namespace's init, a fork of it) names the interpreter (in the root anyway) and /dev/fd."""
    seen, _ = run(
        "print('cmdline', open('/proc/1/cmdline', 'rb').read().split(b'\\0')[1:])\n"
        "print('cwd', os.getcwd())\n"
        "attempt('environ', lambda: open('/proc/1/environ', 'rb').read())"
    )
    arguments = ast.literal_eval(seen["cmdline"])
    assert arguments[:2] == [b"-I", b"-S"] and re.fullmatch(rb"/dev/fd/\d+\x00?", b"\0".join(arguments[2:]))
    text = seen["cmdline"]
    for host in (seen["cwd"], str(REPO), str(VENV), "{", "creditrl"):
        assert host not in text, host
    assert seen["environ"] == "EACCES"  # and empty: the launcher's environment is {}


def test_netlink_and_packet_sockets_are_refused_inet_is_not() -> None:
    seen, _ = run(
        "attempt('netlink', lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0))\n"
        "attempt('packet', lambda: socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0))\n"
        "attempt('inet', lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM).close() or 'ok')\n"
        "attempt('inet_connect', lambda: socket.create_connection(('127.0.0.1', 9), timeout=0.5))"
    )
    # AF_INET is allowed, and useless: the network namespace has only a down loopback
    assert seen == {"netlink": "EPERM", "packet": "EPERM", "inet": "ok", "inet_connect": "ENETUNREACH"}


def test_host_files_the_project_and_its_venv_are_not_in_the_root() -> None:
    token = secrets.token_hex(16)
    directory = Path(tempfile.mkdtemp(prefix="creditrl-readable-"))
    os.chmod(directory, 0o755)
    secret = directory / "secret.txt"
    secret.write_text(token)
    os.chmod(secret, 0o644)
    try:
        seen, result = run(
            "attempt('secret', lambda: open(SECRET).read())\n"
            "for key, path in (('repo', REPO), ('venv', VENV), ('home', '/home'), ('sys', '/sys'), ('run', '/run')):\n"
            "    attempt(key, lambda: os.listdir(path))\n"
            "attempt('passwd', lambda: open('/etc/passwd').read())\n"
            "print('etc', sorted(os.listdir('/etc')))\n"
            "print('tmp', os.listdir('/tmp') == [os.path.basename(os.getcwd())])\n"
            "print('root', sorted(os.listdir('/')))\n"
            "print('site_packages', os.listdir(next(p for p in sys.path if p.endswith('-packages'))))",
            SECRET=str(secret),
            REPO=str(REPO),
            VENV=str(VENV),
        )
    finally:
        secret.unlink()
        directory.rmdir()
    assert token not in result.stdout + result.stderr
    for key in ("secret", "repo", "venv", "home", "sys", "run", "passwd"):
        assert seen[key] == "ENOENT", (key, seen[key])
    assert seen["etc"] == "['ld.so.cache']" and seen["tmp"] == "True" and seen["site_packages"] == "[]"
    # the top level holds the exposed trees' first components and nothing else of the host
    exposed = [sys.base_prefix, *_rootfs.LIBRARY_DIRS, *_rootfs.HOST_DATA, "/dev", "/proc", tempfile.gettempdir()]
    assert set(ast.literal_eval(seen["root"])) <= {p.split("/")[1] for p in exposed}, seen["root"]


def test_hidden_paths_inside_an_exposed_tree_are_covered() -> None:
    """``hidden_paths`` still hide what the minimal root does hold (here a stdlib package)."""
    package = os.path.dirname(email.__file__)
    result = run_python(f"import os\nprint(os.listdir({package!r}))", hidden_paths=(package,))
    assert result.ok and result.stdout == "[]\n" and {"minroot", "hidden"} <= set(result.isolation)
    assert "__init__.py" in run_python(f"import os\nprint(os.listdir({package!r}))").stdout


def test_namespaces_and_mounts_are_refused() -> None:
    seen, _ = run(
        "attempt('unshare_user', lambda: unshare(CLONE_NEWUSER))\n"
        "attempt('unshare_mount', lambda: unshare(CLONE_NEWNS))\n"
        "attempt('unshare_net', lambda: unshare(CLONE_NEWNET))\n"
        "os.mkdir('m')\n"
        "print('mount', c(libc.mount(b'none', b'm', b'tmpfs', 0, None)))\n"
        "fd = os.open('/proc/self/ns/net', os.O_RDONLY)\n"
        "print('setns', c(libc.setns(fd, 0)))\n"
        "print('chroot', c(libc.chroot(b'm')))"
    )
    assert seen == {k: "EPERM" for k in ("unshare_user", "unshare_mount", "unshare_net", "mount", "setns", "chroot")}


@x86_64
def test_a_nested_unshare_r_through_raw_syscalls_is_refused() -> None:
    """What ``unshare -r`` does (a user namespace with uid 0 mapped, then a mount), by syscall number;
    ``clone`` with a namespace flag is refused too, ``clone3`` answers ENOSYS (glibc's fallback)."""
    seen, _ = run(
        "print('unshare', c(libc.syscall(272, CLONE_NEWUSER | CLONE_NEWNS)))\n"
        "fd = os.open('/proc/self/uid_map', os.O_WRONLY)\n"
        "attempt('uid_map', lambda: os.write(fd, f'0 {os.getuid()} 1'.encode()))\n"
        "print('mount', c(libc.syscall(165, b'none', b'/tmp', b'tmpfs', 0, None)))\n"
        "pid = libc.syscall(56, CLONE_NEWUSER | 17, 0, 0, 0, 0)\n"
        "if pid == 0: os._exit(0)\n"
        "print('clone', c(pid))\n"
        "print('clone3', c(libc.syscall(435, 0, 0)))\n"
        "print('pivot_root', c(libc.syscall(155, b'.', b'.')))"
    )
    # the uid_map write fails because there is no new user namespace to map (its own is not writable)
    assert seen == {
        "unshare": "EPERM",
        "uid_map": "EPERM",
        "mount": "EPERM",
        "clone": "EPERM",
        "clone3": "ENOSYS",
        "pivot_root": "EPERM",
    }


def test_ptrace_and_process_memory_are_refused() -> None:
    seen, _ = run(
        "import signal, time\n"
        "child = os.fork()\n"
        "if child == 0:\n    time.sleep(30)\n    os._exit(0)\n"
        "print('attach', c(libc.ptrace(16, child, None, None)))\n"  # PTRACE_ATTACH to its own child
        "print('traceme', c(libc.ptrace(0, 0, None, None)))\n"
        "buf = ctypes.create_string_buffer(8)\n"
        "iov = (ctypes.c_void_p * 2)(ctypes.addressof(buf), 8)\n"
        "print('vm_read', c(libc.process_vm_readv(child, iov, 1, iov, 1, 0)))\n"
        "os.kill(child, signal.SIGKILL)\nos.waitpid(child, 0)"
    )
    assert seen == {"attach": "EPERM", "traceme": "EPERM", "vm_read": "EPERM"}


def test_ordinary_programs_still_work() -> None:
    """Threads (clone3 falls back to clone), fork, a subprocess of the interpreter, asyncio, the
    stdlib's C extensions (their libraries are in the root), devices, time zones, the workdir."""
    seen, _ = run(
        "import asyncio, bz2, decimal, hashlib, lzma, sqlite3, ssl, subprocess, tempfile, threading, zlib, zoneinfo\n"
        "t = threading.Thread(target=print, args=('thread', 'ok'))\nt.start()\nt.join()\n"
        "pid = os.fork()\nif pid == 0: os._exit(7)\n"
        "print('fork', os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))\n"
        "out = subprocess.run([sys.executable, '-c', 'print(6 * 7)'], capture_output=True, text=True).stdout\n"
        "print('subprocess', out.strip())\n"
        "async def f(): return 'ok'\nprint('asyncio', asyncio.run(f()))\n"
        "print('sqlite', sqlite3.connect(':memory:').execute('select 6 * 7').fetchone()[0])\n"
        "open('/dev/null', 'w').write('x')\nprint('urandom', len(open('/dev/urandom', 'rb').read(8)))\n"
        "print('zone', zoneinfo.ZoneInfo('Europe/Paris').key)\n"
        "with tempfile.NamedTemporaryFile() as f: print('tempfile', f.name.startswith(os.getcwd()))"
    )
    assert seen == {
        "thread": "ok",
        "fork": "7",
        "subprocess": "42",
        "asyncio": "ok",
        "sqlite": "42",
        "urandom": "8",
        "zone": "Europe/Paris",
        "tempfile": "True",
    }


def test_without_the_library_the_filter_is_absent_and_not_claimed(monkeypatch: pytest.MonkeyPatch) -> None:
    """pyseccomp missing: a warning, and runs go on without ``seccomp`` in their isolation."""
    monkeypatch.setitem(sys.modules, "pyseccomp", None)  # import pyseccomp raises ImportError
    monkeypatch.setattr(_seccomp, "_compiled", {})  # compiled afresh here, and as before afterwards
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert _seccomp.filter_program() is None
    assert any("no seccomp filter" in str(w.message) for w in caught)
    result = run_python(PRELUDE + "attempt('netlink', lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW) and 1)")
    assert result.ok and set(result.isolation) == LAYERS - {"seccomp"}
    assert result.stdout == "netlink 1\n"  # what the filter would have refused
