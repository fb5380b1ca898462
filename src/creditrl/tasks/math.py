"""Math word problems from JSONL or Parquet files, answers checked with math-verify.

A problem file holds one question and one gold answer per row (the column names are
arguments); it is a JSON Lines, JSON or Parquet file read by
:func:`creditrl.tasks.datafile.read_rows`, so a bad file or row is one error line naming the
file, the line or row and the field. The prompt is a template with ``{question}`` in it, and
a completion is correct when `math-verify <https://github.com/huggingface/Math-Verify>`_ finds
its final answer equal to the gold one::

    question: "What is 1/2 + 1/4?"   answer: "\\frac{3}{4}"
    prompt:   "Q: What is 1/2 + 1/4? A: "
    correct:  " \\boxed{\\frac{3}{4}}", " 3/4", " 0.75", "so it is $\\frac{6}{8}$"

Answer checking and answer extraction run math-verify in a helper process under a time limit
(:mod:`creditrl.tasks.math_verify`).

The built-in sample (``data/math_sample.jsonl``, 22 self-written problems) is the default
training file. Without a held-out file the rows are split by a hash of the question.
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path
from typing import Any

from creditrl.tasks.base import SPLITS, Problem, draw_from_pool, register_task
from creditrl.tasks.datafile import DataRows, read_rows, short_repr
from creditrl.tasks.math_verify import answers_match, extract_math_answer, gold_problem, gold_text, same_math_answer

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
_FORMATS = (".jsonl", ".json", ".parquet")


# ----------------------------------------------------------------------------- files


def _text(value: Any) -> str | None:
    """A cell as text: strings as they are, numbers (not bools) written out, else None."""
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    return None


def _cells(rows: DataRows, number: int, row: dict[str, Any], keys: list[str], answer_key: str) -> dict[str, str]:
    """The text of each of ``keys`` in ``row``; the answer stripped of surrounding whitespace."""
    cells = {}
    for key in keys:
        if key not in row:
            raise rows.error(number, f"field {key!r} is missing (fields: {', '.join(map(str, row)) or 'none'})")
        text = _text(row[key])
        if text is None:
            raise rows.error(
                number,
                f"field {key!r} is missing or not text (got {short_repr(row[key])}); expected a string or a number",
            )
        if not text.strip():
            raise rows.error(number, f"field {key!r} is empty")
        cells[key] = text.strip() if key == answer_key else text
    return cells


@functools.lru_cache(maxsize=16)
def _load_cached(
    path: str, stamp: tuple[int, int], question_key: str, answer_key: str, solution_key: str | None, timeout_s: float
) -> tuple[tuple[str, str, str | None], ...]:
    data = read_rows(path, suffixes=_FORMATS)
    keys = [question_key, answer_key] + ([solution_key] if solution_key else [])
    rows: list[tuple[str, str, str | None]] = []
    for number, row in data.rows:
        cells = _cells(data, number, row, keys, answer_key)
        why = gold_problem(cells[answer_key], timeout_s=timeout_s)
        if why is None:
            why = f"parsing it took over {timeout_s}s"
        if why:
            raise data.error(number, f"field {answer_key!r} is not a usable gold answer: {why}")
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
    """Read ``(question, answer, solution or None)`` rows of a JSONL (``.jsonl``, or ``.json``:
    JSON Lines or an array of objects) or Parquet file with
    :func:`~creditrl.tasks.datafile.read_rows`; answers are stripped of surrounding whitespace.

    Numbers in a text column are written out (``3`` -> ``"3"``). Results are cached per file
    path, modification time and size.

    Raises:
        DataFileError: (a ValueError) One line naming the file, the line (JSONL) or row (a JSON
            array, Parquet), counted from 1, and the field: the file is missing, of an unknown
            type, not UTF-8, not JSON or not Parquet (or truncated), holds no rows, a field is
            missing, a cell is null, not text or empty, or math-verify cannot parse a gold
            answer (or takes over ``timeout_s``).
    """
    p = Path(path)
    if not p.is_file():
        read_rows(p, suffixes=_FORMATS)  # raises: no such file, a directory
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
