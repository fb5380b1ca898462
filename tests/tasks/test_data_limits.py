"""Bounded data files: a row over ``max_row_bytes`` is refused in one line naming the file, the line
and its length (or skipped under ``long_rows="skip"``) without being held whole, and JSON nested
deeper than ``MAX_JSON_DEPTH`` is the one-line data-file error, not a RecursionError."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from creditrl.tasks.datafile import MAX_JSON_DEPTH, MAX_ROW_BYTES, DataFileError, read_rows
from creditrl.tasks.math import MathTask
from creditrl.train.resolve import build_task

ROOT = Path(__file__).resolve().parents[2]
ROW = {"question": "What is 1 + 1?", "answer": "2"}


def line(row: object) -> bytes:
    return json.dumps(row).encode() + b"\n"


def message(fn, *args, **kwargs) -> str:
    with pytest.raises(DataFileError) as err:
        fn(*args, **kwargs)
    text = str(err.value)
    assert "\n" not in text
    return text


def huge_file(path: Path, megabytes: int) -> int:
    """A JSON Lines file whose line 2 holds a question of ``megabytes`` MB; the line's length."""
    big = b'{"question": "' + b"x" * (megabytes * 2**20) + b'", "answer": "2"}'
    path.write_bytes(line(ROW) + big + b"\n" + line(ROW))
    return len(big)


# ----------------------------------------------------------------------------- row size


def test_a_50_mb_row_is_refused_in_one_line_and_never_held_whole(tmp_path):
    path = tmp_path / "big.jsonl"
    size = huge_file(path, 50)
    probe = (
        "import resource, sys\n"
        "from creditrl.tasks.datafile import DataFileError, read_rows\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "try:\n    read_rows(sys.argv[1])\nexcept DataFileError as exc:\n    print(exc)\n"
        "print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024)\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", probe, str(path)], capture_output=True, text=True, timeout=120, cwd=ROOT, check=True
    )
    error, growth = run.stdout.strip().splitlines()
    assert error == (
        f"{path}, line 2: the line is {size} bytes, over max_row_bytes={MAX_ROW_BYTES}; expected rows of at most "
        f"{MAX_ROW_BYTES} bytes (raise max_row_bytes, or set long_rows=skip to skip such rows)"
    )
    # the reader holds at most max_row_bytes + 2 bytes of a line (read once, copied once; measured: 32 MB),
    # then 1 MiB pieces: its peak RSS grows by far less than the 2 GB allowed, and less than the line
    assert int(growth) < 3 * MAX_ROW_BYTES < size < 2**31


@pytest.mark.parametrize("ending", [b"\n", b"\r\n"])
def test_the_limit_counts_the_line_without_its_ending(tmp_path, ending):
    path = tmp_path / "x.jsonl"
    row = b'{"a": "' + b"x" * 10 + b'"}'  # 19 bytes
    path.write_bytes(row + ending + row + b"1" + ending)
    assert message(read_rows, path, max_row_bytes=19).startswith(f"{path}, line 2: the line is 20 bytes, over ")
    path.write_bytes(row + ending + row)  # the last line without an ending
    assert read_rows(path, max_row_bytes=19).rows == [(1, {"a": "x" * 10}), (2, {"a": "x" * 10})]


def test_long_rows_skip_leaves_them_out_and_warns_once(tmp_path, caplog):
    path = tmp_path / "x.jsonl"
    path.write_bytes(line(ROW) + b'{"a": "' + b"y" * 5000 + b'"}\n' + line(ROW) + b'{"b": "' + b"z" * 3000 + b'"}')
    with caplog.at_level(logging.WARNING, logger="creditrl"):
        rows = read_rows(path, max_row_bytes=1000, long_rows="skip")
    assert [n for n, _ in rows.rows] == [1, 3]
    assert [r.getMessage() for r in caplog.records] == [
        f"creditrl: {path}: skipped 2 rows over max_row_bytes=1000: line 2 (5009 bytes), line 4 (3009 bytes)"
    ]
    only_long = tmp_path / "long.jsonl"
    only_long.write_bytes(b'{"a": "' + b"y" * 5000 + b'"}\n')
    assert message(read_rows, only_long, max_row_bytes=1000, long_rows="skip") == (
        f"{only_long}: no rows: all 1 are over max_row_bytes=1000"
    )


def test_bad_limits_are_value_errors(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_bytes(line(ROW))
    with pytest.raises(ValueError, match="long_rows must be one of error, skip, got 'drop'"):
        read_rows(path, long_rows="drop")
    with pytest.raises(ValueError, match="max_row_bytes must be a positive integer, got 0"):
        read_rows(path, max_row_bytes=0)


def test_json_array_and_parquet_rows_over_the_limit_name_the_row(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"a": "x"}, {"a": "y" * 2000}, {"a": "z"}]
    array = tmp_path / "x.json"
    array.write_text(json.dumps(rows))
    compact = len(json.dumps(rows[1], separators=(",", ":")))
    assert message(read_rows, array, max_row_bytes=1000).startswith(
        f"{array}, row 2: the row is {compact} bytes, over max_row_bytes=1000;"
    )
    assert [n for n, _ in read_rows(array, max_row_bytes=1000, long_rows="skip").rows] == [1, 3]
    table = tmp_path / "x.parquet"
    pq.write_table(pa.Table.from_pylist(rows), table)
    assert message(read_rows, table, max_row_bytes=1000).startswith(
        f"{table}, row 2: the row is 2000 bytes, over max_row_bytes=1000;"
    )
    assert read_rows(table, max_row_bytes=1000, long_rows="skip").rows == [(1, {"a": "x"}), (3, {"a": "z"})]


