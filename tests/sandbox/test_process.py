"""run_python: results, limits, isolation, cleanup, and the documented non-root fallback."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from creditrl.sandbox import Limits, execute, run_python

ROOT = os.geteuid() == 0
FULL = {"hidden", "ipc", "memcg", "minroot", "net", "pid", "proc", "readonly", "seccomp", "shm", "tmpfs", "uid"}


def sandbox_dirs() -> set[str]:
    return {p.name for p in Path(tempfile.gettempdir()).glob("creditrl-sandbox-*")}


def test_runs_a_program_and_reports_its_output() -> None:
    before = sandbox_dirs()
    r = run_python("import sys\nprint(6 * 7)\nprint('oops', file=sys.stderr)\nsys.exit(3)")
    assert (r.stdout, r.stderr, r.returncode) == ("42\n", "oops\n", 3)
    assert not r.ok and r.reason == "exit status 3" and not r.timed_out
    ok = run_python("print('hi')")
    assert ok.ok and ok.reason == "" and ok.returncode == 0 and ok.stdout == "hi\n"
    assert sandbox_dirs() == before  # the working directories are removed


@pytest.mark.skipif(not ROOT, reason="full isolation needs root")
def test_root_gets_every_isolation_layer() -> None:
    prog = (
        "import os, sys, json\n"
        "print(json.dumps({'uid': os.getuid(), 'gid': os.getgid(), 'groups': os.getgroups(),\n"
        "  'env': sorted(os.environ), 'cwd': os.listdir('.'), 'isolated': sys.flags.isolated,\n"
        "  'procs': sorted(int(p) for p in os.listdir('/proc') if p.isdigit())}))"
    )
    r = run_python(prog)
    seen = json.loads(r.stdout)
    assert set(r.isolation) == FULL  # "net" among them
    assert seen["uid"] >= 2_000_000_000 and seen["gid"] == seen["uid"] and seen["groups"] == []
    assert seen["env"] == ["HOME", "LANG", "LC_ALL", "PATH", "PYTHONDONTWRITEBYTECODE", "TMPDIR"]
    assert seen["cwd"] == ["main.py"] and seen["isolated"] == 1
    assert seen["procs"] == [1, 2]  # its own PID namespace: the init and itself, nothing else
    assert json.loads(run_python(prog).stdout)["uid"] != seen["uid"]  # a fresh uid per run


def test_wall_timeout_kills_the_group() -> None:
    r = run_python("import os, time\nos.fork()\ntime.sleep(60)", timeout_s=0.5)
    assert r.timed_out and r.reason == "timeout" and r.returncode == -9 and not r.ok
    assert r.wall_s < 3


def test_cpu_limit() -> None:
    r = execute("while True: pass", Limits(timeout_s=10, cpu_s=1))
    assert r.reason == "cpu limit" and r.returncode == -24 and not r.timed_out and r.wall_s < 6


def test_memory_limit() -> None:
    """With a memory cgroup the kernel kills the program; with RLIMIT_AS alone it gets a
    MemoryError, which no one outside can tell from a printed one: its exit status, then."""
    r = run_python("x = bytearray(400 * 2**20)", memory_mb=128)
    if "memcg" in r.isolation:
        assert (r.reason, r.returncode) == ("memory limit", -9)
    else:
        assert r.reason == "exit status 1" and "MemoryError" in r.stderr


def test_a_printed_memory_error_is_not_the_memory_limit() -> None:
    r = run_python("import sys\nprint('MemoryError', file=sys.stderr)\nraise SystemExit(1)", memory_mb=128)
    assert (r.reason, r.returncode, r.stderr) == ("exit status 1", 1, "MemoryError\n")


def test_a_program_that_catches_sigxcpu_meets_the_cpu_limit() -> None:
    """It survives the soft limit's SIGXCPU and is killed at the hard one (SIGKILL): still the CPU
    limit, told apart from any other SIGKILL by the CPU time it used."""
    spin = "import signal\nsignal.signal(signal.SIGXCPU, lambda *a: None)\nwhile True: pass"
    r = execute(spin, Limits(timeout_s=20, cpu_s=1))
    assert (r.reason, r.returncode, r.timed_out) == ("cpu limit", -9, False)
    killed = run_python("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)")
    assert (killed.reason, killed.returncode) == ("signal SIGKILL", -9)
    faked = run_python("import os, signal\nos.kill(os.getpid(), signal.SIGXCPU)")
    assert (faked.reason, faked.returncode) == ("signal SIGXCPU", -24)


def test_a_lone_surrogate_gives_one_line_and_no_run() -> None:
    before = sandbox_dirs()
    r = run_python("print('\\ud800')\nx = '\ud800'")
    assert not r.ok and r.returncode is None and "\n" not in r.reason
    assert r.reason == "invalid source: character '\\ud800' at index 21 is not encodable as UTF-8"
    assert sandbox_dirs() == before
    escaped = run_python("print(len('\udcff'))")  # a stray byte that surrogateescape decoded: its byte back
    assert escaped.returncode == 1 and "SyntaxError" in escaped.stderr


def test_output_is_capped_and_a_flood_is_killed() -> None:
    r = run_python("print('x' * 5000)", output_bytes=1000)  # over the cap, under the kill threshold
    assert r.ok and r.stdout == "x" * 1000 and r.output_truncated
    flood = run_python("import sys\nwhile True: sys.stderr.write('y' * 65536)", output_bytes=1000, timeout_s=5)
    assert flood.reason == "output limit" and len(flood.stderr) == 1000 and flood.wall_s < 4


def test_file_size_limit() -> None:
    r = run_python("open('f', 'wb').write(b'x' * (3 * 2**20))", file_mb=1)
    assert r.returncode == 1 and "File too large" in r.stderr


def test_limits_are_validated() -> None:
    with pytest.raises(ValueError, match="timeout_s"):
        Limits(timeout_s=0)
    with pytest.raises(ValueError, match="memory_mb"):
        Limits(memory_mb=8)
    with pytest.raises(ValueError, match="cpu_s"):
        Limits(cpu_s=0)


def test_non_root_fallback_runs_as_the_caller(unprivileged) -> None:
    """Not root: same limits, clean environment and seccomp filter, no uid switch nor minimal
    root; network and IPC namespaces only where unprivileged user namespaces are allowed."""
    out = unprivileged.run(
        "import json\n"
        "from creditrl.sandbox import run_python\n"
        "r = run_python('import os; print(os.getuid(), sorted(os.environ), '\n"
        '               \'[x.split()[1] for x in open("/proc/self/status") if x.startswith("CapEff")])\',\n'
        "               timeout_s=3)\n"
        "t = run_python('while True: pass', timeout_s=0.5)\n"
        "u = run_python('import ctypes, errno; libc = ctypes.CDLL(None, use_errno=True);'\n"
        "               'print(libc.unshare(0x10000000), errno.errorcode[ctypes.get_errno()])')\n"
        "m = run_python('x = bytearray(400 * 2**20)', memory_mb=128)\n"
        "p = run_python('import socket\\nfor t in (socket.SOCK_RAW, socket.SOCK_DGRAM, socket.SOCK_STREAM):\\n'\n"
        "               '    try: print(len(socket.socketpair(socket.AF_UNIX, t)))\\n'\n"
        "               '    except OSError as exc: print(exc.errno)')\n"
        "print(json.dumps([r.stdout, r.isolation, t.reason, u.stdout, m.reason, p.stdout]))"
    )
    assert out.returncode == 0, out.stderr[-2000:]
    stdout, isolation, reason, unshared, memory, pairs = json.loads(out.stdout.strip().splitlines()[-1])
    assert pairs == "1\n1\n2\n"  # EPERM for the raw (datagram) and datagram pairs; a stream pair
    assert stdout.startswith("65534 ") and "SECRET" not in stdout
    assert stdout.endswith(" ['0000000000000000']\n")  # no capability, in a user namespace or not
    assert "uid" not in isolation and "pid" not in isolation and "minroot" not in isolation
    assert "memcg" not in isolation and memory == "exit status 1"  # RLIMIT_AS: a MemoryError
    assert {"net", "shm"} <= set(isolation) or "net" not in isolation  # both with a user namespace
    assert reason == "timeout"
    assert "seccomp" in isolation and unshared == "-1 EPERM\n"  # the filter needs no root


DAEMON = """\
import os, sys, time
r, w = os.pipe()
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.write(w, str(os.getpid()).encode())
        time.sleep(2)
        open(MARKER, "w").write("late")
    os._exit(0)
