"""The layers of docs/design.md hold: no package imports upward (lazy imports included), the config
is a leaf, and no two modules import each other, directly or through others."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[1]


def test_import_linter_contracts_are_kept() -> None:
    # in its own process: a library imported by earlier tests may hold a stale stderr
    linter = Path(sys.executable).with_name("lint-imports")
    run = subprocess.run(
        [str(linter), "--config", str(ROOT / "pyproject.toml"), "--no-cache"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "layers KEPT" in run.stdout and "config is a leaf KEPT" in run.stdout


def _cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.find_modules_directly_imported_by(child)))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    component.append(m)
                    if m == node:
                        break
                if len(component) > 1:
                    out.append(sorted(component))
    return out


def test_no_module_import_cycles() -> None:
    assert _cycles(grimp.build_graph("creditrl")) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    graph = grimp.ImportGraph()
    for m in ("a", "a.x", "a.y", "a.z"):
        graph.add_module(m)
    graph.add_import(importer="a.x", imported="a.y")
    graph.add_import(importer="a.y", imported="a.x")
    graph.add_import(importer="a.z", imported="a.x")
    assert _cycles(graph) == [["a.x", "a.y"]]


def _function_lengths(package: str) -> dict[str, int]:
    import ast

    out = {}
    for path in sorted((ROOT / "src" / "creditrl" / package).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                out[f"{path.relative_to(ROOT)}:{node.lineno} {node.name}"] = node.end_lineno - node.lineno + 1
    return out


def test_the_data_flow_reads_in_one_sitting() -> None:
    """No function over 80 lines in the data-flow packages; the RL iteration itself within ~40."""
    lengths = {
        k: n for p in ("train", "rollout", "rewards", "values", "credit") for k, n in _function_lengths(p).items()
    }
    assert {k: n for k, n in lengths.items() if n > 80} == {}
    iteration = [n for k, n in lengths.items() if k.startswith("src/creditrl/train/rl.py") and k.endswith(" iteration")]
    assert len(iteration) == 1 and iteration[0] <= 40


def _design_layers() -> list[set[str]]:
    """The packages of each row of docs/design.md's layer table, bottom to top."""
    import re

    text = (ROOT / "docs" / "design.md").read_text()
    section = text.split("\n## Layers\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if re.match(r"\|\s*\d+\s*\|", line)]
    numbers = [int(row.split("|")[1]) for row in rows]
    assert numbers == list(range(len(rows))), numbers  # one row per layer, numbered from 0
    return [set(re.findall(r"`([a-z_]+)`", row.split("|")[2])) for row in rows]


def _contract_layers() -> list[set[str]]:
    """The ``layers`` import-linter contract of pyproject.toml, bottom to top, without the layers
    whose package does not exist (a package being moved out of creditrl)."""
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (layers,) = [c["layers"] for c in config["contracts"] if c["name"] == "layers"]
    package = ROOT / "src" / "creditrl"
    out = []
    for layer in reversed(layers):
        names = {name.strip() for name in layer.split("|")}
        names = {n for n in names if (package / n).is_dir() or (package / f"{n}.py").is_file()}
        if names:
            out.append(names)
    return out


def test_the_design_layer_table_is_the_contract() -> None:
    assert _design_layers() == _contract_layers()
    package = ROOT / "src" / "creditrl"
    listed = set().union(*_design_layers())
    present = {p.name for p in package.iterdir() if (p / "__init__.py").is_file() and p.name != "configs"}
    present |= {p.stem for p in package.glob("*.py") if p.stem != "__init__"}
    assert listed == present
