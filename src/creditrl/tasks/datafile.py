"""The one reader of user data files: task problem files and PRM stepwise files.

Every file a user names (``task.args.train_file`` / ``heldout_file`` of the math task, the code
task's ``problems`` file, ``creditrl prm train DATA``, the PRM importers' files) is read here, so
every way a file can be bad gives the same kind of error: one :class:`DataFileError` line that
names the file, the 1-based line (JSON Lines) or row (a JSON array, Parquet) where there is one,
and what was expected, e.g.::

    data/x.jsonl, line 3: invalid JSON: Expecting ',' delimiter at column 17; expected one JSON object per line
    data/x.jsonl, line 2: invalid UTF-8 (byte 0xff at byte 5 of the line, file offset 87); expected UTF-8 text
    data/x.parquet: not a Parquet file (it does not start with the Parquet magic bytes 'PAR1'); expected a Parquet file
    data/x.jsonl, line 4, field 'labels': expected a list of labels, got int

Formats, chosen by the file's extension (each caller says which it accepts):

- ``.jsonl``: one JSON object per line; blank lines are skipped but counted;
- ``.json``: a JSON array of objects (rows counted from 1), or JSON Lines as in ``.jsonl``;
- ``.parquet``: one object per row, read with ``pyarrow`` (nothing is cached on disk).

Where a caller reads with :func:`read_dataset`, a source may also be a folder written by
``datasets``' ``save_to_disk``, or (allowed only when ``local_files_only`` is false) a hub dataset
name, both read with ``datasets``; their rows are counted from 1.

:class:`DataFileError` is a :class:`~creditrl.errors.ConfigError` (so a ``ValueError``): the
command line prints it as one line and exits with status 2, without a traceback.
"""

from __future__ import annotations

import codecs
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from creditrl.errors import ConfigError

__all__ = ["FORMATS", "DataFileError", "DataRows", "read_dataset", "read_rows", "short_repr", "type_name"]

FORMATS: dict[str, str] = {".jsonl": "JSON Lines", ".json": "JSON", ".parquet": "Parquet"}
"""The extensions :func:`read_rows` can read, and the name of each format."""

_PARQUET_MAGIC = b"PAR1"


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


def _error(path: Path, message: str) -> DataFileError:
    return DataFileError(f"{path}: {_one_line(message)}")


def _suffix(path: Path, suffixes: Iterable[str]) -> str:
    """The extension of ``path`` (lower case) when it is one of ``suffixes``."""
    accepted = tuple(suffixes)
    suffix = path.suffix.lower()
    if suffix not in accepted:
        what = f"unsupported file extension {path.suffix!r}" if path.suffix else "no file extension"
        raise _error(path, f"{what}; expected one of {', '.join(accepted)}")
    return suffix


def _read_bytes(path: Path) -> bytes:
    """The bytes of ``path``; a missing file, a directory or a read failure is a DataFileError."""
    if not path.exists():
        raise _error(path, "no such file")
    if path.is_dir():
        raise _error(path, "is a directory; expected a data file")
    try:
        return path.read_bytes()
    except OSError as exc:
        raise _error(path, f"cannot read it: {exc.strerror or exc}") from None


def _decode(path: Path, data: bytes) -> str:
    """``data`` as UTF-8 text (a leading byte-order mark dropped); a bad byte names its line."""
    start = len(codecs.BOM_UTF8) if data.startswith(codecs.BOM_UTF8) else 0
    try:
        return data[start:].decode("utf-8")
    except UnicodeDecodeError as exc:
        offset = start + exc.start
        line = data.count(b"\n", 0, offset) + 1
        column = offset - (data.rfind(b"\n", 0, offset) + 1) + 1
        raise DataFileError(
            f"{path}, line {line}: invalid UTF-8 (byte 0x{data[offset]:02x} at byte {column} of the line, "
            f"file offset {offset}); expected UTF-8 text"
        ) from None


