"""math-verify, bounded in time: answer checking, answer extraction and answer equivalence for the
``math`` task (:mod:`creditrl.tasks.math`).

Answer checking (:func:`answers_match`): the gold answer is parsed as written when it holds
``\\boxed`` or ``$``, else as ``\\boxed{answer}`` (so bare LaTeX such as ``2\\sqrt{2}`` parses);
the completion is parsed with math-verify's default extraction (LaTeX in ``$...$``/``\\(...\\)``/
``\\boxed{}``, else the last plain number or expression), then ``verify(gold, parsed)``.
Unparsable or garbage completions are False, never an exception.

Answers (:meth:`MathTask.extract_answer`, :meth:`MathTask.same_answer`, which majority votes
use): a completion's answer is the value math-verify extracts from it, written as LaTeX; two
answers are the same when math-verify verifies one against the other, so ``\\boxed{1/2}``,
``1/2`` and ``0.5`` vote together.

Timeouts: sympy can hang on a hostile completion (``\\boxed{9^{9^{9^{9}}}}``), and math-verify's
own ``signal.alarm`` timeouts work only in a process's main thread and only between Python
operations (one long C-level power ignores them). So every check, from any thread, is sent to a
helper process (started on first use, shared, one check at a time) that runs it in its main
thread under a SIGALRM timer of ``timeout_s`` (math-verify's own timers off), and is killed and
restarted if it does not answer within ``timeout_s`` plus a grace period. A check that times out
is False (and logged). POSIX only (SIGALRM).
"""

from __future__ import annotations

import atexit
import functools
import importlib
import json
import logging
import os
import select
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["answers_match", "extract_math_answer", "gold_problem", "gold_text", "same_math_answer"]

_GRACE_S = 2.0  # how much longer than timeout_s the helper process may take before it is killed
_STARTUP_S = 60.0  # the helper's start (python + sympy imports) is not counted in timeout_s

logger = logging.getLogger(__name__)


def gold_text(answer: str) -> str:
    """The text math-verify parses for a gold ``answer``: as written when it holds ``\\boxed`` or
    ``$``, else wrapped in ``\\boxed{}`` (bare LaTeX such as ``2\\sqrt{2}`` needs a delimiter)."""
    return answer if "\\boxed" in answer or "$" in answer else f"\\boxed{{{answer}}}"


@functools.lru_cache(maxsize=65536)
def _parse_gold(answer: str) -> tuple[Any, ...]:
    from math_verify import parse  # imported on first use: sympy takes a second to load

    return tuple(parse(gold_text(answer), parsing_timeout=None))


def _gold_problem(answer: str) -> str:
    """Why math-verify cannot use ``answer`` as a gold answer, or ``""`` when it can."""
    from sympy import nan, zoo

    values = [x for x in _parse_gold(answer) if not isinstance(x, str)]
    if not values:
        return f"math-verify finds no mathematical value in {answer!r}"
    if any(x.has(zoo) or x.has(nan) for x in values):
        return f"{answer!r} is not a number (math-verify reads it as {values[0]})"
    return ""


def _match(answer: str, completion: str) -> bool:
    from math_verify import parse, verify

    pred = parse(completion, parsing_timeout=None)
    return bool(pred) and verify(list(_parse_gold(answer)), pred, timeout_seconds=None)


def _extract(completion: str) -> str | None:
    from math_verify import parse
    from sympy import latex

    values = [x for x in parse(completion, parsing_timeout=None) if not isinstance(x, str)]
    return latex(values[0]) if values else None


def _same(a: str, b: str) -> bool:
    from math_verify import verify

    gold, pred = list(_parse_gold(a)), list(_parse_gold(b))
    return bool(gold) and bool(pred) and verify(gold, pred, timeout_seconds=None)


_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "match": _match,
    "gold_problem": _gold_problem,
    "extract": _extract,
    "same": _same,
}


def _preload() -> None:
    """Import math-verify and sympy before any timer runs: an import cut short by the alarm
    could leave half-initialised modules behind."""
    for module in ("sympy", "math_verify"):
        importlib.import_module(module)


class _CheckTimeout(BaseException):
    """Raised by the SIGALRM handler; a BaseException so math-verify's ``except Exception``
    clauses cannot swallow it."""


def _raise_timeout(signum: int, frame: Any) -> None:
    raise _CheckTimeout


