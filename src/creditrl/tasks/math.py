"""Math word problems from JSONL or Parquet files, answers checked with math-verify.

A problem file holds one question and one gold answer per row (the column names are
arguments); it is read with Hugging Face ``datasets`` (``load_dataset("json" | "parquet",
data_files=...)``, local files only). The prompt is a template with ``{question}`` in it, and
a completion is correct when `math-verify <https://github.com/huggingface/Math-Verify>`_ finds
its final answer equal to the gold one::

    question: "What is 1/2 + 1/4?"   answer: "\\frac{3}{4}"
    prompt:   "Q: What is 1/2 + 1/4? A: "
    correct:  " \\boxed{\\frac{3}{4}}", " 3/4", " 0.75", "so it is $\\frac{6}{8}$"

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
own timeouts use ``signal.alarm``, which works only in a process's main thread (elsewhere
``parse`` raises ValueError) and only between Python operations: one long C-level power
ignores it. So every check, from any thread, is sent to a helper process (started on first
use, shared, one check at a time) that runs it in its main thread under a SIGALRM timer of
``timeout_s`` (math-verify's own timers are turned off, they would cancel it), and is killed
and restarted if it does not answer within ``timeout_s`` plus a grace period. A check that
times out is False (and logged). POSIX only (SIGALRM).

The built-in sample (``data/math_sample.jsonl``, 22 self-written problems) is the default
training file. Without a held-out file the rows are split by a hash of the question.
"""

from __future__ import annotations

import atexit
import functools
import hashlib
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

from creditrl.tasks.base import SPLITS, Problem, draw_from_pool, register_task

__all__ = [
    "SPLITS",
    "DEFAULT_TRAIN_FILE",
    "DEFAULT_TEMPLATE",
    "MathTask",
    "answers_match",
    "extract_math_answer",
    "gold_text",
    "load_math_rows",
    "same_math_answer",
]

DEFAULT_TRAIN_FILE = Path(__file__).with_name("data") / "math_sample.jsonl"
DEFAULT_TEMPLATE = "Q: {question} A: "
_FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}
_GRACE_S = 2.0  # how much longer than timeout_s the helper process may take before it is killed
_STARTUP_S = 60.0  # the helper's start (python + sympy imports) is not counted in timeout_s

logger = logging.getLogger(__name__)


# ----------------------------------------------------------------------------- math-verify


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

    Like math-verify's own timer, it takes SIGALRM (handler and ``ITIMER_REAL``) for the call and
    then restores the previous handler; a timer someone else had set is cancelled.
    """
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
        self.argv = argv or [sys.executable, "-c", "from creditrl.tasks.math import _serve; _serve()"]
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
    _preload()
    print(json.dumps({"result": "ready"}), flush=True)
    for line in sys.stdin:
        function, args, timeout_s = json.loads(line)
        print(json.dumps({"result": _with_alarm(timeout_s, _FUNCTIONS[function], *args)}), flush=True)


def _guarded(function: str, *args: Any, timeout_s: float) -> Any:
    """``_FUNCTIONS[function](*args)`` under a ``timeout_s`` limit from any thread (module doc):
    always in the helper process, which can be killed; an in-process alarm cannot stop sympy
    inside one long C-level operation (the ``9^{9^{9^9}}`` power)."""
    return _HELPER.call(function, args, timeout_s)


def answers_match(answer: str, completion: str, *, timeout_s: float = 5.0) -> bool:
    """Whether math-verify finds ``completion``'s final answer equal to the gold ``answer``.

    See the module docstring for the parsing rule and the ``timeout_s`` limit (a timeout is
    False). Safe to call from any thread.
    """
    return _guarded("match", answer, completion, timeout_s=timeout_s) is True


def extract_math_answer(completion: str, *, timeout_s: float = 5.0) -> str | None:
    """The final answer math-verify reads in ``completion`` (the extraction :func:`answers_match`
    applies to a completion), written out as LaTeX by sympy so that it parses back to the same
    value: ``" \\boxed{1/2}"`` -> ``"\\frac{1}{2}"``, ``"so 0.5"`` -> ``"0.5"``, ``"50%"`` ->
    ``"50 \\cdot \\frac{1}{100}"``. None when math-verify finds no value (or takes over ``timeout_s``)."""
    result = _guarded("extract", completion, timeout_s=timeout_s)
    return result if isinstance(result, str) else None


@functools.lru_cache(maxsize=65536)
def same_math_answer(a: str, b: str, *, timeout_s: float = 5.0) -> bool:
    """Whether math-verify finds two answers equal, each parsed by the gold rule (:func:`gold_text`)
    and ``a`` taken as the gold side: ``"\\frac{1}{2}"`` and ``"0.5"`` agree. Equal strings always
    agree; a check over ``timeout_s`` is False. Cached: a majority vote asks for the same pairs
    at every N."""
    return a == b or _guarded("same", a, b, timeout_s=timeout_s) is True


class _QuietTimeoutNotice(logging.Filter):
    """Drop math-verify's "Timeout is disabled" notice: this module provides the timeout."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Timeout is disabled")


