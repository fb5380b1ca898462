"""Every bad user data file gives one DataFileError line naming the file, the line or row, and what
was expected: the shared reader (creditrl.tasks.datafile) and the tasks that read files through it
(math's train_file / heldout_file, code's problems file), and `creditrl train` on a bad train_file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from creditrl.errors import ConfigError
from creditrl.tasks.code import load_problems
from creditrl.tasks.datafile import DataFileError, read_rows
from creditrl.tasks.math import MathTask, load_math_rows

ROOT = Path(__file__).resolve().parents[2]

MATH_ROW = {"question": "What is 1 + 1?", "answer": "2"}
CODE_ROW = {
    "name": "one",
    "split": "train",
    "entry": "one",
    "prompt": 'def one(): "one"; return ',
    "solution": "1",
    "tests": [{"args": [], "expected": 1}],
}


def write_jsonl(path: Path, rows: list[object]) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    return path


def write_parquet(path: Path, rows: list[dict]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def message(fn, *args, **kwargs) -> str:
    """The one-line message of the DataFileError ``fn(*args, **kwargs)`` raises."""
    with pytest.raises(DataFileError) as err:
        fn(*args, **kwargs)
    text = str(err.value)
    assert "\n" not in text
    return text


# ----------------------------------------------------------------------------- the shared reader


def test_data_file_error_is_the_config_error_the_cli_prints():
    assert issubclass(DataFileError, ConfigError) and issubclass(DataFileError, ValueError)


def test_invalid_utf8_names_the_line_and_the_byte(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_bytes(b'{"a": 1}\n{"a": "caf\xe9"}\n')
    assert message(read_rows, path) == (
        f"{path}, line 2: invalid UTF-8 (byte 0xe9 at byte 11 of the line, file offset 19); expected UTF-8 text"
    )


def test_a_byte_order_mark_is_dropped_and_offsets_count_it(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"a": 1}\n\xff\n')
    assert message(read_rows, path) == (
        f"{path}, line 2: invalid UTF-8 (byte 0xff at byte 1 of the line, file offset 12); expected UTF-8 text"
    )
    path.write_bytes(b'\xef\xbb\xbf{"a": 1}\n')
    assert read_rows(path).rows == [(1, {"a": 1})]


def test_invalid_json_line_names_the_line(tmp_path):
    path = write_jsonl(tmp_path / "x.jsonl", [{"a": 1}, "", '{"a": 2,}'])
    assert message(read_rows, path) == (
        f"{path}, line 3: invalid JSON: Expecting property name enclosed in double quotes at column 9; "
        "expected one JSON object per line"
    )


def test_a_line_that_is_not_an_object(tmp_path):
    path = write_jsonl(tmp_path / "x.jsonl", [{"a": 1}, "[1, 2]"])
    assert message(read_rows, path) == f"{path}, line 2: expected a JSON object, got list"


@pytest.mark.parametrize(
    "data, expected",
    [
        (b"", "empty file (0 bytes); expected one JSON object per line"),
        (b"  \n\n\t\n", "no rows: the file holds only whitespace; expected one JSON object per line"),
    ],
)
def test_empty_and_blank_jsonl(tmp_path, data, expected):
    path = tmp_path / "x.jsonl"
    path.write_bytes(data)
    assert message(read_rows, path) == f"{path}: {expected}"
    assert read_rows(path, allow_empty=True).rows == []


def test_json_array_rows_are_numbered_and_checked(tmp_path):
    path = tmp_path / "x.json"
    path.write_text('[{"a": 1}, {"a": 2}]')
    assert read_rows(path).unit == "row" and read_rows(path).rows == [(1, {"a": 1}), (2, {"a": 2})]
    path.write_text('[{"a": 1}, 3]')
    assert message(read_rows, path) == f"{path}, row 2: expected a JSON object, got int"
    path.write_text('[{"a": 1},\n {"a": }]')
    assert message(read_rows, path) == (
        f"{path}, line 2: invalid JSON: Expecting value at column 8; expected a JSON array of objects"
    )
    path.write_text("[]")
    assert message(read_rows, path) == (
        f"{path}: no rows; expected a JSON array of objects or one JSON object per line"
    )


def test_not_parquet_with_a_parquet_name(tmp_path):
    path = tmp_path / "x.parquet"
    path.write_text('{"a": 1}\n')
    assert message(read_rows, path) == (
        f"{path}: not a Parquet file (it does not start with the Parquet magic bytes 'PAR1'); "
        "expected a Parquet file; it looks like JSON: name it .jsonl"
    )
    path.write_bytes(b"\x00\x01binary")
    assert message(read_rows, path).endswith("'PAR1'); expected a Parquet file")


def test_truncated_parquet(tmp_path):
    whole = write_parquet(tmp_path / "whole.parquet", [{"a": i, "b": "x" * 20} for i in range(500)])
    data = whole.read_bytes()
    path = tmp_path / "cut.parquet"
    path.write_bytes(data[: len(data) // 2])
    assert message(read_rows, path) == (
        f"{path}: truncated Parquet file: it starts as Parquet but its footer is missing "
        f"({len(data) // 2} bytes); expected a complete Parquet file"
    )


def test_empty_parquet_and_parquet_without_rows(tmp_path):
    path = tmp_path / "x.parquet"
    path.write_bytes(b"")
    assert message(read_rows, path) == f"{path}: empty file (0 bytes); expected a Parquet file"
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"a": pa.array([], pa.int64())}), path)
    assert message(read_rows, path) == f"{path}: no rows; expected a Parquet table with at least one row"
    assert read_rows(path, allow_empty=True).rows == []


def test_parquet_rows_are_numbered_from_one(tmp_path):
    path = write_parquet(tmp_path / "x.parquet", [{"a": 1}, {"a": None}])
    rows = read_rows(path)
    assert (rows.unit, rows.rows) == ("row", [(1, {"a": 1}), (2, {"a": None})])
    assert str(rows.field_error(2, "a", "expected\nan int")) == f"{path}, row 2, field 'a': expected an int"


def test_missing_file_directory_and_extension(tmp_path):
    assert message(read_rows, tmp_path / "nope.jsonl") == f"{tmp_path / 'nope.jsonl'}: no such file"
    (tmp_path / "d.jsonl").mkdir()
    assert message(read_rows, tmp_path / "d.jsonl") == f"{tmp_path / 'd.jsonl'}: is a directory; expected a data file"
    assert message(read_rows, tmp_path / "x.csv", suffixes=(".jsonl",)) == (
        f"{tmp_path / 'x.csv'}: unsupported file extension '.csv'; expected one of .jsonl"
    )
    assert message(read_rows, tmp_path / "data") == (
        f"{tmp_path / 'data'}: no file extension; expected one of .jsonl, .json, .parquet"
    )


def test_unreadable_file(tmp_path, monkeypatch):
    path = write_jsonl(tmp_path / "x.jsonl", [{"a": 1}])
    real = Path.open

    def refused(self, *args, **kwargs):  # as a chmod 0 file refuses a non-root reader (the suite runs as root)
        if self == path:
            raise PermissionError(13, "Permission denied", str(self))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Path, "open", refused)
    assert message(read_rows, path) == f"{path}: cannot read it: Permission denied"


# ----------------------------------------------------------------------------- math task files


def test_math_file_errors_name_file_line_and_field(tmp_path):
    tmp_path = tmp_path.resolve()  # the math task names a file by its resolved path
    path = tmp_path / "m.jsonl"
    path.write_bytes(json.dumps(MATH_ROW).encode() + b"\n\xff\n")
    offset = len(json.dumps(MATH_ROW)) + 1
    assert message(MathTask, train_file=str(path)) == (
        f"{path}, line 2: invalid UTF-8 (byte 0xff at byte 1 of the line, file offset {offset}); expected UTF-8 text"
    )
    path = write_jsonl(tmp_path / "m2.jsonl", [MATH_ROW, '{"question": "x"'])
    assert message(load_math_rows, path) == (
        f"{path}, line 2: invalid JSON: Expecting ',' delimiter at column 17; expected one JSON object per line"
    )
    path = write_jsonl(tmp_path / "m3.jsonl", [MATH_ROW, {"question": "b?", "answer": ["2"]}])
    assert message(load_math_rows, path) == (
        f"{path}, line 2: field 'answer' is missing or not text (got ['2']); expected a string or a number"
    )
    path = write_jsonl(tmp_path / "m4.jsonl", [MATH_ROW, {"answer": "2"}])
    assert message(load_math_rows, path) == (
        f"{path}, line 2: field 'question' is missing (fields: answer); expected 'question' (filled into the prompt "
        "template), 'prompt' (text or a list of {role, content} turns) or 'messages'"
    )


def test_math_parquet_errors_name_the_row(tmp_path):
    tmp_path = tmp_path.resolve()
    path = write_parquet(tmp_path / "m.parquet", [MATH_ROW, {"question": "b?", "answer": None}])
    assert message(load_math_rows, path) == (
        f"{path}, row 2: field 'answer' is missing or not text (got None); expected a string or a number"
    )
    bad = tmp_path / "n.parquet"
    bad.write_text("question,answer\n")
    assert message(MathTask, heldout_file=str(bad)).startswith(f"{bad}: not a Parquet file")
    empty = tmp_path / "e.jsonl"
    empty.write_text("")
    assert (
        message(MathTask, train_file=str(empty)) == f"{empty}: empty file (0 bytes); expected one JSON object per line"
    )


def test_math_reads_a_json_array(tmp_path):
    path = tmp_path / "m.json"
    path.write_text(json.dumps([MATH_ROW, {"question": "Two?", "answer": 2}]))
    assert [row[:3] for row in load_math_rows(path)] == [("What is 1 + 1?", "2", None), ("Two?", "2", None)]


# ----------------------------------------------------------------------------- code task files


@pytest.mark.parametrize(
    "row, expected",
    [
        ({k: v for k, v in CODE_ROW.items() if k != "entry"}, "field 'entry': missing (a problem needs name, split, "),
        ({**CODE_ROW, "prompt": 3}, "field 'prompt': expected a non-empty string, got 3 (int)"),
        ({**CODE_ROW, "split": "test"}, "field 'split': expected one of train, heldout, got 'test'"),
        ({**CODE_ROW, "tests": []}, "field 'tests': expected a non-empty list of "),
        ({**CODE_ROW, "tests": [{"args": 1, "expected": 1}]}, "field 'tests[0]': expected an object "),
        (CODE_ROW, "field 'name': duplicate problem name 'one' (first at line 1)"),
    ],
)
def test_code_problem_rows(tmp_path, row, expected):
    path = write_jsonl(tmp_path / "p.jsonl", [CODE_ROW, row])
    assert message(load_problems, path).startswith(f"{path}, line 2, {expected}")


def test_code_problem_file_errors(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_bytes(b"\xfe\n")
    assert message(load_problems, path) == (
        f"{path}, line 1: invalid UTF-8 (byte 0xfe at byte 1 of the line, file offset 0); expected UTF-8 text"
    )
    path.write_text("\n\n")
    assert (
        message(load_problems, path)
        == f"{path}: no rows: the file holds only whitespace; expected one JSON object per line"
    )
    assert message(load_problems, tmp_path / "p.parquet").startswith(f"{tmp_path / 'p.parquet'}: unsupported file")


# ----------------------------------------------------------------------------- the command line


def test_creditrl_train_on_a_bad_train_file_prints_one_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(json.dumps(MATH_ROW).encode() + b'\n{"question": "caf\xe9"}\n')
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "creditrl.cli",
            "train",
            "--set",
            "task.name=math",
            "--set",
            f"task.args.train_file={bad}",
            "--run-dir",
            str(tmp_path / "run"),
        ],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 2, run.stderr
    assert "Traceback" not in run.stderr
    lines = run.stderr.strip().splitlines()
    offset = len(json.dumps(MATH_ROW)) + 1 + len('{"question": "caf')
    assert lines == [
        f"creditrl: error: task.args: {bad.resolve()}, line 2: invalid UTF-8 (byte 0xe9 at byte 18 of the line, "
        f"file offset {offset}); expected UTF-8 text"
    ]


def test_a_huge_cell_is_cut_in_the_message(tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", [{**CODE_ROW, "tests": "x" * 10_000}])
    text = message(load_problems, path)
    assert text.startswith(f"{path}, line 1, field 'tests': expected a non-empty list of ") and text.endswith("...")
    assert len(text) < len(str(path)) + 200
