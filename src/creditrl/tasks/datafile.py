"""The one reader of user data files: task problem files and PRM stepwise files.

Every file a user names (``task.args.train_file`` / ``heldout_file`` of the math task, the code
task's ``problems`` file, ``creditrl prm train DATA``, the PRM importers' files) is read here, so
every way a file can be bad gives the same kind of error: one :class:`DataFileError` line that
names the file, the 1-based line (JSON Lines) or row (a JSON array, Parquet) where there is one,
and what was expected, e.g.::

    data/x.jsonl, line 3: invalid JSON: Expecting ',' delimiter at column 17; expected one JSON object per line
    data/x.jsonl, line 4, field 'labels': expected a list of labels, got int

Formats, chosen by the file's extension (each caller says which it accepts):

- ``.jsonl``: one JSON object per line; blank lines are skipped but counted;
- ``.json``: a JSON array of objects (rows counted from 1), or JSON Lines as in ``.jsonl``;
- ``.parquet``: one object per row, read with ``pyarrow`` (nothing is cached on disk).

Bounds, so that no file can exhaust memory or the stack:

- a row is at most ``max_row_bytes`` (default :data:`MAX_ROW_BYTES`, 16 MiB): JSON Lines are read
  with a bounded ``readline``, and a longer line is never held whole; a JSON array is read whole
  (a file over 256 MiB is refused: write JSON Lines), then each element's compact JSON text is
  measured; a Parquet row counts its text and binary cells. A longer row is refused, or, with
  ``long_rows="skip"``, left out with one warning naming the rows;
- arrays and objects nest at most :data:`MAX_JSON_DEPTH` deep (deeper is refused, also where
  Python's JSON decoder would stop with a RecursionError).

Where a caller reads with :func:`read_dataset`, a source may also be a folder written by
``datasets``' ``save_to_disk``, or (allowed only when ``local_files_only`` is false) a hub dataset
name, both read with ``datasets``; their rows are counted from 1.

:class:`DataFileError` is a :class:`~creditrl.errors.ConfigError` (so a ``ValueError``): the
command line prints it as one line and exits with status 2, without a traceback.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any, BinaryIO

from creditrl.tasks.datarows import (
    LONG_ROWS,
    MAX_JSON_DEPTH,
    MAX_ROW_BYTES,
    DataFileError,
    DataRows,
    RowReading,
    file_error,
    short_repr,
    type_name,
)
from creditrl.tasks.jsonrows import read_json_array, read_json_lines, starts_an_array

__all__ = [
    "FORMATS",
    "LONG_ROWS",
    "MAX_JSON_DEPTH",
    "MAX_ROW_BYTES",
    "DataFileError",
    "DataRows",
    "read_dataset",
    "read_rows",
    "short_repr",
    "type_name",
]

FORMATS: dict[str, str] = {".jsonl": "JSON Lines", ".json": "JSON", ".parquet": "Parquet"}
"""The extensions :func:`read_rows` can read, and the name of each format."""

_PARQUET_MAGIC = b"PAR1"
log = logging.getLogger(__name__)


def _suffix(path: Path, suffixes: Iterable[str]) -> str:
    """The extension of ``path`` (lower case) when it is one of ``suffixes``."""
    accepted = tuple(suffixes)
    suffix = path.suffix.lower()
    if suffix not in accepted:
        what = f"unsupported file extension {path.suffix!r}" if path.suffix else "no file extension"
        raise file_error(path, f"{what}; expected one of {', '.join(accepted)}")
    return suffix


def _open(path: Path) -> BinaryIO:
    """``path`` opened to read bytes; a missing file, a directory or a read failure is a DataFileError."""
    if not path.exists():
        raise file_error(path, "no such file")
    if path.is_dir():
        raise file_error(path, "is a directory; expected a data file")
    try:
        return path.open("rb")
    except OSError as exc:
        raise file_error(path, f"cannot read it: {exc.strerror or exc}") from None


# ----------------------------------------------------------------------------- Parquet


def _parquet_file(path: Path, handle: BinaryIO) -> Any:
    """The ``pyarrow.parquet.ParquetFile`` of ``path`` (memory-mapped), after its magic bytes are checked."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    size = os.fstat(handle.fileno()).st_size
    head = handle.read(len(_PARQUET_MAGIC))
    if not size:
        raise file_error(path, "empty file (0 bytes); expected a Parquet file")
    if head != _PARQUET_MAGIC:
        start = (head + handle.read(64)).lstrip()[:1]
        hint = "; it looks like JSON: name it .jsonl" if start in (b"{", b"[") else ""
        magic = "it does not start with the Parquet magic bytes 'PAR1'"
        raise file_error(path, f"not a Parquet file ({magic}); expected a Parquet file{hint}")
    handle.seek(max(size - len(_PARQUET_MAGIC), 0))
    if size < 12 or handle.read() != _PARQUET_MAGIC:
        raise file_error(
            path,
            f"truncated Parquet file: it starts as Parquet but its footer is missing ({size} bytes); "
            "expected a complete Parquet file",
        )
    try:
        return pq.ParquetFile(str(path), memory_map=True)
    except (pa.ArrowException, OSError) as exc:
        raise file_error(
            path, f"corrupt Parquet file: its footer cannot be read ({exc}); expected a valid Parquet file"
        ) from None