for _name in ("math_verify.parser", "math_verify.grader"):
    logging.getLogger(_name).addFilter(_QuietTimeoutNotice())


# ----------------------------------------------------------------------------- files


def _text(value: Any) -> str | None:
    """A cell as text: strings as they are, numbers (not bools) written out, else None."""
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    return None


@functools.lru_cache(maxsize=16)
def _load_cached(
    path: str, stamp: tuple[int, int], question_key: str, answer_key: str, solution_key: str | None, timeout_s: float
) -> tuple[tuple[str, str, str | None], ...]:
    import datasets

    fmt = _FORMATS.get(Path(path).suffix.lower())
    if fmt is None:
        raise ValueError(f"{path}: unknown file type; expected one of {', '.join(_FORMATS)}")
    quiet = datasets.are_progress_bars_disabled()
    datasets.disable_progress_bars()
    try:
        table = datasets.load_dataset(fmt, data_files=path, split="train")
    except Exception as exc:  # noqa: BLE001 - any reader failure is a problem with the file
        raise ValueError(f"{path}: datasets cannot read it as {fmt}: {exc}") from exc
    finally:
        if not quiet:
            datasets.enable_progress_bars()
    keys = [question_key, answer_key] + ([solution_key] if solution_key else [])
    for key in keys:
        if key not in table.column_names:
            raise ValueError(f"{path}, row 1: field {key!r} is missing (columns: {', '.join(table.column_names)})")
    rows: list[tuple[str, str, str | None]] = []
    for number, row in enumerate(table, start=1):
        cells = {}
        for key in keys:
            text = _text(row[key])
            if text is None:
                raise ValueError(f"{path}, row {number}: field {key!r} is missing or not text (got {row[key]!r})")
            if not text.strip():
                raise ValueError(f"{path}, row {number}: field {key!r} is empty")
            cells[key] = text.strip() if key == answer_key else text
        why = _guarded("gold_problem", cells[answer_key], timeout_s=timeout_s)
        if why is None:
            why = f"parsing it took over {timeout_s}s"
        if why:
            raise ValueError(f"{path}, row {number}: field {answer_key!r} is not a usable gold answer: {why}")
        rows.append((cells[question_key], cells[answer_key], cells.get(solution_key) if solution_key else None))
    return tuple(rows)


def load_math_rows(
    path: str | Path,
    *,
    question_key: str = "question",
    answer_key: str = "answer",
    solution_key: str | None = None,
    timeout_s: float = 5.0,
) -> list[tuple[str, str, str | None]]:
    """Read ``(question, answer, solution or None)`` rows of a JSONL (``.jsonl``/``.json``) or
    Parquet file with ``datasets``; answers are stripped of surrounding whitespace.

    Numbers in a text column are written out (``3`` -> ``"3"``). Results are cached per file
    path, modification time and size.

    Raises:
        ValueError: Naming the file, the row (counted from 1) and the field: the file is missing,
            of an unknown type or unreadable, a column is missing, a cell is null, not text or
            empty, or math-verify cannot parse a gold answer (or takes over ``timeout_s``).
    """
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"{p}: no such file")
    st = p.stat()
    return list(
        _load_cached(str(p.resolve()), (st.st_mtime_ns, st.st_size), question_key, answer_key, solution_key, timeout_s)
    )


# ----------------------------------------------------------------------------- task


