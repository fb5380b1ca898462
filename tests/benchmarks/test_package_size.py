"""benchmarks/package_size.py: every line counted once, as code, docstring, comment or blank, and the
difference against a base checkout per subpackage."""

from __future__ import annotations

import pytest

import package_size

SOURCE = '''"""Module docstring
on two lines."""

# a comment
import os  # a trailing comment: a code line


class A:
    """Class docstring."""

    def f(self):
        """Function
        docstring."""
        x = """not a docstring"""
        return x
'''


def test_each_line_has_one_kind():
    kinds = package_size.line_kinds(SOURCE)
    assert dict(kinds) == {"docstring": 5, "blank": 4, "comment": 1, "code": 5}
    assert sum(kinds.values()) == len(SOURCE.splitlines())


def _tree(root, files):
    for name, text in files.items():
        path = root / "src" / "creditrl" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_subpackages_against_a_base(tmp_path, monkeypatch, capsys):
    here = _tree(tmp_path / "here", {"a/x.py": "x = 1\ny = 2\n", "a/new.py": "z = 3\n", "top.py": "\n"})
    base = _tree(tmp_path / "base", {"a/x.py": "x = 1\n", "gone/old.py": "o = 1\n\n\n"})
    monkeypatch.setattr(package_size, "ROOT", here)
    page = tmp_path / "package.md"
    package_size.main(["--base", str(base), "--results", str(page)])
    out = capsys.readouterr().out
    assert "`src/creditrl`: 4 lines in 3 modules." in out
    assert "| a/ | 3 | 3 | 0 | 1 | +2 |" in out
    assert "| gone/ | 0 | 0 | 0 | 3 | -3 |" in out
    assert "| all | 4 | 3 | 0 | 4 | +0 |" in out
    assert "| a/new.py | 1 |" in out and "| a/x.py |" not in out
    assert "| a/ | 3 | 3 | 0 | 1 | +2 |" in page.read_text()


def test_a_base_without_the_package_is_one_line(tmp_path):
    with pytest.raises(SystemExit, match=r"--base .*: no src/creditrl there"):
        package_size.main(["--base", str(tmp_path)])
