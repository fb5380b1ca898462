"""Killing the caller of a run leaves nothing behind: no process of the run, no work directory.

A caller process runs a program that double-forks a ``setsid`` grandchild and both sleep; once
both run, the test notes every process below the caller (pid and start time, so a recycled pid
cannot pass for a survivor), kills the caller with SIGTERM or SIGKILL, and expects all of them
and the work directory gone within a few seconds: as root (the caller runs this interpreter) and
in the non-root fallback (the caller runs as nobody, see conftest.py).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest

from creditrl.sandbox._cleanup import descendants

PROGRAM = """\
import os, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        time.sleep(60)
    os._exit(0)
os.mkdir("locked")
os.chmod("locked", 0)
time.sleep(60)
"""
CALLER = """\
import tempfile
tempfile.tempdir = {tmp!r}
from creditrl.sandbox import run_python
run_python({program!r}, timeout_s=60)
"""
SETTLE_S = 5.0  # how long the run may take to be gone


def started_at(pid: int) -> int | None:
    """The start time of ``pid`` (clock ticks since boot), None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read()
    except OSError:
        return None
    return int(text[text.rindex(b")") + 2 :].split()[19])


def programs(pids: list[int]) -> list[int]:
    """Those of ``pids`` that run the sandboxed program (``python ... main.py``)."""
    found = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if f.read().endswith(b"\0main.py\0"):
                    found.append(pid)
        except OSError:
            pass
    return found


def kill_the_caller_and_check(caller: subprocess.Popen, tmp: str, signum: int) -> None:
    deadline = time.monotonic() + 30
    while len(programs(descendants(caller.pid))) < 2:  # the program and its grandchild
        assert caller.poll() is None, caller.stderr.read().decode()[-2000:]
        assert time.monotonic() < deadline, "the sandboxed program never started"
        time.sleep(0.05)
    time.sleep(0.2)  # the intermediate child has exited
    run = {pid: started_at(pid) for pid in descendants(caller.pid)}
    assert os.listdir(tmp) != []  # the work directory exists while the run does
    caller.send_signal(signum)
    caller.wait(timeout=10)
    end = time.monotonic() + SETTLE_S
    while True:
        alive = [pid for pid, start in run.items() if start is not None and started_at(pid) == start]
        left = os.listdir(tmp)
        if (not alive and not left) or time.monotonic() > end:
            break
        time.sleep(0.05)
    for pid in alive:  # let nothing outlive the test itself
        os.kill(pid, signal.SIGKILL)
    assert (alive, left) == ([], [])


@pytest.fixture
def tmp() -> str:
    """The callers' temporary directory, where each run makes its work directory."""
    path = tempfile.mkdtemp(prefix="creditrl-orphans-")
    os.chmod(path, 0o777)  # the non-root caller's too
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_killing_the_caller_ends_the_run(signum: int, tmp: str) -> None:
    code = CALLER.format(tmp=tmp, program=PROGRAM)
    caller = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE)
    try:
        kill_the_caller_and_check(caller, tmp, signum)
    finally:
        caller.kill()
        caller.wait()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_killing_an_unprivileged_caller_ends_the_run(signum: int, tmp: str, unprivileged) -> None:
    caller = unprivileged.popen(CALLER.format(tmp=tmp, program=PROGRAM), stderr=subprocess.PIPE)
    try:
        kill_the_caller_and_check(caller, tmp, signum)
    finally:
        caller.kill()
        caller.wait()
