"""Math word problems from files or datasets, answers checked with math-verify.

A problem source holds a prompt and a gold answer per row (the column names are arguments): a
JSON Lines, JSON or Parquet file read by :func:`creditrl.tasks.datafile.read_rows` (a bad file
or row is one error line naming the file, the line or row and the field), a ``datasets``
``save_to_disk`` folder, or a hub dataset name. The prompt is a ``question`` filled into a
template with ``{question}`` in it, or TRL's ``prompt`` column (text, or conversational turns
rendered with the chat template; :mod:`creditrl.tasks.prompts`) or ``messages`` column. A
completion is correct when `math-verify <https://github.com/huggingface/Math-Verify>`_ finds
its final answer equal to the gold one::

    question: "What is 1/2 + 1/4?"   answer: "\\frac{3}{4}"
    prompt:   "Q: What is 1/2 + 1/4? A: "
    correct:  " \\boxed{\\frac{3}{4}}", " 3/4", " 0.75", "so it is $\\frac{6}{8}$"

math-verify runs in a helper process under a time limit (:mod:`creditrl.tasks.math_verify`).
The built-in sample (``data/math_sample.jsonl``, self-written problems) is the default training
file; without a held-out file the rows are split by a hash of the question.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, NamedTuple

from creditrl.tasks.base import SPLITS, Problem, draw_from_pool, hash_split, register_task
from creditrl.tasks.datafile import MAX_ROW_BYTES, DataRows, read_dataset, short_repr
from creditrl.tasks.math_verify import answers_match, extract_math_answer, gold_problem, gold_text, same_math_answer
from creditrl.tasks.prompts import Prompt, Turns, read_prompt, read_turns

__all__ = [
    "SPLITS",
    "DEFAULT_TRAIN_FILE",
    "DEFAULT_TEMPLATE",
    "MathRow",
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


class MathRow(NamedTuple):
    """One problem row of a math file."""

    question: str  # the question (filled into the template), or a prompt column's final user turn
    answer: str  # the gold answer, stripped of surrounding whitespace
    solution: str | None  # a reference completion: the solution column, a final assistant turn, a completion
    messages: Turns = ()  # a conversation prompt's turns; () for a question or a text prompt
    templated: bool = True  # whether ``question`` goes into the prompt template
    columns: tuple[tuple[str, Any], ...] = ()  # the row's other columns (reward functions' keyword arguments)
    number: int = 0  # its line (JSON Lines) or row (a JSON array, Parquet, a dataset) in the source, from 1


class _Keys(NamedTuple):
    question: str
    answer: str
    solution: str | None
    prompt: str
    messages: str


def _cell(rows: DataRows, number: int, row: dict[str, Any], key: str) -> str:
    """The text of ``row[key]``, which must be present, text or a number (not a bool; written out),
    and not blank."""
    if key not in row:
        raise rows.error(number, f"field {key!r} is missing (fields: {', '.join(map(str, row)) or 'none'})")
    text = row[key] if isinstance(row[key], str) else None
    if isinstance(row[key], (int, float)) and not isinstance(row[key], bool):
        text = str(row[key])
    if text is None:
        raise rows.error(
            number, f"field {key!r} is missing or not text (got {short_repr(row[key])}); expected a string or a number"
        )
    if not text.strip():
        raise rows.error(number, f"field {key!r} is empty")
    return text


def _prompt(rows: DataRows, number: int, row: dict[str, Any], keys: _Keys) -> tuple[Prompt, bool, str]:
    """The row's prompt, whether it goes into the template, and its column: the question column,
    else a ``prompt`` column (text or turns), else a ``messages`` column (turns)."""
    if keys.question in row:
        return Prompt(_cell(rows, number, row, keys.question), (), None), True, keys.question
    for key in (keys.prompt, keys.messages):
        if key in row:
            try:
                return read_prompt(row[key]), False, key
            except ValueError as exc:
                raise rows.error(number, f"field {key!r}: {exc}") from None
    fields = ", ".join(map(str, row)) or "none"
    raise rows.error(
        number,
        f"field {keys.question!r} is missing (fields: {fields}); expected {keys.question!r} (filled into the "
        f"prompt template), {keys.prompt!r} (text or a list of {{role, content}} turns) or {keys.messages!r}",
    )


def _completion(rows: DataRows, number: int, value: Any) -> str:
    """A TRL ``completion`` cell: text, or assistant turns (their contents joined)."""
    if isinstance(value, str) and value.strip():
        return value
    try:
        turns = read_turns(value)
    except ValueError as exc:
        raise rows.error(number, f"field 'completion': {exc}") from None
    if any(role != "assistant" for role, _ in turns):
        raise rows.error(number, "field 'completion': expected text or assistant turns only")
    return "".join(content for _, content in turns)


def _row(rows: DataRows, number: int, row: dict[str, Any], keys: _Keys, timeout_s: float) -> MathRow:
    prompt, templated, prompt_key = _prompt(rows, number, row, keys)
    answer = _cell(rows, number, row, keys.answer).strip()
    why = gold_problem(answer, timeout_s=timeout_s)
    if why is None:
        why = f"parsing it took over {timeout_s}s"
    if why:
        raise rows.error(number, f"field {keys.answer!r} is not a usable gold answer: {why}")
    solution = prompt.solution
    if keys.solution:
        solution = _cell(rows, number, row, keys.solution)
    elif solution is None and "completion" in row:
        solution = _completion(rows, number, row["completion"])
    elif solution is None and isinstance(row.get("solution"), str) and row["solution"].strip():
        solution = row["solution"]  # a `solution` column as it is (it also reaches reward functions)
    messages = prompt.messages  # a conversation stays one, even of a single user turn (TRL reward functions read it)
    used = {prompt_key, keys.answer, keys.solution, "completion"}
    columns = tuple((k, v) for k, v in row.items() if k not in used)
    return MathRow(prompt.text, answer, solution, messages, templated, columns, number)


@functools.lru_cache(maxsize=16)
def _load_cached(
    source: str, stamp: tuple[int, int] | None, keys: _Keys, timeout_s: float, **read: Any
) -> tuple[MathRow, ...]:
    data = read_dataset(source, suffixes=_FORMATS, **read)
    return tuple(_row(data, number, row, keys, timeout_s) for number, row in data.rows)


def load_math_rows(
    path: str | Path,
    *,
    question_key: str = "question",
    answer_key: str = "answer",
    solution_key: str | None = None,
    prompt_key: str = "prompt",
    messages_key: str = "messages",
    timeout_s: float = 5.0,
    split: str = "train",
    dataset_config: str | None = None,
    local_files_only: bool = True,
    max_row_bytes: int = MAX_ROW_BYTES,
    long_rows: str = "error",
) -> list[MathRow]:
    """The :class:`MathRow` rows of a data file, a ``save_to_disk`` folder or a hub dataset
    (:func:`~creditrl.tasks.datafile.read_dataset`; ``split`` and ``dataset_config`` pick what
    ``datasets.load_dataset`` reads), cached per source, modification time and size.

    A row's prompt is its ``question_key`` cell (text, filled into the task's template), else its
    ``prompt_key`` cell (text, or TRL's conversational list of ``{role, content}`` turns), else
    its ``messages_key`` cell (turns; a final assistant turn is the solution). The reference
    solution is the ``solution_key`` cell when set, else a final assistant turn, else a TRL
    ``completion`` cell (text or assistant turns), else a ``solution`` column's text as it is.
    Numbers in a text column are written out (``3`` -> ``"3"``); answers are stripped.

    Raises:
        DataFileError: (a ValueError) One line naming the source, the line or row and the field:
            the reader's errors (:func:`~creditrl.tasks.datafile.read_rows`), a missing field, a
            cell that is null, not text or empty, a malformed conversation, or a gold answer
            math-verify cannot parse (or takes over ``timeout_s`` to).
    """
    p, stamp, source = Path(path), None, str(path)
    if p.is_file():
        st = p.stat()
        stamp, source = (st.st_mtime_ns, st.st_size), str(p.resolve())
    elif p.is_dir():  # a save_to_disk folder: re-saving it rewrites its files
        stamp, source = (max((f.stat().st_mtime_ns for f in p.rglob("*")), default=0), 0), str(p.resolve())
    keys = _Keys(question_key, answer_key, solution_key, prompt_key, messages_key)
    read = {"split": split, "config": dataset_config, "local_files_only": local_files_only, "long_rows": long_rows}
    return list(_load_cached(source, stamp, keys, timeout_s, max_row_bytes=max_row_bytes, **read))


# ----------------------------------------------------------------------------- task


@register_task("math")
class MathTask:
    """Math word problems from files, checked with math-verify (registry name ``"math"``).

    Args:
        train_file: JSONL or Parquet file of training problems (default: the bundled sample), a
            ``datasets`` ``save_to_disk`` folder, or a hub dataset name (``local_files_only=false``).
        heldout_file: Source of held-out problems (the same kinds); None splits ``train_file``
            instead: a row is held out iff ``int(sha256(question).hexdigest(), 16) % heldout_mod == 0``.
        question_key, answer_key: Column names of the question and the gold answer.
        solution_key: Column of reference completions for supervised warm starts; None falls back
            as :func:`load_math_rows` says, else to ``" " + gold_text(answer)`` (``" \\boxed{7}"``).
        prompt_key, messages_key: Columns read when a row has no question column: TRL's
            ``prompt`` (text, or turns rendered with the chat template) and ``messages``.
        prompt_template: Every ``{question}`` in it is replaced by the question (other braces
            are literal, so LaTeX needs no escaping); prompt columns are used as they are.
        heldout_mod: Modulus of the hash split (>= 2).
        step_separator: None (default): no steps. A string (e.g. ``". "``) cuts completions into
            steps for step-level credit; :meth:`check_steps` then labels every step with the outcome.
        timeout_s: Wall-clock limit of one math-verify check (module docstring).
        train_split, heldout_split, dataset_config: The splits and configuration of a dataset source.
        local_files_only: Whether hub dataset names are refused (the default follows
            ``policy.local_files_only``).
        max_row_bytes, long_rows: The longest row of a data file (default 16 MiB), and whether a
            longer one is refused (``"error"``) or left out with a warning (``"skip"``).

    A problem's ``meta`` holds its ``file`` and ``row`` (the line of a JSON Lines file, else the
    row), which the prompt-length guard names (``rollout.max_prompt_tokens``).
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
        prompt_key: str = "prompt",
        messages_key: str = "messages",
        train_split: str = "train",
        heldout_split: str = "test",
        dataset_config: str | None = None,
        local_files_only: bool = True,
        max_row_bytes: int = MAX_ROW_BYTES,
        long_rows: str = "error",
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
        keys: dict[str, Any] = {
            "question_key": question_key,
            "answer_key": answer_key,
            "solution_key": solution_key,
            "prompt_key": prompt_key,
            "messages_key": messages_key,
            "timeout_s": timeout_s,
            "dataset_config": dataset_config,
            "local_files_only": local_files_only,
            "max_row_bytes": max_row_bytes,
            "long_rows": long_rows,
        }
        train_path = str(train_file) if train_file else str(DEFAULT_TRAIN_FILE)
        self.pools: dict[str, list[Problem]] = {s: [] for s in SPLITS}
        for row in load_math_rows(train_path, split=train_split, **keys):
            split = "train" if heldout_file else self.split_of(row.question)
            self.pools[split].append(self._problem(row, train_path, split))
        if heldout_file:
            for row in load_math_rows(heldout_file, split=heldout_split, **keys):
                self.pools["heldout"].append(self._problem(row, str(heldout_file), "heldout"))

    def split_of(self, question: str) -> str:
        """``"heldout"`` iff ``int(sha256(question).hexdigest(), 16) % heldout_mod == 0``."""
        return hash_split(question, self.heldout_mod)

    def _problem(self, row: MathRow, file: str, split: str) -> Problem:
        prompt = self.prompt_template.replace("{question}", row.question) if row.templated else row.question
        columns = {k: v for k, v in row.columns if k not in ("file", "row", "split", "question")}
        return Problem(
            prompt=prompt,
            answer=row.answer,
            solution=row.solution if row.solution is not None else f" {gold_text(row.answer)}",
            meta={**columns, "file": file, "row": row.number, "split": split, "question": row.question},
            messages=row.messages,
        )

    def sample(self, n: int, *, split: str, seed: int) -> list[Problem]:
        """``n`` problems of ``split`` drawn with replacement (:func:`~creditrl.tasks.base.draw_from_pool`)."""
        return draw_from_pool(
            self.pools.get(split, []),
            n,
            split=split,
            seed=seed,
            namespace="math",
            empty=f"task 'math': no {split!r} problems among its {sum(map(len, self.pools.values()))} rows (about 1 "
            f"in heldout_mod={self.heldout_mod} is held out, by a hash of the question); set heldout_file, or lower "
            "heldout_mod",
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
        """Every step labelled with the outcome of the whole completion (no step ground truth): the
        segments joined as they are when each but the last ends with the separator (the score
        stage's spans), else joined with the separator (a ``str.split``).

        Raises:
            ValueError: If the task has no step separator.
        """
        sep = self.step_separator
        if sep is None:
            raise ValueError("task 'math' has no steps (step_separator is None); use a sequence-level reward")
        joined = "".join(segments) if all(s.endswith(sep) for s in segments[:-1]) else sep.join(segments)
        return [self.check_outcome(problem, joined)] * len(segments)