os.close(w)
print(os.read(r, 32).decode())
os.mkdir("locked")
os.chmod("locked", 0)
os.chmod(".", 0o500)
"""


def test_without_root_every_descendant_dies_with_the_run(unprivileged) -> None:
    """A setsid double-forked grandchild is gone when run_python returns, and a work directory that
    holds a chmod 0 subdirectory (and is itself read-only) is removed."""
    tmp = tempfile.mkdtemp(prefix="creditrl-fallback-")
    os.chmod(tmp, 0o777)
    marker = os.path.join(tmp, "marker")
    try:
        out = unprivileged.run(
            "import json, os, tempfile\n"
            f"tempfile.tempdir = {tmp!r}\n"
            "from creditrl.sandbox import run_python\n"
            f"r = run_python({DAEMON.replace('MARKER', repr(marker))!r}, timeout_s=10)\n"
            "pid = int(r.stdout)\n"
            "print(json.dumps([r.reason, os.path.exists(f'/proc/{pid}'), os.listdir(tempfile.tempdir)]))"
        )
        assert out.returncode == 0, out.stderr[-2000:]
        reason, alive, left = json.loads(out.stdout.strip().splitlines()[-1])
        assert (reason, alive, left) == ("", False, [])
        time.sleep(2.5)  # past the grandchild's sleep: it never wrote its file
        assert os.listdir(tmp) == []
    finally:
        shutil.rmtree(tmp)


def test_the_sandbox_works_from_a_thread() -> None:
    """The trainer scores in worker threads; no preexec_fn means no fork-in-thread hazard."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(2) as pool:
        outs = list(pool.map(lambda i: run_python(f"print({i} * 2)").stdout, range(4)))
    assert outs == ["0\n", "2\n", "4\n", "6\n"]
