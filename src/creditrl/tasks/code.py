"""Write a one-line Python function body; judged by unit tests run in the sandbox.

A problem is a function header with a docstring, ending in ``return ``; the completion is the
returned expression, and the program is prompt + completion (one line: the tiny model's
tokenizer has no newline)::

    prompt:     def add(a, b): "sum of a and b"; return
    completion: a + b

Problems come from a small bundled, self-written JSONL file (``data/code_problems.jsonl``; one
object per line: ``name``, ``split`` (``train``/``heldout``: disjoint sets of functions),
``entry``, ``prompt``, ``solution``, ``tests``: ``[{"args": [...], "expected": ...}]``).
A completion's tests run in one sandboxed process (:func:`creditrl.sandbox.run_tests`); the
verdicts are cached per (problem, completion), so the outcome check and the ``unit_tests``
reward of the same sample run it once. The expected outputs never enter the sandbox, and the
problem file's directory is hidden from it. Without root the sandbox falls back to weaker
isolation (:mod:`creditrl.sandbox.process`); the task then warns once.
"""

from __future__ import annotations

import ast
import threading
import warnings
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from creditrl.sandbox import Limits, run_tests
from creditrl.tasks.base import SPLITS, Problem, draw_from_pool, register_task
from creditrl.tasks.datafile import MAX_ROW_BYTES, DataRows, read_rows, short_repr, type_name

__all__ = ["SPLITS", "DEFAULT_PROBLEMS", "CodeTask", "load_problems"]

DEFAULT_PROBLEMS = Path(__file__).with_name("data") / "code_problems.jsonl"
_FIELDS = ("name", "split", "entry", "prompt", "solution", "tests")


def _problem(rows: DataRows, number: int, row: dict[str, Any]) -> Problem:
    """One problem row as a :class:`Problem`; a missing or mistyped field names its line."""
    for key in _FIELDS:
        if key not in row:
            raise rows.field_error(number, key, f"missing (a problem needs {', '.join(_FIELDS)})")
    for key in ("name", "entry", "prompt", "solution"):
        if not isinstance(row[key], str) or not row[key]:
            raise rows.field_error(
                number, key, f"expected a non-empty string, got {short_repr(row[key])} ({type_name(row[key])})"
            )
    if row["split"] not in SPLITS:
        raise rows.field_error(number, "split", f"expected one of {', '.join(SPLITS)}, got {short_repr(row['split'])}")
    tests = row["tests"]
    if not isinstance(tests, list) or not tests:
        raise rows.field_error(
            number, "tests", f'expected a non-empty list of {{"args": [...], "expected": ...}}, got {short_repr(tests)}'
        )
    for k, test in enumerate(tests):
        if not isinstance(test, dict) or "expected" not in test or not isinstance(test.get("args"), list):
            raise rows.field_error(
                number, f"tests[{k}]", f'expected an object {{"args": [...], "expected": ...}}, got {short_repr(test)}'
            )
    meta = {
        "name": row["name"],
        "split": row["split"],
        "entry": row["entry"],
        "inputs": [t["args"] for t in tests],
        "expected": [t["expected"] for t in tests],
    }
    return Problem(prompt=row["prompt"], answer=row["solution"], solution=row["solution"], meta=meta)


def load_problems(path: str | Path, *, max_row_bytes: int = MAX_ROW_BYTES, long_rows: str = "error") -> list[Problem]:
    """Read a problem file (module docstring; ``.jsonl``, or ``.json``: JSON Lines or an array of
    objects) into :class:`Problem` objects, with :func:`~creditrl.tasks.datafile.read_rows`.
    ``answer`` and ``solution`` are the reference completion; ``meta`` holds ``name``,
    ``split``, ``entry``, ``inputs`` (the test arguments) and ``expected`` (their results).

    Raises:
        DataFileError: (a ValueError) One line naming the file and the line: the reader's errors,
            a missing field, one of the wrong type, a split not in ``SPLITS``, no tests, or a
            duplicate name.
    """
    rows = read_rows(path, suffixes=(".jsonl", ".json"), max_row_bytes=max_row_bytes, long_rows=long_rows)
    problems: list[Problem] = []
    first_line: dict[str, int] = {}
    for number, row in rows.rows:
        problem = _problem(rows, number, row)
        name = problem.meta["name"]
        if name in first_line:
            raise rows.field_error(
                number, "name", f"duplicate problem name {name!r} (first at {rows.unit} {first_line[name]})"
            )
        first_line[name] = number
        problems.append(problem)
    return problems