def test_the_math_task_refuses_or_skips_a_long_row_through_its_arguments(tmp_path):
    path = tmp_path / "m.jsonl"
    size = huge_file(path, 1)
    with pytest.raises(ValueError) as err:
        build_task("math", {"train_file": str(path), "max_row_bytes": 2**20})
    assert str(err.value).startswith(f"task.args: {path.resolve()}, line 2: the line is {size} bytes, over ")
    task = MathTask(train_file=str(path), max_row_bytes=2**20, long_rows="skip", heldout_mod=1000)
    assert sorted(p.meta["row"] for p in task.pools["train"] + task.pools["heldout"]) == [1, 3]


def test_the_code_task_takes_the_same_limits(tmp_path):
    from creditrl.tasks.code import CodeTask

    row = {"split": "train", "entry": "one", "prompt": 'def one(): "one"; return ', "solution": "1"}
    row["tests"] = [{"args": [], "expected": 1}]
    path = tmp_path / "p.jsonl"
    path.write_bytes(line({**row, "name": "a"}) + line({**row, "name": "b", "prompt": "#" + "x" * 3000}))
    with pytest.raises(DataFileError, match=r"p.jsonl, line 2: the line is 3\d\d\d bytes, over max_row_bytes=1000;"):
        CodeTask(problems=str(path), max_row_bytes=1000)
    assert [p.meta["name"] for p in CodeTask(problems=str(path), max_row_bytes=1000, long_rows="skip").problems] == [
        "a"
    ]


def test_a_json_array_file_past_its_whole_file_bound_is_refused(tmp_path, monkeypatch):
    from creditrl.tasks import jsonrows

    monkeypatch.setattr(jsonrows, "MAX_ARRAY_BYTES", 100)
    path = tmp_path / "x.json"
    path.write_text(json.dumps([ROW] * 3))
    assert message(read_rows, path) == (
        f"{path}: a JSON array file is read whole and this one is over 100 bytes; expected JSON Lines (one object "
        "per line, e.g. `jq -c '.[]' x.json > x.jsonl`) for a file this large"
    )
    path.write_text("\n".join(json.dumps(r) for r in [ROW] * 3))  # JSON Lines under a .json name: line by line
    assert len(read_rows(path).rows) == 3


# ----------------------------------------------------------------------------- nesting


def test_a_deeply_nested_line_is_the_one_line_data_file_error(tmp_path):
    path = tmp_path / "x.jsonl"
    expected = (
        f"invalid JSON: arrays and objects nested more than {MAX_JSON_DEPTH} deep; expected one JSON object per line"
    )
    path.write_bytes(line(ROW) + b"[" * 100_000 + b"]" * 100_000 + b"\n")  # past the interpreter's recursion limit
    assert message(read_rows, path) == f"{path}, line 2: {expected}"
    path.write_bytes(line(ROW) + line({"a": [[0]]}) + b"  " + line({"a": json.loads("[" * 200 + "]" * 200)}))
    assert message(read_rows, path) == f"{path}, line 3: {expected}"


def test_nesting_up_to_the_limit_is_read(tmp_path):
    deepest = json.loads("[" * (MAX_JSON_DEPTH - 1) + "]" * (MAX_JSON_DEPTH - 1))  # under the row's own object
    path = tmp_path / "x.jsonl"
    path.write_bytes(line({"a": deepest}))
    assert read_rows(path).rows == [(1, {"a": deepest})]
    path.write_bytes(line({"a": [deepest]}))
    assert message(read_rows, path).startswith(f"{path}, line 1: invalid JSON: arrays and objects nested more than")
    array = tmp_path / "x.json"
    array.write_text("[" * 100_000 + "]" * 100_000)
    assert message(read_rows, array) == (
        f"{array}: invalid JSON: arrays and objects nested more than {MAX_JSON_DEPTH} deep; "
        "expected a JSON array of objects"
    )
    array.write_text(json.dumps([{"a": deepest}]))
    assert read_rows(array).rows == [(1, {"a": deepest})]


# ----------------------------------------------------------------------------- the command line


def test_creditrl_train_on_a_50_mb_row_prints_one_line(tmp_path, capsys, monkeypatch):
    from creditrl.cli import main

    path = tmp_path / "big.jsonl"
    size = huge_file(path, 50)
    monkeypatch.chdir(tmp_path)
    argv = ["train", "--set", "task.name=math", "--set", f"task.args.train_file={path}", "--run-dir", "run"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.splitlines() == [
        f"creditrl: error: task.args: {path.resolve()}, line 2: the line is {size} bytes, over "
        f"max_row_bytes={MAX_ROW_BYTES}; expected rows of at most {MAX_ROW_BYTES} bytes (raise max_row_bytes, "
        "or set long_rows=skip to skip such rows)"
    ]