@register_task("math")
class MathTask:
    """Math word problems from files, checked with math-verify (registry name ``"math"``).

    Args:
        train_file: JSONL or Parquet file of training problems (default: the bundled sample).
        heldout_file: File of held-out problems; None splits ``train_file`` instead: a row is
            held out iff ``int(sha256(question).hexdigest(), 16) % heldout_mod == 0``.
        question_key, answer_key: Column names of the question and the gold answer.
        solution_key: Column of reference completions for supervised warm starts; None uses
            ``" " + gold_text(answer)`` (e.g. ``" \\boxed{7}"``).
        prompt_template: Every ``{question}`` in it is replaced by the question (other braces
            are literal, so LaTeX needs no escaping).
        heldout_mod: Modulus of the hash split (>= 2), about 1 in ``heldout_mod`` held out.
        step_separator: None (default): no steps, math has no step-level ground truth. A string
            (e.g. ``". "``) cuts completions into steps for step-level credit (Monte-Carlo or
            tree values, a PRM); :meth:`check_steps` then labels every step with the outcome.
        timeout_s: Wall-clock limit of one math-verify check (module docstring).
    """

    name: str = "math"
    step_separator: str | None = None

    def __init__(
        self,
        train_file: str | None = None,
        heldout_file: str | None = None,
        question_key: str = "question",
        answer_key: str = "answer",
        solution_key: str | None = None,
        prompt_template: str = DEFAULT_TEMPLATE,
        heldout_mod: int = 5,
        step_separator: str | None = None,
        timeout_s: float = 5.0,
    ) -> None:
        if "{question}" not in prompt_template:
            raise ValueError(f"prompt_template must contain '{{question}}', got {prompt_template!r}")
        if heldout_mod < 2:
            raise ValueError(f"heldout_mod must be >= 2, got {heldout_mod}")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        if step_separator == "":
            raise ValueError("step_separator must be a non-empty string or None")
        self.step_separator = step_separator
        self.prompt_template, self.heldout_mod, self.timeout_s = prompt_template, heldout_mod, timeout_s
        keys = {
            "question_key": question_key,
            "answer_key": answer_key,
            "solution_key": solution_key,
            "timeout_s": timeout_s,
        }
        train_path = str(train_file) if train_file else str(DEFAULT_TRAIN_FILE)
        self.pools: dict[str, list[Problem]] = {s: [] for s in SPLITS}
        for number, row in enumerate(load_math_rows(train_path, **keys), start=1):
            split = "train" if heldout_file else self.split_of(row[0])
            self.pools[split].append(self._problem(row, train_path, number, split))
        if heldout_file:
            for number, row in enumerate(load_math_rows(heldout_file, **keys), start=1):
                self.pools["heldout"].append(self._problem(row, str(heldout_file), number, "heldout"))

    def split_of(self, question: str) -> str:
        """``"heldout"`` iff ``int(sha256(question).hexdigest(), 16) % heldout_mod == 0``."""
        digest = int(hashlib.sha256(question.encode()).hexdigest(), 16)
        return "heldout" if digest % self.heldout_mod == 0 else "train"

    def _problem(self, row: tuple[str, str, str | None], file: str, number: int, split: str) -> Problem:
        question, answer, solution = row
        return Problem(
            prompt=self.prompt_template.replace("{question}", question),
            answer=answer,
            solution=solution if solution is not None else f" {gold_text(answer)}",
            meta={"file": file, "row": number, "split": split, "question": question},
        )

    def sample(self, n: int, *, split: str, seed: int) -> list[Problem]:
        """Return ``n`` problems of ``split`` drawn with replacement, deterministic in ``seed``.

        Raises:
            ValueError: If ``split`` is unknown, ``n < 0`` or the split has no problems.
        """
        return draw_from_pool(
            self.pools.get(split, []),
            n,
            split=split,
            seed=seed,
            namespace="math",
            empty=f"no {split!r} problems (set heldout_file, or lower heldout_mod)",
        )

    def check_outcome(self, problem: Problem, completion: str) -> bool:
        """Whether math-verify finds the completion's final answer equal to ``problem.answer``."""
        return answers_match(problem.answer, completion, timeout_s=self.timeout_s)

    def extract_answer(self, completion: str) -> str | None:
        """The final answer math-verify reads in ``completion``, as LaTeX (:func:`extract_math_answer`);
        None when it reads none. ``check_outcome(p, c)`` is ``same_answer(p.answer, extract_answer(c))``
        up to the round trip through LaTeX."""
        return extract_math_answer(completion, timeout_s=self.timeout_s)

    def same_answer(self, a: str, b: str) -> bool:
        """math-verify equivalence of two answers (:func:`same_math_answer`): ``\\boxed{1/2}`` and
        ``0.5`` read as the same answer."""
        return same_math_answer(a, b, timeout_s=self.timeout_s)

    def check_steps(self, problem: Problem, segments: list[str]) -> list[bool]:
        """Every step labelled with the outcome of the whole completion (no step ground truth).

        The completion is the segments joined as they are when each but the last ends with the
        separator (the spans of the score stage), else joined with the separator (a
        ``str.split``). Only meaningful as a weak proxy; see the class docstring.

        Raises:
            ValueError: If the task has no step separator.
        """
        sep = self.step_separator
        if sep is None:
            raise ValueError("task 'math' has no steps (step_separator is None); use a sequence-level reward")
        joined = "".join(segments) if all(s.endswith(sep) for s in segments[:-1]) else sep.join(segments)
        return [self.check_outcome(problem, joined)] * len(segments)
