"""Unit-test a candidate function in the sandbox; the parent alone decides what passed.

The candidate program (e.g. ``def add(a, b): return a + b``) runs in ONE sandboxed process
(:func:`creditrl.sandbox.process.execute`) inside a small runner that loads it, calls
``entry(*args)`` for every test input and writes one JSON line per call to fd 3::

    {"i": 0, "v": 5}            # test 0 returned 5
    {"i": 1, "e": "TypeError"}  # test 1 raised

Only the INPUTS enter the sandbox. The expected outputs stay in the parent (and the bundled
problem files are hidden from the sandbox), which compares each reported value with the
expected one (:func:`same_value`). So the verdict never rests on anything the program controls
except the values it returns: ``sys.exit(0)``, ``os._exit``, a patched ``assert``/``unittest``/
``builtins``, printed "PASS" lines, an exit status, or lines forged on fd 3 can at most report
values, and a reported value passes only if it IS the right answer, which the program has no
way to look up. A test passes iff exactly one line reports it and its value matches; missing,
duplicated, malformed or error lines fail. A run that times out keeps the tests it reported.

Programs that do not parse are failed without starting a process (``ast.parse`` in the parent:
it only parses, it runs nothing), which is most of an untrained policy's samples.
"""

from __future__ import annotations

import ast
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from creditrl.sandbox.process import Limits, SandboxResult, execute

__all__ = ["TestReport", "run_tests", "same_value"]

_MAX_PARSE_CHARS = 100_000  # longer programs are parsed in the sandbox only
_MAX_LINE_BYTES = 1 << 16

# The runner: its only output is one JSON line per test on fd 3. It holds no expected values.
_RUNNER = r"""
def _creditrl_runner(payload):
    import json, os
    write, dumps = os.write, json.dumps
    data = json.loads(payload)
    namespace = {"__name__": "__candidate__", "__builtins__": __builtins__}
    try:
        exec(compile(data["source"], "<candidate>", "exec"), namespace)
    except BaseException as exc:  # its own failure, sys.exit included: no test can pass
        write(3, dumps({"load_error": type(exc).__name__}).encode() + b"\n")
        return
    fn = namespace.get(data["entry"])
    for i, args in enumerate(data["inputs"]):
        try:
            line = dumps({"i": i, "v": fn(*args)})
        except BaseException as exc:
            line = dumps({"i": i, "e": type(exc).__name__})
        write(3, line.encode() + b"\n")
"""


@dataclass(frozen=True)
class TestReport:
    """Verdicts of one program on a list of tests."""

    passed: tuple[bool, ...]  # one per test, in order
    reason: str  # "" when the program ran cleanly; "syntax error", or the sandbox's reason
    sandbox: SandboxResult | None  # None when the program was rejected before running

    __test__ = False  # not a pytest class

    @property
    def fraction(self) -> float:
        """Share of tests passed, in [0, 1] (0.0 for an empty test list)."""
        return sum(self.passed) / len(self.passed) if self.passed else 0.0


def same_value(expected: Any, actual: Any, *, rel_tol: float = 1e-6, abs_tol: float = 1e-9) -> bool:
    """Whether a returned JSON value ``actual`` equals ``expected`` (plain JSON data).

    Booleans equal only booleans (``True != 1`` here), numbers equal numbers (an ``int``
    expected accepts an equal ``float``), a ``float`` expected is compared with
    ``math.isclose(rel_tol, abs_tol)`` (NaN never equals), strings and ``None`` by ``==``,
    lists element-wise (tuples arrive as lists) and dicts key-wise.
    """
    if isinstance(expected, bool) or isinstance(actual, bool):
        return type(expected) is type(actual) and expected == actual
    if isinstance(expected, (int, float)):
        if not isinstance(actual, (int, float)):
            return False
        if isinstance(expected, float) or isinstance(actual, float):
            return math.isclose(expected, actual, rel_tol=rel_tol, abs_tol=abs_tol)
        return expected == actual
    if isinstance(expected, list):
        return (
            isinstance(actual, list)
            and len(actual) == len(expected)
            and all(same_value(e, a, rel_tol=rel_tol, abs_tol=abs_tol) for e, a in zip(expected, actual))
        )
    if isinstance(expected, dict):
        return (
            isinstance(actual, dict)
            and actual.keys() == expected.keys()
            and all(same_value(expected[k], actual[k], rel_tol=rel_tol, abs_tol=abs_tol) for k in expected)
        )
    return type(expected) is type(actual) and expected == actual


def _parses(source: str) -> bool:
    """False only when the parent is sure the program has a syntax error."""
    if len(source) > _MAX_PARSE_CHARS:
        return True
    try:
        ast.parse(source)
    except SyntaxError:
        return False
    except (ValueError, MemoryError, RecursionError):  # e.g. a null byte, a pathological nesting
        return True
    return True


def _reported(channel: bytes, n_tests: int) -> dict[int, list[dict]]:
    """Lines of the channel that name a test, grouped by test index."""
    out: dict[int, list[dict]] = {}
    for line in channel.splitlines():
        if len(line) > _MAX_LINE_BYTES:
            continue
        try:
            record = json.loads(line)
        except (ValueError, RecursionError):
            continue
        index = record.get("i") if isinstance(record, dict) else None
        if type(index) is int and 0 <= index < n_tests:
            out.setdefault(index, []).append(record)
    return out


def run_tests(
    source: str,
    entry: str,
    inputs: Sequence[Sequence[Any]],
    expected: Sequence[Any],
    *,
    limits: Limits | None = None,
    hidden_paths: tuple[str, ...] = (),
) -> TestReport:
    """Run ``entry(*inputs[k])`` of the program ``source`` in one sandboxed process and compare
    each result with ``expected[k]`` in the parent (module docstring).

    ``inputs`` and ``expected`` must be JSON data; ``limits`` default to 2 s and 256 MB for the
    whole program. ``hidden_paths`` are hidden from the program besides the creditrl package.

    Raises:
        ValueError: If ``inputs`` and ``expected`` differ in length or ``entry`` is not an identifier.
    """
    if len(inputs) != len(expected):
        raise ValueError(f"got {len(inputs)} test inputs but {len(expected)} expected outputs")
    if not entry.isidentifier():
        raise ValueError(f"entry must be a Python identifier, got {entry!r}")
    if not _parses(source):
        return TestReport(passed=(False,) * len(inputs), reason="syntax error", sandbox=None)
    payload = json.dumps({"source": source, "entry": entry, "inputs": [list(a) for a in inputs]})
    program = f"{_RUNNER}\n_creditrl_runner({payload!r})\n"
    result = execute(program, limits or Limits(timeout_s=2.0, memory_mb=256), hidden_paths=hidden_paths, channel=True)
    reports = _reported(result.channel, len(inputs))
    passed = []
    for k, want in enumerate(expected):
        lines = reports.get(k, [])
        passed.append(len(lines) == 1 and "v" in lines[0] and same_value(want, lines[0]["v"]))
    return TestReport(passed=tuple(passed), reason=result.reason, sandbox=result)