def _with_alarm(seconds: float, fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` under a SIGALRM timer of ``seconds``; None when it fires. Main thread only.
    The previous SIGALRM handler is restored after; a timer someone else had set is cancelled."""
    previous = signal.signal(signal.SIGALRM, _raise_timeout)
    try:
        try:
            signal.setitimer(signal.ITIMER_REAL, seconds)
            return fn(*args)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    except _CheckTimeout:
        logger.warning("math-verify: %s timed out after %ss (treated as no match)", fn.__name__, seconds)
        return None
    finally:
        signal.signal(signal.SIGALRM, signal.SIG_DFL if previous is None else previous)


class _Helper:
    """A child process that runs math-verify calls in its own main thread, under its timer.

    One JSON line per request (``[function, args, timeout_s]``) and per answer (``{"result": ...}``).
    A child that does not answer in time (stuck in uninterruptible code) or dies is killed; the
    call returns None and the next call starts a fresh one.
    """

    def __init__(self, argv: list[str] | None = None) -> None:
        self.argv = argv or [sys.executable, "-c", "from creditrl.tasks.math_verify import _serve; _serve()"]
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[str] | None = None

    def _start(self) -> subprocess.Popen[str]:
        env = dict(os.environ)
        src = str(Path(__file__).resolve().parents[2])  # the folder holding the creditrl package
        env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
        return subprocess.Popen(self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1, env=env)

    def _read(self, proc: subprocess.Popen[str], timeout_s: float) -> Any:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
        line = proc.stdout.readline() if ready else ""
        if not line:
            raise TimeoutError
        return json.loads(line)["result"]

    def close(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            self._proc = None

    def call(self, function: str, args: tuple[Any, ...], timeout_s: float) -> Any:
        with self._lock:
            try:
                if self._proc is None:
                    self._proc = self._start()
                    self._read(self._proc, _STARTUP_S)  # the "ready" line, once imports are done
                assert self._proc.stdin is not None
                self._proc.stdin.write(json.dumps([function, list(args), timeout_s]) + "\n")
                self._proc.stdin.flush()
                return self._read(self._proc, timeout_s + _GRACE_S)
            except (TimeoutError, OSError, ValueError, KeyError) as exc:
                logger.warning("math-verify helper process: %s failed (%r); restarting it", function, exc)
                self.close()
                return None


_HELPER = _Helper()
atexit.register(_HELPER.close)


def _serve() -> None:
    """The helper's loop: answer requests from stdin until it closes."""
    for signum in (signal.SIGINT, signal.SIGTERM):  # a terminal's Ctrl-C reaches the whole process group:
        signal.signal(signum, signal.SIG_IGN)  # the trainer handles it, then closes stdin or kills this process
    _preload()
    print(json.dumps({"result": "ready"}), flush=True)
    for line in sys.stdin:
        function, args, timeout_s = json.loads(line)
        print(json.dumps({"result": _with_alarm(timeout_s, _FUNCTIONS[function], *args)}), flush=True)


def gold_problem(answer: str, *, timeout_s: float = 5.0) -> str | None:
    """What keeps a gold ``answer`` from parsing to a value (``""`` when it parses), or None when
    parsing took over ``timeout_s``."""
    return _HELPER.call("gold_problem", (answer,), timeout_s)


def answers_match(answer: str, completion: str, *, timeout_s: float = 5.0) -> bool:
    """Whether math-verify finds ``completion``'s final answer equal to the gold ``answer``.

    See the module docstring for the parsing rule and the ``timeout_s`` limit (a timeout is
    False). Safe to call from any thread.
    """
    return _HELPER.call("match", (answer, completion), timeout_s) is True


def extract_math_answer(completion: str, *, timeout_s: float = 5.0) -> str | None:
    """The final answer math-verify reads in ``completion`` (the extraction :func:`answers_match`
    applies to a completion), written out as LaTeX by sympy so that it parses back to the same
    value: ``" \\boxed{1/2}"`` -> ``"\\frac{1}{2}"``, ``"so 0.5"`` -> ``"0.5"``, ``"50%"`` ->
    ``"50 \\cdot \\frac{1}{100}"``. None when math-verify finds no value (or takes over ``timeout_s``)."""
    result = _HELPER.call("extract", (completion,), timeout_s)
    return result if isinstance(result, str) else None


@functools.lru_cache(maxsize=65536)
def same_math_answer(a: str, b: str, *, timeout_s: float = 5.0) -> bool:
    """Whether math-verify finds two answers equal, each parsed by the gold rule (:func:`gold_text`)
    and ``a`` taken as the gold side: ``"\\frac{1}{2}"`` and ``"0.5"`` agree. Equal strings always
    agree; a check over ``timeout_s`` is False. Cached: a majority vote asks for the same pairs
    at every N."""
    return a == b or _HELPER.call("same", (a, b), timeout_s) is True


for _name in ("math_verify.parser", "math_verify.grader"):  # drop the notice: this module provides the timeout
    logging.getLogger(_name).addFilter(lambda record: not record.getMessage().startswith("Timeout is disabled"))
