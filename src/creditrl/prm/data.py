"""The stepwise PRM data format, its JSONL/Parquet files, and importers for public PRM data.

A stepwise example is one solution cut into steps, with one label per step::

    {"prompt": "7+3*2-5=", "completions": ["3*2=6;", "7+6=13;", "13-5=9;", "#9"],
     "labels": [1.0, 1.0, 0.0, null]}

``labels[k]`` is ``1.0`` (step k is right), ``0.0`` (wrong), a soft label in ``[0, 1]`` (e.g. the
share of Monte-Carlo continuations from step k that reach the right answer) or ``None``
(unlabelled: nothing is learnt on that step). Files hold one example per JSONL line or Parquet
row; in files a label may also be a bool or an int 0/1, and ``null`` is ``None``.

Step texts are kept as given. Policy samples cut with
:func:`creditrl.rewards.sources.split_steps` keep their separators and concatenate back to the
solution; the importers give each step's text stripped and without a separator (as the public
files present them), so a consumer that concatenates those steps must add its own separator.

Importers turn two public layouts into this format: PRM800K (Lightman et al., 2023,
arXiv:2305.20050; human ratings -1/0/1 per step) and Math-Shepherd (Wang et al., 2024,
arXiv:2312.08935; a marker after each step, replaced by ``+``/``-`` in the label text).

Files are read by :func:`creditrl.tasks.datafile.read_rows`, the reader of every user data file:
every bad file or malformed row fails with one :class:`~creditrl.tasks.datafile.DataFileError`
line (a ``ValueError``) that names the file, the 1-based line (JSONL) or row (Parquet), the field
and what was expected.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from creditrl.tasks.datafile import DataFileError, DataRows, read_rows, type_name

__all__ = [
    "DataFileError",
    "StepwiseExample",
    "load_stepwise",
    "save_stepwise",
    "import_prm800k",
    "import_math_shepherd",
]

_EXTENSIONS = (".jsonl", ".parquet")
_IMPORT_EXTENSIONS = (".jsonl", ".json")  # the public files are JSON Lines (a .json one may be an array)


class _FieldError(ValueError):
    """A bad field of one row; the reader adds the file and line to make the final message."""

    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(f"field '{field_name}': {message}" if field_name else message)


@dataclass
class StepwiseExample:
    """One solution cut into steps, with one label per step.

    Attributes:
        prompt: The problem text given to the policy.
        completions: The steps of the solution, in order (at least one).
        labels: One label per step: 1.0/0.0 (hard), a float in [0, 1] (soft) or None
            (unlabelled). Bools and ints 0/1 are converted to floats.
        meta: Free-form data about the example (source, finish reason ...), JSON-serialisable.
    """

    prompt: str
    completions: list[str]
    labels: list[float | None]
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        """Check the fields and normalise the labels; ValueError names the bad field."""
        self.prompt, self.completions, self.labels, self.meta = _check_fields(
            self.prompt, self.completions, self.labels, self.meta
        )


def _check_label(value: Any, k: int) -> float | None:
    """One label as float or None; bools and ints 0/1 allowed, anything else outside [0, 1] not."""
    if value is None:
        return None
    if isinstance(value, bool):
        return 1.0 if value else 0.0
    if isinstance(value, (int, float)) and math.isfinite(value) and 0.0 <= value <= 1.0:
        return float(value)
    raise _FieldError(
        "labels", f"label {k} must be a bool, a number in [0, 1] or null, got {value!r} ({type_name(value)})"
    )


def _check_fields(
    prompt: Any, completions: Any, labels: Any, meta: Any
) -> tuple[str, list[str], list[float | None], dict[str, Any]]:
    """Validate the four fields of an example; :class:`_FieldError` names the first bad one."""
    if not isinstance(prompt, str):
        raise _FieldError("prompt", f"expected a string, got {type_name(prompt)}")
    if not isinstance(completions, (list, tuple)):
        raise _FieldError("completions", f"expected a list of step strings, got {type_name(completions)}")
    if not completions:
        raise _FieldError("completions", "expected at least one step, got an empty list")
    for k, step in enumerate(completions):
        if not isinstance(step, str):
            raise _FieldError("completions", f"step {k} must be a string, got {type_name(step)}")
    if not isinstance(labels, (list, tuple)):
        raise _FieldError("labels", f"expected a list of labels, got {type_name(labels)}")
    if len(labels) != len(completions):
        raise _FieldError(
            "labels",
            f"expected a list of {len(completions)} labels (one per step), got {len(labels)}",
        )
    checked = [_check_label(v, k) for k, v in enumerate(labels)]
    if not isinstance(meta, dict):
        raise _FieldError("meta", f"expected an object (dict), got {type_name(meta)}")
    return prompt, list(completions), checked, dict(meta)


def _example_from_row(row: Any) -> StepwiseExample:
    """Build an example from a decoded row (a dict); keys other than the four fields are ignored."""
    for key in ("prompt", "completions", "labels"):
        if key not in row:
            raise _FieldError(key, "missing (a row needs 'prompt', 'completions' and 'labels')")
    meta = row.get("meta")
    if meta is None:
        meta = {}
    elif isinstance(meta, str):  # Parquet files written by save_stepwise hold meta as JSON text
        try:
            meta = json.loads(meta)
        except json.JSONDecodeError as exc:
            raise _FieldError("meta", f"expected an object or its JSON text, got invalid JSON ({exc})") from exc
        except RecursionError:  # nested past the interpreter's stack: json's C decoder stops there
            raise _FieldError("meta", "expected an object or its JSON text, got JSON nested too deeply") from None
    return StepwiseExample(row["prompt"], row["completions"], row["labels"], meta)


def _check_extension(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix not in _EXTENSIONS:
        raise DataFileError(
            f"{path}: unsupported file extension {path.suffix!r}; expected one of {', '.join(_EXTENSIONS)}"
        )
    return suffix


def _datasets() -> Any:
    """Import ``datasets`` offline: creditrl only reads and writes local files."""
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    import datasets

    return datasets


def _examples(rows: DataRows, build: Callable[[dict[str, Any]], StepwiseExample | None]) -> list[StepwiseExample]:
    """``build(row)`` for every row (a ``None`` result is dropped); a :class:`_FieldError` becomes
    a :class:`DataFileError` naming the file and the line or row."""
    examples = []
    for number, row in rows.rows:
        try:
            example = build(row)
        except _FieldError as exc:
            raise DataFileError(f"{rows.where(number)}, {exc}") from None
        if example is not None:
            examples.append(example)
    return examples


def load_stepwise(path: str | os.PathLike[str], *, allow_empty: bool = False) -> list[StepwiseExample]:
    """Read stepwise examples from a ``.jsonl`` or ``.parquet`` file (module doc for the format).

    Blank JSONL lines are skipped. An optional ``meta`` object (or its JSON text) is kept; keys
    other than the four fields are ignored.

    Args:
        path: The file.
        allow_empty: Whether a file without rows (0 bytes, only blank lines, a table with no
            rows) gives an empty list; by default it is an error.

    Raises:
        DataFileError: (a ValueError) On a bad file or row (module docstring), e.g.
            ``data/x.jsonl, line 3, field 'labels': expected a list of 4 labels (one per step), got 3``.
    """
    return _examples(read_rows(path, suffixes=_EXTENSIONS, allow_empty=allow_empty), _example_from_row)


def save_stepwise(examples: Sequence[StepwiseExample], path: str | os.PathLike[str]) -> None:
    """Write examples to ``path``: JSONL or Parquet chosen by the extension.

    Parquet stores ``labels`` as float64 with nulls and ``meta`` as JSON text (Arrow needs one
    schema for every row, which free-form dicts do not have); :func:`load_stepwise` reads both
    formats back to equal examples.

    Raises:
        DataFileError: (a ValueError) On an unknown extension.
    """
    path = Path(path)
    suffix = _check_extension(path)
    if suffix == ".jsonl":
        with path.open("w", encoding="utf-8") as f:
            for e in examples:
                row = {"prompt": e.prompt, "completions": e.completions, "labels": e.labels, "meta": e.meta}
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
        return
    datasets = _datasets()
    features = datasets.Features(
        {
            "prompt": datasets.Value("string"),
            "completions": datasets.List(datasets.Value("string")),
            "labels": datasets.List(datasets.Value("float64")),
            "meta": datasets.Value("string"),
        }
    )
    columns = {
        "prompt": [e.prompt for e in examples],
        "completions": [list(e.completions) for e in examples],
        "labels": [list(e.labels) for e in examples],
        "meta": [json.dumps(e.meta, ensure_ascii=False) for e in examples],
    }
    datasets.Dataset.from_dict(columns, features=features).to_parquet(str(path))


# ----------------------------------------------------------------------------- PRM800K

_PRM800K_NEUTRAL = (1.0, 0.0, None)


def _get(obj: Any, key: str, where: str, kind: type | None = None, what: str = "a string") -> Any:
    """``obj[key]`` where ``obj`` must be a dict (``where`` is its field path), and the value an
    instance of ``kind`` when given (``what`` names it in the error)."""
    field = f"{where}.{key}" if where else key
    if not isinstance(obj, dict):
        raise _FieldError(where, f"expected an object, got {type_name(obj)}")
    if key not in obj:
        raise _FieldError(field, "missing")
    if kind is not None and not isinstance(obj[key], kind):
        raise _FieldError(field, f"expected {what}, got {type_name(obj[key])}")
    return obj[key]


def _prm800k_example(row: Any, neutral_as: float | None) -> StepwiseExample | None:
    """One PRM800K row as an example (``None`` when it has no steps)."""
    question = _get(row, "question", "")
    problem = _get(question, "problem", "question", str)
    label = _get(row, "label", "")
    steps = _get(label, "steps", "label", list, "a list of steps")
    texts: list[str] = []
    labels: list[float | None] = []
    for k, step in enumerate(steps):
        where = f"label.steps[{k}]"
        completions = _get(step, "completions", where)
        if not isinstance(completions, list) or not completions:
            raise _FieldError(f"{where}.completions", f"expected a non-empty list, got {completions!r}")
        chosen = step.get("chosen_completion")
        if chosen is None:
            chosen = 0
        elif isinstance(chosen, bool) or not isinstance(chosen, int) or not 0 <= chosen < len(completions):
            raise _FieldError(
                f"{where}.chosen_completion",
                f"expected null or an index in [0, {len(completions) - 1}], got {chosen!r}",
            )
        cwhere = f"{where}.completions[{chosen}]"
        text = _get(completions[chosen], "text", cwhere, str)
        rating = _get(completions[chosen], "rating", cwhere)
        if rating is not None and (isinstance(rating, bool) or rating not in (-1, 0, 1)):
            raise _FieldError(f"{cwhere}.rating", f"expected -1, 0, 1 or null, got {rating!r}")
        texts.append(text)
        labels.append(None if rating is None else 1.0 if rating == 1 else neutral_as if rating == 0 else 0.0)
        if rating == -1:
            break  # first error: later steps continue a wrong solution and are not evidence
    if not texts:
        return None
    meta = {"source": "prm800k", "finish_reason": label.get("finish_reason")}
    if "ground_truth_answer" in question:
        meta["ground_truth_answer"] = question["ground_truth_answer"]
    return StepwiseExample(problem, texts, labels, meta)


def import_prm800k(path: str | os.PathLike[str], *, neutral_as: float | None = 1.0) -> list[StepwiseExample]:
    """Read a PRM800K-style JSONL file (Lightman et al., 2023) as stepwise examples.

    Each row is ``{"question": {"problem": str, ...}, "label": {"steps": [{"completions":
    [{"text": str, "rating": -1|0|1|null}, ...], "chosen_completion": int|null, ...}, ...],
    "finish_reason": ...}}``. Per step the chosen completion is taken (the first one when
    ``chosen_completion`` is null, as on the step where the labeller stopped); human-written
    completions (``human_completion``) are not used. Ratings map to labels:
    ``1 -> 1.0``, ``-1 -> 0.0``, ``null -> None`` and ``0`` (neutral: "reasonable but does not
    help") ``-> neutral_as``, by default 1.0 since a neutral step is not an error
    (Lightman et al. count it as positive in their PRM data too); pass 0.0 to count it as
    negative or None to leave it unlabelled. The example stops at the first ``-1`` step (it is
    included; later steps are dropped). Rows without steps give no example. ``meta`` holds
    ``source``, ``finish_reason`` and ``ground_truth_answer`` when present.

    Raises:
        ValueError: On a bad ``neutral_as``.
        DataFileError: (a ValueError) On a bad file or a malformed row (module docstring).
    """
    if neutral_as not in _PRM800K_NEUTRAL:
        raise ValueError(f"neutral_as must be 1.0, 0.0 or None, got {neutral_as!r}")
    return _examples(read_rows(path, suffixes=_IMPORT_EXTENSIONS), lambda row: _prm800k_example(row, neutral_as))


# ----------------------------------------------------------------------------- Math-Shepherd

_SHEPHERD_LABELS = {"+": 1.0, "-": 0.0}


def _shepherd_example(row: Any, marker: str, first_step: str) -> StepwiseExample:
    text = _get(row, "input", "", str)
    labelled = _get(row, "label", "", str)
    start = text.find(first_step)
    if start < 0:
        raise _FieldError("input", f"expected the steps to begin with {first_step!r}; not found")
    pieces = text.split(marker)
    n_markers = len(pieces) - 1
    if n_markers == 0:
        raise _FieldError("input", f"expected a step marker {marker!r} after every step; found none")
    if pieces[-1].strip():
        raise _FieldError("input", f"expected only whitespace after the last marker {marker!r}, got {pieces[-1]!r}")
    # The label text is the input with each marker replaced by ONE character, so the k-th
    # marker's label sits len(marker) - 1 characters earlier per marker before it.
    expected_len = len(text) - n_markers * (len(marker) - 1)
    if len(labelled) != expected_len:
        raise _FieldError(
            "label",
            f"expected the input with each of its {n_markers} markers {marker!r} replaced by one "
            f"'+' or '-' ({expected_len} characters), got {len(labelled)} characters",
        )
    labels: list[float | None] = []
    pos = 0
    for k, piece in enumerate(pieces):
        if labelled[pos : pos + len(piece)] != piece:
            raise _FieldError("label", f"text before marker {k} differs from the input's")
        pos += len(piece)
        if k == n_markers:
            break
        char = labelled[pos]
        if char not in _SHEPHERD_LABELS:
            raise _FieldError("label", f"expected '+' or '-' at marker {k} (character {pos}), got {char!r}")
        labels.append(_SHEPHERD_LABELS[char])
        pos += 1
    prompt = text[:start].strip()
    first = text[start:].split(marker)  # the first piece now starts at the first step
    steps = [s.strip() for s in first[:-1]]
    if len(steps) != n_markers:
        raise _FieldError("input", f"expected {first_step!r} before the first marker {marker!r}")
    meta = {"source": "math_shepherd"}
    if "task" in row:
        meta["task"] = row["task"]
    return StepwiseExample(prompt, steps, labels, meta)


def import_math_shepherd(
    path: str | os.PathLike[str], *, marker: str = "ки", first_step: str = "Step 1:"
) -> list[StepwiseExample]:
    """Read a Math-Shepherd-style JSONL file (Wang et al., 2024) as stepwise examples.

    Each row is ``{"input": str, "label": str, "task": ...}``: ``input`` is the question followed
    by the steps, each step ended by ``marker``; ``label`` is the same text with each marker
    replaced by ``+`` (the step can still reach the right answer -> 1.0) or ``-`` (-> 0.0).

    Split rule: the question (``prompt``) is the text of ``input`` before the first occurrence
    of ``first_step`` (default ``"Step 1:"``), stripped of surrounding whitespace (the published
    files separate the two by a space or by line breaks). Step k is the text from the end of
    marker k-1 (for k = 0: from ``first_step``) up to marker k, stripped, so it keeps its
    ``"Step k:"`` heading. Only whitespace may follow the last marker. ``meta`` holds ``source``
    and ``task`` when present.

    Raises:
        ValueError: On an empty ``marker``.
        DataFileError: (a ValueError) On a bad file or a malformed row (module docstring):
            ``input`` without ``first_step`` or markers, a ``label`` that is not ``input`` with
            each marker replaced by one character, or a label character other than ``+``/``-``.
    """
    if not marker:
        raise ValueError("marker must be a non-empty string")
    return _examples(
        read_rows(path, suffixes=_IMPORT_EXTENSIONS), lambda row: _shepherd_example(row, marker, first_step)
    )
