"""Every YAML a user hands in (a config, ``--set`` values, a grid file) is read by one loader that
refuses, in one ConfigError line, aliases that expand a document past MAX_YAML_VALUES values or into
a cycle, nesting past MAX_YAML_DEPTH, files past MAX_YAML_BYTES and invalid YAML."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from creditrl.config import ConfigError, load_config
from creditrl.config.loader import MAX_YAML_BYTES, MAX_YAML_DEPTH, MAX_YAML_VALUES, load_yaml, read_yaml_file


def alias_bomb(levels: int = 9) -> str:
    """A "billion laughs" config: a ``module:factory`` task whose args nest ``levels`` lists of nine
    aliases of the level below (9**levels strings once expanded)."""
    names = "abcdefghijklmnop"[:levels]
    lines = ["task:", "  name: pkg.mod:factory", "  args:", "    a: &a [x,x,x,x,x,x,x,x,x]"]
    lines += [f"    {n}: &{n} [{', '.join([f'*{p}'] * 9)}]" for p, n in zip(names, names[1:])]
    return "\n".join(lines) + "\n"


def one_line(fn, *args) -> str:
    with pytest.raises(ConfigError) as err:
        fn(*args)
    text = str(err.value)
    assert "\n" not in text
    return text


def test_the_450_byte_alias_bomb_is_refused_in_one_line_within_a_second(tmp_path):
    path = tmp_path / "bomb.yaml"
    path.write_text(alias_bomb())
    assert path.stat().st_size <= 450
    start = time.perf_counter()
    text = one_line(load_config, path)
    assert time.perf_counter() - start < 1.0
    assert text == (
        f"{path}, line 5: YAML aliases expand the document to more than {MAX_YAML_VALUES} values (72 aliases; "
        "the first, *a, at line 5); write the values out, or reuse fewer"
    )


def test_the_bomb_is_refused_in_set_values_and_grid_files(tmp_path):
    from creditrl.experiments.grid import load_grid

    flow = "{" + alias_bomb().split("args:\n")[1].replace("\n", ",").rstrip(",").replace("    ", "") + "}"
    assert one_line(load_config, None, [f"task.args={flow}"]).startswith(
        "--set task.args, line 1: YAML aliases expand the document to more than"
    )
    grid = tmp_path / "g.yaml"
    grid.write_text(alias_bomb().replace("task:\n  name: pkg.mod:factory\n  args:\n", "set:\n"))
    assert one_line(load_grid, grid).startswith(f"{grid}, line 3: YAML aliases expand the document to more than")


def test_the_bomb_is_refused_in_finding_files_and_the_committed_ones_load(tmp_path):
    from creditrl.experiments.finding_files import load_finding

    finding = tmp_path / "f.yaml"
    finding.write_text(alias_bomb().replace("task:\n  name: pkg.mod:factory\n  args:\n", "reading:\n"))
    assert one_line(load_finding, finding).startswith(f"{finding}, line 3: YAML aliases expand the document")
    committed = sorted((Path(__file__).resolve().parents[1] / "findings").glob("*.yaml"))
    assert committed and all(load_finding(path)["id"] for path in committed)


def test_aliases_that_expand_a_little_are_read_as_before():
    assert load_yaml("a: &x {b: 1}\nc: *x\nd: [*x, *x]\n", "w") == {"a": {"b": 1}, "c": {"b": 1}, "d": [{"b": 1}] * 2}
    # 6 levels: 9**6 = 531441 values, over the limit; 5 levels: 66430, under it
    assert len(load_yaml(alias_bomb(5), "w")["task"]["args"]) == 5
    assert "expand the document" in one_line(load_yaml, alias_bomb(6), "w")


def test_an_alias_inside_its_own_anchor_is_refused():
    assert one_line(load_yaml, "a: &x [1, *x]\n", "cfg.yaml") == (
        "cfg.yaml, line 1: a YAML alias refers to a value that holds it (the first, *x, at line 1)"
    )


def test_nesting_is_bounded_also_past_the_interpreters_stack():
    deep = "[" * (MAX_YAML_DEPTH - 1) + "]" * (MAX_YAML_DEPTH - 1)  # under the top-level mapping
    assert load_yaml(f"a: {deep}", "w")["a"] is not None
    assert one_line(load_yaml, f"a: [{deep}]", "w") == "w, line 1: YAML lists and mappings nested more than 100 deep"
    assert one_line(load_config, None, ["task.args=" + "[" * 100_000]) == (
        f"--set task.args: YAML lists and mappings nested more than {MAX_YAML_DEPTH} deep"
    )


def test_invalid_yaml_is_one_line_with_its_line_and_column(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("rollout:\n  group_size: 4\n  top_p: [\n")
    assert one_line(load_config, path) == (
        f"{path}, line 4, column 1: not valid YAML: expected the node content, but found '<stream end>' "
        "(while parsing a flow node)"
    )
    assert one_line(load_config, None, ["rollout.top_p=a: b: c"]) == (
        "--set rollout.top_p, line 1, column 5: not valid YAML: mapping values are not allowed here"
    )


def test_a_file_past_the_size_limit_or_missing_is_refused(tmp_path):
    path = tmp_path / "big.yaml"
    path.write_text("a: " + "x" * MAX_YAML_BYTES + "\n")
    assert (
        one_line(read_yaml_file, path)
        == f"{path}: {MAX_YAML_BYTES + 4} bytes, over the {MAX_YAML_BYTES}-byte limit of a YAML file"
    )
    assert one_line(read_yaml_file, tmp_path / "no.yaml", "grid") == f"grid file not found: {tmp_path / 'no.yaml'}"
    assert one_line(load_config, tmp_path / "no.yaml") == f"config file not found: {tmp_path / 'no.yaml'}"


def test_creditrl_train_on_the_bomb_prints_one_line(tmp_path, capsys, monkeypatch):
    from creditrl.cli import main

    path = tmp_path / "bomb.yaml"
    path.write_text(alias_bomb())
    monkeypatch.chdir(tmp_path)
    start = time.perf_counter()
    assert main(["train", str(path), "--run-dir", "run"]) == 2
    assert time.perf_counter() - start < 1.0
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.splitlines()) == 1
    assert err.startswith(f"creditrl: error: {path}, line 5: YAML aliases expand the document to more than")