def _cell_bytes(value: Any) -> int:
    """The bytes of a Parquet row's text and binary cells, nested ones too (numbers count 8)."""
    size, stack = 0, [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            size += len(item.encode())
        elif isinstance(item, (bytes, bytearray)):
            size += len(item)
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
        else:
            size += 8
    return size


def _parquet(path: Path, handle: BinaryIO, reading: RowReading) -> DataRows:
    """The rows of a Parquet file as dicts, row group by row group; a row over ``reading.max_bytes``
    (its text and binary cells) is refused or skipped. Rows are measured only in a row group whose
    uncompressed size is over the limit."""
    import pyarrow as pa

    parquet = _parquet_file(path, handle)
    rows = DataRows(path, "row", [])
    first = 1
    for group in range(parquet.num_row_groups):
        meta = parquet.metadata.row_group(group)
        try:
            table = parquet.read_row_group(group).to_pylist()
        except (pa.ArrowException, OSError) as exc:
            raise file_error(
                path,
                f"corrupt Parquet file: rows {first}-{first + meta.num_rows - 1} (row group {group}) cannot be "
                f"read ({exc})",
            ) from None
        reading.text = reading.text or bool(table)
        for number, row in enumerate(table, start=first):
            if meta.total_byte_size > reading.max_bytes and (size := _cell_bytes(row)) > reading.max_bytes:
                reading.too_long(rows, number, size)
                continue
            rows.rows.append((number, row))
        first += len(table)
    return rows


def _empty(path: Path, suffix: str, reading: RowReading) -> DataFileError:
    """The error for a file with no rows: 0 bytes, only whitespace, only rows skipped as too long,
    or a table with no rows."""
    expected = {
        ".jsonl": "one JSON object per line",
        ".json": "a JSON array of objects or one JSON object per line",
        ".parquet": "a Parquet table with at least one row",
    }[suffix]
    if not path.stat().st_size:
        return file_error(path, f"empty file (0 bytes); expected {expected}")
    if reading.skipped:
        return file_error(path, f"no rows: all {len(reading.skipped)} are over max_row_bytes={reading.max_bytes}")
    if suffix != ".parquet" and not reading.text:
        return file_error(path, f"no rows: the file holds only whitespace; expected {expected}")
    return file_error(path, f"no rows; expected {expected}")


def _read(path: Path, suffix: str, reading: RowReading) -> DataRows:
    with _open(path) as handle:
        if suffix == ".parquet":
            return _parquet(path, handle, reading)
        if suffix == ".json" and starts_an_array(handle):
            return read_json_array(path, handle, reading)
        return read_json_lines(path, handle, reading)


def read_rows(
    path: str | Path,
    *,
    suffixes: Iterable[str] = tuple(FORMATS),
    allow_empty: bool = False,
    max_row_bytes: int = MAX_ROW_BYTES,
    long_rows: str = "error",
) -> DataRows:
    """Read the rows of a user data file (module docstring for the formats and the limits).

    Args:
        path: The file; its extension picks the format.
        suffixes: The extensions the caller accepts (a subset of :data:`FORMATS`).
        allow_empty: Whether a file without rows gives no rows (else it is an error).
        max_row_bytes: The longest row, in bytes (a JSON Lines line without its ending).
        long_rows: ``"error"``: a longer row is refused; ``"skip"``: it is left out, with a warning.

    Raises:
        DataFileError: One line naming the file, and the line or row where there is one: an
            extension not in ``suffixes``, a missing or unreadable file, invalid UTF-8, invalid
            JSON, JSON nested deeper than :data:`MAX_JSON_DEPTH`, a row that is not an object, a
            row over ``max_row_bytes`` (unless skipped), a file that is not Parquet or is
            truncated or corrupt, or (unless ``allow_empty``) a file with no rows.
    """
    path = Path(path)
    suffix = _suffix(path, suffixes)
    if long_rows not in LONG_ROWS:
        raise ValueError(f"long_rows must be one of {', '.join(LONG_ROWS)}, got {long_rows!r}")
    if isinstance(max_row_bytes, bool) or not isinstance(max_row_bytes, int) or max_row_bytes < 1:
        raise ValueError(f"max_row_bytes must be a positive integer, got {max_row_bytes!r}")
    reading = RowReading(max_row_bytes, long_rows == "skip")
    rows = _read(path, suffix, reading)
    if reading.skipped:
        shown = ", ".join(f"{rows.unit} {n} ({size} bytes)" for n, size in reading.skipped[:5])
        more = f" and {len(reading.skipped) - 5} more" if len(reading.skipped) > 5 else ""
        log.warning(
            "creditrl: %s: skipped %d rows over max_row_bytes=%d: %s%s",
            path,
            len(reading.skipped),
            max_row_bytes,
            shown,
            more,
        )
    if not rows.rows and not allow_empty:
        raise _empty(path, suffix, reading)
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
        raise file_error(path, f"cannot load it with datasets: {type(exc).__name__}: {exc}") from None
    if isinstance(data, datasets.DatasetDict):
        if split not in data:
            raise file_error(path, f"no split {split!r} (splits: {', '.join(data)})")
        data = data[split]
    if not isinstance(data, datasets.Dataset):
        raise file_error(path, f"expected a datasets Dataset, got {type(data).__name__}")
    if len(data) == 0:
        raise file_error(path, f"split {split!r} has no rows")
    return DataRows(path, "row", list(enumerate(data.to_list(), start=1)))


def read_dataset(
    source: str | Path,
    *,
    suffixes: Iterable[str] = tuple(FORMATS),
    split: str = "train",
    config: str | None = None,
    local_files_only: bool = True,
    max_row_bytes: int = MAX_ROW_BYTES,
    long_rows: str = "error",
) -> DataRows:
    """The rows of a data source a user names: a data file (:func:`read_rows`, which alone takes
    ``max_row_bytes`` and ``long_rows``), a folder written by ``datasets``' ``save_to_disk`` (a
    dataset, or a dataset dict whose ``split`` is read), or, when ``local_files_only`` is false, a
    hub dataset name read with ``datasets.load_dataset(source, config, split=split)``.

    Raises:
        DataFileError: :func:`read_rows`'s errors; a source that is no file or folder (naming
            ``local_files_only`` when it would be taken for a hub name); a folder or hub dataset
            ``datasets`` cannot load, without ``split`` or with no rows.
    """
    path = Path(source)
    if path.is_dir():
        return _datasets_rows(str(path), split, config, True)
    if path.exists() or path.suffix.lower() in FORMATS:
        return read_rows(path, suffixes=suffixes, max_row_bytes=max_row_bytes, long_rows=long_rows)
    if local_files_only:
        raise file_error(path, "no such file or dataset folder; a hub dataset name needs local_files_only=false")
    return _datasets_rows(str(source), split, config, False)
