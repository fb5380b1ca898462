"""``python -m studies.search`` at quick sizes: every method's row, the plot and the page."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from studies import search


def test_quick_search_study_writes_table_summary_and_plot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    monkeypatch.setenv("CREDITRL_CACHE", str(tmp_path / "cache"))
    run = tmp_path / "report"
    page = tmp_path / "search.md"
    argv = ["--quick", "--out", str(run), "--set", "train.progress=false", "--results", str(page)]
    assert search.cli(argv) == 0
    capsys.readouterr()
    report = (run / "report.md").read_text()
    summary = json.loads((run / "summary.json").read_text())
    series = {r["series"] for r in summary["rows"]}
    assert series == {
        "greedy",
        "best-of-N prm_min",
        "best-of-N orm",
        "best-of-N majority",
        "beam (PRM)",
        "mcts prm",
        "mcts rollout_orm",
        "mcts rollout_oracle (upper bound)",
    }
    assert len(summary["rows"]) == 1 + 3 * 3 + 2 + 2 + 1 + 1  # quick sizes: N in 1,2,4; 2 beams; 2 + 1 mcts budgets
    for r in summary["rows"]:
        assert 0.0 <= r["accuracy"] <= 1.0 and r["tokens_per_problem"] > 0
        assert f"| {r['series']} |" in report
        if r["method"] == "mcts":
            assert r["tokens_max"] <= r["budget"]
    bon = [r["tokens_per_problem"] for r in summary["rows"] if r["series"] == "best-of-N orm"]
    assert bon == sorted(bon)  # nested prefixes: more samples, more tokens
    png = run / "plots" / "search_budget.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    assert (run / "prms" / "prm" / "prm_config.json").exists() and (run / "prms" / "orm" / "prm_config.json").exists()
    # the default config searches harder problems than its RL task: 5-7 operations (its operands 1-3 under --quick)
    assert summary["task"] == {"name": "arithmetic", "args": {"min_ops": 5, "max_ops": 7, "operand_max": 3}}
    assert summary["majority_note"] == ""  # arithmetic has the answer hooks
    # the page: the report's table, its plot copied beside it
    assert all(
        f"| {100 * r['accuracy']:.1f}% | {r['tokens_per_problem']:.1f} |" in page.read_text() for r in summary["rows"]
    )
    assert (tmp_path / "search_search_budget.png").read_bytes() == png.read_bytes()
