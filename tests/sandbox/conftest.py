"""The non-root fallback, tested from root: a caller process that runs as the user nobody."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
SYSTEM_PYTHONS = ("/usr/bin/python3.11", "/usr/local/bin/python3.11", "/usr/bin/python3")
NOBODY = 65534


class Unprivileged:
    """Starts Python code as nobody, under a system interpreter (the test's own may live under a
    0700 /root), with the sandbox package (copied alone, with pyseccomp's one module) importable."""

    def __init__(self, python: str, path: Path) -> None:
        self.python, self.path = python, path

    def command(self, code: str) -> list[str]:
        return [self.python, "-I", "-c", f"import sys; sys.path.insert(0, {str(self.path)!r})\n{code}"]

    def popen(self, code: str, **kwargs) -> subprocess.Popen:
        return subprocess.Popen(
            self.command(code), user=NOBODY, group=NOBODY, extra_groups=[], env={}, cwd="/", **kwargs
        )

    def run(self, code: str, timeout: float = 60) -> subprocess.CompletedProcess:
        """Run ``code``; skip the test where the system interpreter lacks a module it needs."""
        out = subprocess.run(
            self.command(code),
            user=NOBODY,
            group=NOBODY,
            extra_groups=[],
            env={"SECRET": "s3"},
            cwd="/",
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        missing = re.search(r"No module named '([\w.]+)'", out.stderr) if out.returncode != 0 else None
        # only a module the system interpreter lacks is the machine's matter; the sandbox package
        # itself (copied alone) must import nothing of creditrl beyond it
        if missing and not missing.group(1).startswith("creditrl"):
            pytest.skip(f"the system interpreter {self.python} lacks {missing.group(1)!r}: {out.stderr[-200:]}")
        return out


@pytest.fixture
def unprivileged() -> Iterator[Unprivileged]:
    if os.geteuid() != 0:
        pytest.skip("needs root to start a caller as the user nobody")
    found = [p for p in SYSTEM_PYTHONS if os.path.exists(p)]
    if not found:
        pytest.skip("no system interpreter that the user nobody can run")
    import pyseccomp  # a dependency; only the copy needs its file

    work = Path(tempfile.mkdtemp())
    shutil.copytree(SRC / "creditrl" / "sandbox", work / "creditrl" / "sandbox")
    (work / "creditrl" / "__init__.py").write_text("")
    shutil.copy(pyseccomp.__file__, work)
    os.chmod(work, 0o755)
    try:
        yield Unprivileged(found[0], work)
    finally:
        shutil.rmtree(work)
