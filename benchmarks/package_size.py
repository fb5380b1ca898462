"""The package's size: lines of ``src/creditrl`` by kind and by subpackage, optionally against another checkout.

    .venv/bin/python benchmarks/package_size.py [--base DIR] [--results docs/results/package.md]

Every line of every ``.py`` file is one of: ``blank``; ``comment`` (nothing but a ``#`` comment);
``docstring`` (inside the docstring of a module, class or function, as :mod:`ast` finds it); or
``code`` (the rest, a code line with a trailing comment included). With ``--base DIR`` (the root of
another checkout, e.g. ``git worktree add /tmp/base cd01afc``), each subpackage's total there and
the difference, and the modules here that the base does not have, largest first.
"""

from __future__ import annotations

import argparse
import ast
from collections import Counter
from pathlib import Path

from creditrl.experiments.report import printed_results

ROOT = Path(__file__).resolve().parent.parent
KINDS = ("code", "docstring", "comment", "blank")


def line_kinds(source: str) -> Counter:
    """How many lines of ``source`` (a Python module) are of each of :data:`KINDS`."""
    lines = source.splitlines()
    kinds = ["blank" if not line.strip() else "comment" if line.lstrip().startswith("#") else "code" for line in lines]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            value = first.value if isinstance(first, ast.Expr) else None
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                kinds[first.lineno - 1 : first.end_lineno] = ["docstring"] * (first.end_lineno - first.lineno + 1)
    return Counter(kinds)


def package_lines(package: Path) -> dict[str, Counter]:
    """{module path relative to ``package``: its :func:`line_kinds`} for every ``.py`` file below it."""
    return {str(p.relative_to(package)): line_kinds(p.read_text()) for p in sorted(package.rglob("*.py"))}


def subpackage(module: str) -> str:
    """``credit/gae.py`` -> ``credit/``; a top-level module is itself."""
    return module.split("/", 1)[0] + "/" if "/" in module else module


def by_subpackage(modules: dict[str, Counter]) -> dict[str, Counter]:
    """{subpackage: the sum of its modules' :func:`line_kinds`}."""
    out: dict[str, Counter] = {}
    for module, kinds in modules.items():
        out.setdefault(subpackage(module), Counter()).update(kinds)
    return out


def _total(kinds: Counter) -> int:
    return sum(kinds[k] for k in KINDS)


def report(here: dict[str, Counter], base: dict[str, Counter] | None) -> None:
    """Print the tables: the package by kind, by subpackage (against ``base`` when given), and the
    modules ``base`` lacks."""
    whole = sum(here.values(), Counter())
    print(f"`src/creditrl`: {_total(whole):,} lines in {len(here)} modules.\n")
    print("| kind | lines | share |\n| --- | ---: | ---: |")
    for k in KINDS:
        print(f"| {k} | {whole[k]:,} | {100 * whole[k] / _total(whole):.1f}% |")
    parts, base_parts = by_subpackage(here), by_subpackage(base or {})
    head = "| subpackage | lines | code | docstring |" + (" base | difference |" if base is not None else "")
    print(f"\n{head}\n|{' --- |' + ' ---: |' * (head.count('|') - 2)}")
    for name in sorted(set(parts) | set(base_parts), key=lambda n: -_total(parts.get(n, Counter()))):
        kinds = parts.get(name, Counter())
        row = f"| {name} | {_total(kinds):,} | {kinds['code']:,} | {kinds['docstring']:,} |"
        if base is not None:
            was = _total(base_parts.get(name, Counter()))
            row += f" {was:,} | {_total(kinds) - was:+,} |"
        print(row)
    if base is not None:
        was = sum(base.values(), Counter())
        print(f"| all | {_total(whole):,} | {whole['code']:,} | {whole['docstring']:,} | {_total(was):,} |"
              f" {_total(whole) - _total(was):+,} |")  # fmt: skip
        new = sorted((m for m in here if m not in base), key=lambda m: -_total(here[m]))
        print(f"\n{len(new)} modules here are not in the base ({sum(_total(here[m]) for m in new):,} lines):\n")
        print("| module | lines |\n| --- | ---: |")
        for m in new:
            print(f"| {m} | {_total(here[m]):,} |")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", type=Path, help="the root of another checkout to compare with (its src/creditrl)")
    ap.add_argument("--results", help="also write what is printed as this results page")
    args = ap.parse_args(argv)
    base = None
    if args.base is not None:
        if not (args.base / "src" / "creditrl").is_dir():
            raise SystemExit(f"--base {args.base}: no src/creditrl there (expected the root of a creditrl checkout)")
        base = package_lines(args.base / "src" / "creditrl")
    with printed_results(args.results, "Package size"):
        report(package_lines(ROOT / "src" / "creditrl"), base)


if __name__ == "__main__":
    main()
