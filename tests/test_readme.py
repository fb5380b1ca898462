"""The README's Python example runs as written (docs must not drift from the code)."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_python_api_example_runs() -> None:
    block = re.search(r"## Python API.*?```python\n(.*?)```", README.read_text(), re.S)
    assert block, "README has no Python API example"
    scope: dict = {}
    exec(compile(block.group(1), "README.md", "exec"), scope)  # noqa: S102 - our own README
    adv, ret, batch = scope["adv"], scope["ret"], scope["batch"]
    assert adv.shape == ret.shape == batch.response_mask.shape and adv.shape[0] == 4 * 8
    assert bool((adv[~batch.response_mask] == 0).all())


def test_readme_quick_start_is_the_two_make_commands() -> None:
    text = README.read_text()
    quick = re.search(r"## Quick start\n\n```bash\n(.*?)```", text, re.S).group(1)
    assert [line.split("#")[0].strip() for line in quick.strip().splitlines()] == ["make demo", "make test"]


def test_readme_custom_task_example_is_the_example_file() -> None:
    """The README shows examples/custom_task.py exactly (tests/tasks/test_custom_task.py runs it)."""
    example = (README.parent / "examples" / "custom_task.py").read_text().rstrip()
    block = re.search(r"### Bring your own task.*?```python\n(.*?)```", README.read_text(), re.S)
    assert block and block.group(1).rstrip() == example
