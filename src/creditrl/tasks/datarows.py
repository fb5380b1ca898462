"""What every data-file reader shares: the one-line :class:`DataFileError`, the numbered
:class:`DataRows` of a file, and the bounds on a row (:data:`MAX_ROW_BYTES`, :data:`MAX_JSON_DEPTH`)
with what a reader does past them (:class:`RowReading`). The readers are
:mod:`creditrl.tasks.jsonrows` and :mod:`creditrl.tasks.datafile`."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from creditrl.errors import ConfigError

__all__ = [
    "LONG_ROWS",
    "MAX_JSON_DEPTH",
    "MAX_ROW_BYTES",
    "DataFileError",
    "DataRows",
    "RowReading",
    "file_error",
    "short_repr",
    "type_name",
]

MAX_ROW_BYTES = 16 * 2**20
"""The longest row a reader takes by default (16 MiB): far above a problem with its tests, far
below what a tokenizer can hold."""

MAX_JSON_DEPTH = 100
"""How deeply a row's arrays and objects may nest."""

LONG_ROWS = ("error", "skip")
"""What a reader does with a row over its ``max_row_bytes``: refuse the file, or leave the row out."""


class DataFileError(ConfigError):
    """A user data file that cannot be read, or holds a bad row: one line naming the file, the
    line or row, and what was expected."""


def type_name(value: Any) -> str:
    """The JSON-ish name of ``value``'s type for messages: ``null`` for None, else the Python name."""
    return "null" if value is None else type(value).__name__


def short_repr(value: Any, limit: int = 80) -> str:
    """``repr(value)`` cut to ``limit`` characters (with ``...``), so a huge cell keeps a message short."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _one_line(text: str) -> str:
    """``text`` with every run of whitespace (newlines included) made one space."""
    return " ".join(str(text).split())


@dataclass(frozen=True)
class DataRows:
    """The rows of a data file, numbered as the file's reader sees them.

    Attributes:
        path: The file, as the caller named it (messages print it so).
        unit: ``"line"`` (JSON Lines) or ``"row"`` (a JSON array, Parquet).
        rows: ``(number, row)`` pairs, numbers 1-based; every row is a dict.
    """

    path: Path
    unit: str
    rows: list[tuple[int, dict[str, Any]]]

    def where(self, number: int) -> str:
        """``"PATH, line N"`` (or ``row N``): the location prefix of a message."""
        return f"{self.path}, {self.unit} {number}"

    def error(self, number: int, message: str) -> DataFileError:
        """``PATH, line N: message``."""
        return DataFileError(f"{self.where(number)}: {_one_line(message)}")

    def field_error(self, number: int, field: str, message: str) -> DataFileError:
        """``PATH, line N, field 'F': message``."""
        return DataFileError(f"{self.where(number)}, field '{field}': {_one_line(message)}")


def file_error(path: Path, message: str) -> DataFileError:
    """``PATH: message``, for a problem of the whole file."""
    return DataFileError(f"{path}: {_one_line(message)}")


@dataclass
class RowReading:
    """How rows are read (at most ``max_bytes`` each; ``skip``: a longer row is dropped, not refused)
    and what the reading met: the rows skipped, and whether any line held more than whitespace."""

    max_bytes: int
    skip: bool
    skipped: list[tuple[int, int]] = field(default_factory=list)  # (line or row, bytes)
    text: bool = False

    def too_long(self, rows: DataRows, number: int, size: int) -> None:
        """Note (``skip``) or refuse a row of ``size`` bytes, over ``max_bytes``."""
        if not self.skip:
            raise rows.error(
                number,
                f"the {rows.unit} is {size} bytes, over max_row_bytes={self.max_bytes}; expected rows of at most "
                f"{self.max_bytes} bytes (raise max_row_bytes, or set long_rows=skip to skip such rows)",
            )
        self.skipped.append((number, size))