@register_task("code")
class CodeTask:
    """One-line Python functions judged by unit tests (registry name ``"code"``, no steps).

    Args:
        problems: A problem file (default: the bundled one).
        timeout_s: Wall-time limit of one program (all its tests).
        memory_mb: Address-space limit per process of a program.
        workers: Programs run in parallel by :meth:`test_results_batch`.
        cache_size: Verdicts remembered (least recently used are dropped).
        max_row_bytes, long_rows: The longest row of the problem file (default 16 MiB), and
            whether a longer one is refused (``"error"``) or left out (``"skip"``).
    """

    name: str = "code"
    step_separator: str | None = None

    def __init__(
        self,
        problems: str | None = None,
        timeout_s: float = 2.0,
        memory_mb: int = 256,
        workers: int = 2,
        cache_size: int = 4096,
        max_row_bytes: int = MAX_ROW_BYTES,
        long_rows: str = "error",
    ) -> None:
        path = Path(problems) if problems else DEFAULT_PROBLEMS
        self.problems = load_problems(path, max_row_bytes=max_row_bytes, long_rows=long_rows)
        self.limits = Limits(timeout_s=timeout_s, memory_mb=memory_mb)
        if workers < 1 or cache_size < 0:
            raise ValueError(f"workers must be >= 1 and cache_size >= 0, got {workers}, {cache_size}")
        self.workers, self.cache_size = workers, cache_size
        self.hidden_paths = (str(path.resolve().parent),)
        self.pools = {s: [p for p in self.problems if p.meta["split"] == s] for s in SPLITS}
        self._cache: OrderedDict[tuple[str, str, str], tuple[bool, ...]] = OrderedDict()
        self._lock = threading.Lock()
        self._warned = False

    def sample(self, n: int, *, split: str, seed: int) -> list[Problem]:
        """``n`` problems of ``split`` drawn with replacement (:func:`~creditrl.tasks.base.draw_from_pool`)."""
        return draw_from_pool(
            self.pools.get(split, []),
            n,
            split=split,
            seed=seed,
            namespace="code",
            empty=f"the problem file has no {split!r} problems",
        )

    # -- judging ---------------------------------------------------------------------------
    @staticmethod
    def _key(problem: Problem, completion: str) -> tuple[str, str, str]:
        return (problem.meta["name"], problem.prompt, completion)

    def _run(self, problem: Problem, completion: str) -> tuple[bool, ...]:
        meta = problem.meta
        report = run_tests(
            problem.prompt + completion,
            meta["entry"],
            meta["inputs"],
            meta["expected"],
            limits=self.limits,
            hidden_paths=self.hidden_paths,
        )
        isolation = report.sandbox.isolation if report.sandbox is not None else None
        if isolation is not None and not self._warned and not {"net", "uid"} <= set(isolation):
            self._warned = True  # the documented fallback (not root): say so once, then go on
            warnings.warn(
                f"task 'code': the sandbox runs programs with isolation {sorted(isolation)} only; "
                "without 'uid' they run as this user, without 'net' they can reach the network",
                RuntimeWarning,
                stacklevel=2,
            )
        return report.passed

    def test_results_batch(self, problems: Sequence[Problem], completions: Sequence[str]) -> list[tuple[bool, ...]]:
        """Per response, one verdict per unit test; uncached programs run ``workers`` at a time."""
        if len(problems) != len(completions):
            raise ValueError(f"got {len(problems)} problems and {len(completions)} completions")
        keys = [self._key(p, c) for p, c in zip(problems, completions)]
        with self._lock:
            known = {k: self._cache[k] for k in keys if k in self._cache}
        todo = {k: (p, c) for k, p, c in zip(keys, problems, completions) if k not in known}
        if todo:
            with ThreadPoolExecutor(max_workers=min(self.workers, len(todo))) as pool:
                fresh = dict(zip(todo, pool.map(lambda pc: self._run(*pc), todo.values())))
            known.update(fresh)
        with self._lock:
            for k in keys:
                self._cache[k] = known[k]
                self._cache.move_to_end(k)
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        return [known[k] for k in keys]

    def test_results(self, problem: Problem, completion: str) -> tuple[bool, ...]:
        """One verdict per unit test of ``problem`` for ``completion`` (cached)."""
        return self.test_results_batch([problem], [completion])[0]

    def check_outcome(self, problem: Problem, completion: str) -> bool:
        """Whether the program ``problem.prompt + completion`` passes every unit test."""
        return all(self.test_results(problem, completion))

    def extract_answer(self, completion: str) -> str | None:
        """The program's answer: ``def f(): return `` + ``completion`` parsed and written back by
        Python's ``ast``, so formatting, comments and redundant parentheses do not count: ``"a+b"``
        and ``" (a + b)  # sum"`` -> ``"def f():\\n    return a + b"``; None when it does not parse
        (such a program fails every test). Programs equal only in what they compute (``a + b``,
        ``b + a``) are different answers."""
        try:
            return ast.unparse(ast.parse("def f(): return " + completion))
        # ValueError: a null byte (older Pythons); RecursionError, MemoryError: CPython's parser and
        # ast.unparse on very deeply nested expressions
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return None

    def same_answer(self, a: str, b: str) -> bool:
        """Answers are canonical program text (:meth:`extract_answer`): equal as text."""
        return a == b

    def check_steps(self, problem: Problem, segments: list[str]) -> list[bool]:
        """Not available: a code completion has no reasoning steps.

        Raises:
            ValueError: Always; use sequence-level rewards (``outcome``, ``unit_tests``).
        """
        raise ValueError("task 'code' has no steps (step_separator is None); use a sequence-level reward")
