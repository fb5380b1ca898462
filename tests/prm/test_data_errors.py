"""Bad PRM stepwise files: load_stepwise and the importers give one DataFileError line naming the
file, the line or row and the field; `creditrl prm train` / `prm eval` print that line alone
(exit status 2, no traceback) before any model is loaded or trained."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from creditrl.prm.data import StepwiseExample, import_math_shepherd, import_prm800k, load_stepwise, save_stepwise
from creditrl.tasks.datafile import DataFileError

ROOT = Path(__file__).resolve().parents[2]
GOOD = json.dumps({"prompt": "1+1=", "completions": ["1+1=2;", "#2"], "labels": [1, 1]})


def write(path: Path, data: bytes | str) -> Path:
    path.write_bytes(data if isinstance(data, bytes) else data.encode())
    return path


def message(fn, path: Path) -> str:
    with pytest.raises(DataFileError) as err:
        fn(path)
    text = str(err.value)
    assert "\n" not in text and str(path) in text
    return text


def truncated_parquet(tmp_path: Path) -> tuple[Path, int]:
    whole = tmp_path / "whole.parquet"
    save_stepwise([StepwiseExample("p", ["step;"] * 50, [1.0] * 50)] * 40, whole)
    data = whole.read_bytes()
    cut = write(tmp_path / "cut.parquet", data[: len(data) // 2])
    return cut, len(data) // 2


def test_invalid_utf8(tmp_path):
    path = write(tmp_path / "x.jsonl", GOOD.encode() + b'\n{"prompt": "\xff"}\n')
    offset = len(GOOD) + 1 + len('{"prompt": "')
    assert message(load_stepwise, path) == (
        f"{path}, line 2: invalid UTF-8 (byte 0xff at byte 13 of the line, file offset {offset}); expected UTF-8 text"
    )


def test_not_parquet_with_a_parquet_name(tmp_path):
    path = write(tmp_path / "x.parquet", GOOD + "\n")
    assert message(load_stepwise, path) == (
        f"{path}: not a Parquet file (it does not start with the Parquet magic bytes 'PAR1'); "
        "expected a Parquet file; it looks like JSON: name it .jsonl"
    )


def test_truncated_parquet(tmp_path):
    path, size = truncated_parquet(tmp_path)
    assert message(load_stepwise, path) == (
        f"{path}: truncated Parquet file: it starts as Parquet but its footer is missing ({size} bytes); "
        "expected a complete Parquet file"
    )


@pytest.mark.parametrize(
    "name, data, expected",
    [
        ("x.jsonl", b"", "empty file (0 bytes); expected one JSON object per line"),
        ("x.jsonl", b"\n  \n", "no rows: the file holds only whitespace; expected one JSON object per line"),
        ("x.parquet", b"", "empty file (0 bytes); expected a Parquet file"),
    ],
)
def test_empty_files(tmp_path, name, data, expected):
    path = write(tmp_path / name, data)
    assert message(load_stepwise, path) == f"{path}: {expected}"


def test_parquet_without_rows(tmp_path):
    path = tmp_path / "x.parquet"
    save_stepwise([], path)
    assert message(load_stepwise, path) == f"{path}: no rows; expected a Parquet table with at least one row"
    assert load_stepwise(path, allow_empty=True) == []


def test_line_that_is_not_json(tmp_path):
    path = write(tmp_path / "x.jsonl", f"{GOOD}\n\n{{'prompt': 1}}\n")
    assert message(load_stepwise, path) == (
        f"{path}, line 3: invalid JSON: Expecting property name enclosed in double quotes at column 2; "
        "expected one JSON object per line"
    )


def test_line_that_is_not_an_object(tmp_path):
    path = write(tmp_path / "x.jsonl", f"{GOOD}\n[1, 2]\n")
    assert message(load_stepwise, path) == f"{path}, line 2: expected a JSON object, got list"


def test_missing_field(tmp_path):
    path = write(tmp_path / "x.jsonl", f'{GOOD}\n{{"prompt": "a", "completions": ["s"]}}\n')
    assert message(load_stepwise, path) == (
        f"{path}, line 2, field 'labels': missing (a row needs 'prompt', 'completions' and 'labels')"
    )


def test_wrong_type(tmp_path):
    path = write(tmp_path / "x.jsonl", f'{GOOD}\n{{"prompt": ["a"], "completions": ["s"], "labels": [1]}}\n')
    assert message(load_stepwise, path) == f"{path}, line 2, field 'prompt': expected a string, got list"


def test_parquet_wrong_type_names_the_row(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "x.parquet"
    table = pa.table({"prompt": ["a", None], "completions": [["s"], ["t"]], "labels": [[1.0], [0.0]]})
    pq.write_table(table, path)
    assert message(load_stepwise, path) == f"{path}, row 2, field 'prompt': expected a string, got null"


def test_deeply_nested_json_is_one_line(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = write(tmp_path / "x.jsonl", f'{GOOD}\n{{"prompt": "a", "meta": {"[" * 100_000}\n')
    assert message(load_stepwise, path) == (
        f"{path}, line 2: invalid JSON: arrays and objects nested more than 100 deep; expected one JSON object per line"
    )
    path = tmp_path / "x.parquet"  # save_stepwise writes meta as JSON text
    meta = ["{}", "[" * 100_000 + "]" * 100_000]
    pq.write_table(
        pa.table({"prompt": ["a", "b"], "completions": [["s"], ["t"]], "labels": [[1.0], [0.0]], "meta": meta}), path
    )
    assert message(load_stepwise, path) == (
        f"{path}, row 2, field 'meta': expected an object or its JSON text, got JSON nested too deeply"
    )


def test_importers_use_the_same_reader(tmp_path):
    bad = write(tmp_path / "p.jsonl", b"\xc3\n")
    for fn in (import_prm800k, import_math_shepherd):
        assert message(fn, bad) == (
            f"{bad}, line 1: invalid UTF-8 (byte 0xc3 at byte 1 of the line, file offset 0); expected UTF-8 text"
        )
    empty = write(tmp_path / "e.jsonl", b"")
    assert message(import_prm800k, empty) == f"{empty}: empty file (0 bytes); expected one JSON object per line"
    assert message(import_math_shepherd, tmp_path / "nope.jsonl") == f"{tmp_path / 'nope.jsonl'}: no such file"


# ----------------------------------------------------------------------------- the command line


def creditrl(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "creditrl.cli", *args],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
        capture_output=True,
        text=True,
        timeout=300,
    )


def assert_one_line(run: subprocess.CompletedProcess, expected: str) -> None:
    assert run.returncode == 2, run.stderr
    assert "Traceback" not in run.stderr
    assert run.stderr.splitlines() == [f"creditrl: error: {expected}"]


def test_prm_train_on_bad_files_prints_one_line(tmp_path):
    bad = write(tmp_path / "bad.jsonl", GOOD.encode() + b"\n\xff\n")
    run = creditrl("prm", "train", "bad.jsonl", "--out", "prm", cwd=tmp_path)
    offset = len(GOOD) + 1
    assert_one_line(
        run,
        f"bad.jsonl, line 2: invalid UTF-8 (byte 0xff at byte 1 of the line, file offset {offset}); "
        "expected UTF-8 text",
    )
    assert bad.exists() and not (tmp_path / "prm").exists()
    cut, size = truncated_parquet(tmp_path)
    run = creditrl("prm", "train", str(cut), "--out", "prm", cwd=tmp_path)
    assert_one_line(
        run,
        f"{cut}: truncated Parquet file: it starts as Parquet but its footer is missing ({size} bytes); "
        "expected a complete Parquet file",
    )


def test_prm_train_on_unlabelled_data_and_prm_eval_on_a_located_error(tmp_path):
    unlabelled = write(tmp_path / "u.jsonl", json.dumps({"prompt": "p", "completions": ["a"], "labels": [None]}) + "\n")
    run = creditrl("prm", "train", str(unlabelled), "--out", "prm", cwd=tmp_path)
    assert_one_line(run, f"{unlabelled}: no labelled step (every label is null); expected at least one label in [0, 1]")
    bad = write(tmp_path / "x.jsonl", f"{GOOD}\n{json.dumps({'prompt': 'a', 'completions': ['s'], 'labels': [2]})}\n")
    run = creditrl("prm", "eval", "no-such-prm", str(bad), cwd=tmp_path)
    assert_one_line(
        run, f"{bad}, line 2, field 'labels': label 0 must be a bool, a number in [0, 1] or null, got 2 (int)"
    )


def test_prm_train_prints_an_error_found_while_training_in_one_line(tmp_path):
    """An empty step is found when the PRM tokenises it (after the policy is built), still one line."""
    row = {"prompt": "1+2=", "completions": ["1+2=3;", ""], "labels": [1, 0]}
    data = write(tmp_path / "e.jsonl", json.dumps(row) + "\n")
    run = creditrl("prm", "train", str(data), "--out", "prm", "--set", "train.init=policy", cwd=tmp_path)
    assert_one_line(run, "creditrl prm train: step 1 of prompt '1+2=' is empty: a step needs a token to be scored at")
