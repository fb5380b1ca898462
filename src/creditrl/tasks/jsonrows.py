"""JSON readers of :mod:`creditrl.tasks.datafile`: JSON Lines read line by line with a bounded
``readline`` (a line over the row limit is measured in 1 MiB pieces and never held whole), and a
JSON array read whole; both refuse nesting deeper than :data:`~creditrl.tasks.datarows.MAX_JSON_DEPTH`."""

from __future__ import annotations

import codecs
import itertools
import json
from pathlib import Path
from typing import Any, BinaryIO

from creditrl.tasks.datarows import MAX_JSON_DEPTH, DataFileError, DataRows, RowReading, file_error, type_name

__all__ = ["MAX_ARRAY_BYTES", "read_json_array", "read_json_lines", "starts_an_array"]

MAX_ARRAY_BYTES = 256 * 2**20
"""The largest JSON array file read (256 MiB): it is parsed whole, at several times its size in
memory; JSON Lines, read line by line, have no such bound."""

_PIECE = 2**20  # how much of an over-long line is held at once while it is measured


def _decode(path: Path, data: bytes, line: int = 1, offset: int = 0) -> str:
    """``data`` (the file, or its line ``line`` from file offset ``offset``) as UTF-8 text, a
    byte-order mark that starts the file dropped; a bad byte names its line, its byte in the line
    and its file offset."""
    bom = len(codecs.BOM_UTF8) if offset == 0 and data.startswith(codecs.BOM_UTF8) else 0
    try:
        return data[bom:].decode("utf-8")
    except UnicodeDecodeError as exc:
        at = bom + exc.start
        line += data.count(b"\n", 0, at)
        column = at - (data.rfind(b"\n", 0, at) + 1) + 1
        raise DataFileError(
            f"{path}, line {line}: invalid UTF-8 (byte 0x{data[at]:02x} at byte {column} of the line, "
            f"file offset {offset + at}); expected UTF-8 text"
        ) from None


def _expect_object(rows: DataRows, number: int, value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise rows.error(number, f"expected a JSON object, got {type_name(value)}")
    return value


def _depth(value: Any, limit: int) -> int:
    """How deeply ``value``'s lists and objects nest (a scalar: 0), counted no further than ``limit + 1``."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, (list, dict)):
            deepest = max(deepest, level)
            if deepest > limit:
                break
            stack.extend((v, level + 1) for v in (item.values() if isinstance(item, dict) else item))
    return deepest


def _too_deep(data: bytes, value: Any, limit: int) -> bool:
    """Whether ``value`` (parsed from ``data``) nests deeper than ``limit``. Counting brackets is
    fast; only text holding more of them than the limit is walked."""
    return data.count(b"[") + data.count(b"{") > limit and _depth(value, limit) > limit


def _nested(expected: str) -> str:
    return f"invalid JSON: arrays and objects nested more than {MAX_JSON_DEPTH} deep; expected {expected}"


def _content(raw: bytes) -> bytes:
    """A line without its line ending."""
    return raw[:-2] if raw.endswith(b"\r\n") else raw[:-1] if raw.endswith(b"\n") else raw


def _line_length(handle: BinaryIO, raw: bytes) -> tuple[int, int]:
    """The length (line ending excluded) of a line that starts with ``raw``, and the bytes it takes
    with its ending: the rest is read in 1 MiB pieces and dropped, so a line of any length takes 1 MiB."""
    size, tail = len(raw), raw[-2:]
    while not tail.endswith(b"\n") and (piece := handle.readline(_PIECE)):
        size, tail = size + len(piece), (tail + piece)[-2:]
    ending = 2 if tail == b"\r\n" else 1 if tail.endswith(b"\n") else 0
    return size - ending, size


def _parse_line(rows: DataRows, number: int, content: bytes, text: str) -> dict[str, Any]:
    """One line's JSON object; invalid JSON or nesting deeper than :data:`MAX_JSON_DEPTH` names the line."""
    expected = "one JSON object per line"
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise rows.error(number, f"invalid JSON: {exc.msg} at column {exc.colno}; expected {expected}") from None
    except RecursionError:  # json's C decoder stops at the interpreter's recursion limit
        raise rows.error(number, _nested(expected)) from None
    if _too_deep(content, value, MAX_JSON_DEPTH):
        raise rows.error(number, _nested(expected))
    return _expect_object(rows, number, value)


def read_json_lines(path: Path, handle: BinaryIO, reading: RowReading) -> DataRows:
    """Every non-blank line as one JSON object, read with a bounded ``readline``: a line longer than
    ``reading.max_bytes`` is measured in pieces and never held whole."""
    rows = DataRows(path, "line", [])
    offset = 0
    for number in itertools.count(1):
        raw = handle.readline(reading.max_bytes + 2)  # room for the longest row and "\r\n"
        if not raw:
            break
        start, content = offset, _content(raw)
        if len(content) > reading.max_bytes or (len(raw) == reading.max_bytes + 2 and not raw.endswith(b"\n")):
            size, taken = _line_length(handle, raw)
            offset += taken
            reading.text = True
            reading.too_long(rows, number, size)
            continue
        offset += len(raw)
        text = _decode(path, content, number, start)
        if text.strip():
            reading.text = True
            rows.rows.append((number, _parse_line(rows, number, content, text)))
    return rows


def read_json_array(path: Path, handle: BinaryIO, reading: RowReading) -> DataRows:
    """The file as one JSON array of objects, rows counted from 1. The array is read whole, so a
    file over :data:`MAX_ARRAY_BYTES` is refused; when the file is over ``reading.max_bytes``, every
    row's size (its JSON text, written compactly) is checked."""
    expected = "a JSON array of objects"
    data = handle.read(MAX_ARRAY_BYTES + 1)
    if len(data) > MAX_ARRAY_BYTES:
        raise file_error(
            path,
            f"a JSON array file is read whole and this one is over {MAX_ARRAY_BYTES} bytes; expected JSON Lines "
            "(one object per line, e.g. `jq -c '.[]' x.json > x.jsonl`) for a file this large",
        )
    try:
        values = json.loads(_decode(path, data))
    except json.JSONDecodeError as exc:
        raise DataFileError(
            f"{path}, line {exc.lineno}: invalid JSON: {exc.msg} at column {exc.colno}; expected {expected}"
        ) from None
    except RecursionError:
        raise file_error(path, _nested(expected)) from None
    if not isinstance(values, list):
        raise file_error(path, f"expected a JSON array of objects, got {type_name(values)}")
    if _too_deep(data, values, MAX_JSON_DEPTH + 1):  # + 1: the array itself
        raise file_error(path, _nested(expected))
    rows = DataRows(path, "row", [])
    reading.text = True
    for number, value in enumerate(values, start=1):
        if len(data) > reading.max_bytes:
            size = len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode())
            if size > reading.max_bytes:
                reading.too_long(rows, number, size)
                continue
        rows.rows.append((number, _expect_object(rows, number, value)))
    return rows


def starts_an_array(handle: BinaryIO) -> bool:
    """Whether the first character past a byte-order mark and whitespace is ``[`` (the handle goes
    back to the start)."""
    first = handle.read(len(codecs.BOM_UTF8)).removeprefix(codecs.BOM_UTF8).lstrip()
    while not first and (piece := handle.read(_PIECE)):
        first = piece.lstrip()
    handle.seek(0)
    return first[:1] == b"["