def _expect_object(rows: DataRows, number: int, value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise rows.error(number, f"expected a JSON object, got {type_name(value)}")
    return value


def _json_lines(path: Path, text: str) -> DataRows:
    """Every non-blank line of ``text`` decoded as one JSON object."""
    rows = DataRows(path, "line", [])
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as exc:
            raise rows.error(
                number, f"invalid JSON: {exc.msg} at column {exc.colno}; expected one JSON object per line"
            ) from None
        rows.rows.append((number, _expect_object(rows, number, value)))
    return rows


def _json_array(path: Path, text: str) -> DataRows:
    """``text`` as one JSON array of objects, rows counted from 1."""
    try:
        values = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DataFileError(
            f"{path}, line {exc.lineno}: invalid JSON: {exc.msg} at column {exc.colno}; "
            "expected a JSON array of objects"
        ) from None
    if not isinstance(values, list):
        raise _error(path, f"expected a JSON array of objects, got {type_name(values)}")
    rows = DataRows(path, "row", [])
    rows.rows.extend((n, _expect_object(rows, n, v)) for n, v in enumerate(values, start=1))
    return rows


def _json(path: Path, data: bytes, suffix: str) -> DataRows:
    """A ``.jsonl`` file, or a ``.json`` one (an array when its first character is ``[``)."""
    text = _decode(path, data)
    if suffix == ".json" and text.lstrip().startswith("["):
        return _json_array(path, text)
    return _json_lines(path, text)


def _parquet_table_rows(path: Path, data: bytes) -> list[dict[str, Any]]:
    """The rows of a Parquet file (its bytes already read) as dicts, row group by row group."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not data:
        raise _error(path, "empty file (0 bytes); expected a Parquet file")
    if data[:4] != _PARQUET_MAGIC:
        hint = "; it looks like JSON: name it .jsonl" if data.lstrip()[:1] in (b"{", b"[") else ""
        magic = "it does not start with the Parquet magic bytes 'PAR1'"
        raise _error(path, f"not a Parquet file ({magic}); expected a Parquet file{hint}")
    if len(data) < 12 or data[-4:] != _PARQUET_MAGIC:
        raise _error(
            path,
            f"truncated Parquet file: it starts as Parquet but its footer is missing ({len(data)} bytes); "
            "expected a complete Parquet file",
        )
    try:
        parquet = pq.ParquetFile(pa.BufferReader(data))
    except (pa.ArrowException, OSError) as exc:
        raise _error(
            path, f"corrupt Parquet file: its footer cannot be read ({exc}); expected a valid Parquet file"
        ) from None
    out: list[dict[str, Any]] = []
    for group in range(parquet.num_row_groups):
        try:
            out.extend(parquet.read_row_group(group).to_pylist())
        except (pa.ArrowException, OSError) as exc:
            first, count = len(out) + 1, parquet.metadata.row_group(group).num_rows
            raise _error(
                path,
                f"corrupt Parquet file: rows {first}-{first + count - 1} (row group {group}) cannot be read ({exc})",
            ) from None
    return out


def _empty(path: Path, data: bytes, suffix: str) -> DataFileError:
    """The error for a file with no rows: 0 bytes, only whitespace, or a table with no rows."""
    expected = {
        ".jsonl": "one JSON object per line",
        ".json": "a JSON array of objects or one JSON object per line",
        ".parquet": "a Parquet table with at least one row",
    }[suffix]
    if not data:
        return _error(path, f"empty file (0 bytes); expected {expected}")
    if suffix != ".parquet" and not data.strip():
        return _error(path, f"no rows: the file holds only whitespace; expected {expected}")
    return _error(path, f"no rows; expected {expected}")


def read_rows(path: str | Path, *, suffixes: Iterable[str] = tuple(FORMATS), allow_empty: bool = False) -> DataRows:
    """Read the rows of a user data file (module docstring for the formats).

    Args:
        path: The file; its extension picks the format.
        suffixes: The extensions the caller accepts (a subset of :data:`FORMATS`).
        allow_empty: Whether a file without rows gives no rows (else it is an error).

    Raises:
        DataFileError: One line naming the file, and the line or row where there is one: an
            extension not in ``suffixes``, a missing or unreadable file, invalid UTF-8, invalid
            JSON, a row that is not an object, a file that is not Parquet or is truncated or
            corrupt, or (unless ``allow_empty``) a file with no rows.
    """
    path = Path(path)
    suffix = _suffix(path, suffixes)
    data = _read_bytes(path)
    if suffix == ".parquet":
        rows = DataRows(path, "row", list(enumerate(_parquet_table_rows(path, data), start=1)))
    else:
        rows = _json(path, data, suffix)
    if not rows.rows and not allow_empty:
        raise _empty(path, data, suffix)
    return rows


def _datasets_rows(source: str, split: str, config: str | None, local_files_only: bool) -> DataRows:
    """The rows of ``split`` of a ``save_to_disk`` folder or (``local_files_only`` false) a hub dataset."""
    import datasets

    path = Path(source)
    try:
        if path.is_dir():
            data = datasets.load_from_disk(str(path))
        else:
            data = datasets.load_dataset(source, config, split=split)
    except Exception as exc:  # noqa: BLE001 - datasets raises many types (missing folder, no such hub repo, offline)
        raise _error(path, f"cannot load it with datasets: {type(exc).__name__}: {exc}") from None
    if isinstance(data, datasets.DatasetDict):
        if split not in data:
            raise _error(path, f"no split {split!r} (splits: {', '.join(data)})")
        data = data[split]
    if not isinstance(data, datasets.Dataset):
        raise _error(path, f"expected a datasets Dataset, got {type(data).__name__}")
    if len(data) == 0:
        raise _error(path, f"split {split!r} has no rows")
    return DataRows(path, "row", list(enumerate(data.to_list(), start=1)))


def read_dataset(
    source: str | Path,
    *,
    suffixes: Iterable[str] = tuple(FORMATS),
    split: str = "train",
    config: str | None = None,
    local_files_only: bool = True,
) -> DataRows:
    """The rows of a data source a user names: a data file (:func:`read_rows`), a folder written by
    ``datasets``' ``save_to_disk`` (a dataset, or a dataset dict whose ``split`` is read), or, when
    ``local_files_only`` is false, a hub dataset name read with
    ``datasets.load_dataset(source, config, split=split)``.

    Raises:
        DataFileError: :func:`read_rows`'s errors; a source that is no file or folder (naming
            ``local_files_only`` when it would be taken for a hub name); a folder or hub dataset
            ``datasets`` cannot load, without ``split`` or with no rows.
    """
    path = Path(source)
    if path.is_dir():
        return _datasets_rows(str(path), split, config, True)
    if path.exists() or path.suffix.lower() in FORMATS:
        return read_rows(path, suffixes=suffixes)
    if local_files_only:
        raise _error(path, "no such file or dataset folder; a hub dataset name needs local_files_only=false")
    return _datasets_rows(str(source), split, config, False)
