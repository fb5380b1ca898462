"""The README's examples run as written (docs must not drift from the code)."""

from __future__ import annotations

import json
import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_stage_example_runs() -> None:
    """README's Python API section points at examples/stages.py, which runs one iteration's stages."""
    import runpy

    assert "`examples/stages.py`" in re.search(r"## Python API(.*?)\n## ", README.read_text(), re.S).group(1)
    scope = runpy.run_path(str(README.parent / "examples" / "stages.py"))
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


def test_the_config_reference_page_is_generated_from_the_schema() -> None:
    """docs/config.md holds the generated table, and README links it."""
    from creditrl.config.reference import END, START, reference_markdown

    text = (README.parent / "docs" / "config.md").read_text()
    assert START in text and END in text, "docs/config.md has no generated config reference"
    block = text[text.index(START) : text.index(END) + len(END)] + "\n"
    assert block == reference_markdown(), "docs/config.md is stale: paste `creditrl config --reference` into it"
    assert "(docs/config.md)" in README.read_text()


def test_every_schema_field_is_described() -> None:
    from creditrl.config.reference import reference_rows

    missing = [key for key, _, text in reference_rows() if not text.strip()]
    assert missing == []


def test_readme_is_a_user_document() -> None:
    """At most 300 lines, no run logs (dates, clock times); every link to a file resolves, and every
    results page it links states its command, machine and date."""
    text = README.read_text()
    assert len(text.splitlines()) <= 300
    assert re.findall(r"20\d\d-[01]\d-[0-3]\d|\d\d:\d\d UTC", text) == []
    for link in re.findall(r"\]\(([^)#]+)", text):
        if link.startswith("http"):
            continue
        page = README.parent / link
        assert page.exists(), link
        if link.startswith("docs/results/") and link.endswith(".md"):
            assert page.read_text().splitlines()[2].startswith("Written by `"), link  # command, machine, date


def test_every_file_findings_links_is_in_the_repository() -> None:
    """FINDINGS.md's plots and pages resolve in a checkout (a plot written but never committed
    breaks the page in every clone)."""
    findings = README.parent / "FINDINGS.md"
    links = [x for x in re.findall(r"\]\(([^)#]+)", findings.read_text()) if not x.startswith("http")]
    assert any(x.endswith(".png") for x in links)
    assert [x for x in links if not (README.parent / x).is_file()] == []


def test_readme_results_table_is_generated_from_its_pages_json() -> None:
    """The results table has at most 8 rows, no cell over 20 words, and is exactly what
    docs/glance.py renders from the JSON of the pages it links (FINDINGS' verdicts.json, the
    performance and GPU pages' JSON): each number is the JSON's."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("glance", README.parent / "docs" / "glance.py")
    glance = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(glance)
    table = glance.readme_table(README.read_text())
    assert table == glance.table(), "README's results table is stale: run python docs/glance.py"
    rows = table.splitlines()[2:]
    assert 1 <= len(rows) <= 8
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert all(len(c.split()) <= 20 for c in cells), row
    verdicts = json.loads((README.parent / glance.VERDICTS).read_text())["rows"]
    c5 = next(r for r in verdicts if (r["finding"], r["arm"], r["reference"]) == glance.FINDING_ROWS[5][1:])
    d = c5["difference"]
    assert f"{100 * d['mean']:+.1f} points [{100 * d['lo']:+.1f}, {100 * d['hi']:+.1f}]" in rows[5]


def test_readme_reward_example_registers_a_working_source() -> None:
    from creditrl.rewards.sources import REWARD_SOURCES, get_source

    block = re.search(r"### Your own reward.*?```python\n(.*?)```", README.read_text(), re.S)
    assert block, "README has no reward-source example"
    try:
        exec(compile(block.group(1), "README.md", "exec"), {})  # noqa: S102 - our own README
        source = get_source("short_spans")
        assert source.default_granularity == "sequence" and source.granularities == {"sequence", "step"}
        assert source.fn(None, None, "3+4=7;#7", ["3+4=7;", "#7" * 10]) == [1.0, 0.0]
    finally:
        REWARD_SOURCES.pop("short_spans", None)
