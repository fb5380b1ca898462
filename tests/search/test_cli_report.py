"""``creditrl search`` on the command line and the quick ``creditrl search report``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from creditrl.cli import main


@pytest.fixture(scope="module")
def saved_models(tmp_path_factory, peaked_tiny, tiny_prm):
    """A tiny policy and an untrained PRM written to disk, as the CLI reads them."""
    root = tmp_path_factory.mktemp("search_cli")
    model, tok = peaked_tiny(0, 1)
    model.save_pretrained(root / "policy")
    tok.save_pretrained(root / "policy")
    prm, ptok = tiny_prm
    prm.save(root / "prm")
    ptok.save_pretrained(root / "prm")
    return root


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--method", "sampling"], "unknown search method 'sampling'; expected one of: greedy, best_of_n, beam, mcts"),
        (["--method", "beam"], "method 'beam' (width=4 expansions=4 aggregation=min temperature=1.0) needs a PRM"),
        (["--method", "mcts", "--set", "leaf_value=rollout_orm"], "needs an ORM to judge solutions"),
        (["--budget", "0"], "budget must be >= 1 generated token per problem, got 0"),
        (["--set", "width=wide"], "--set width: expected int, got 'wide'"),
    ],
)
def test_cli_rejects_bad_input_before_loading_anything(argv, message, capsys) -> None:
    assert main(["search", "--policy", "/nonexistent", *argv]) == 2
    assert message in capsys.readouterr().err


def test_cli_runs_a_method_and_reports_accuracy_and_tokens(saved_models: Path, capsys) -> None:
    out = saved_models / "beam.json"
    argv = ["search", "--method", "beam", "--policy", str(saved_models / "policy"), "--prm", str(saved_models / "prm"),
            "--budget", "90", "--problems", "2", "--min-ops", "2", "--max-ops", "3", "--set", "max_new_tokens=24",
            "--set", "width=2", "--out", str(out)]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "search beam width=2 expansions=4 aggregation=min temperature=1.0 on 2 heldout" in text
    assert "accuracy " in text and "tokens/problem " in text
    saved = json.loads(out.read_text())
    tokens = [r["tokens"] for r in saved["problems"]]
    assert saved["summary"]["tokens_total"] == sum(tokens) and all(1 <= t <= 90 for t in tokens)
    assert saved["config"]["width"] == 2 and saved["config"]["max_new_tokens"] == 24


def test_quick_report_writes_table_summary_and_plot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.setenv("CREDITRL_CACHE", str(tmp_path / "cache"))
    run = tmp_path / "report"
    assert main(["search", "report", "--quick", "--out", str(run), "--set", "train.progress=false"]) == 0
    printed = capsys.readouterr().out
    report = (run / "report.md").read_text()
    assert "Quick mode" in report and "| method | setting | accuracy | tokens/problem |" in report
    assert "| method | setting | accuracy | tokens/problem |" in printed
    summary = json.loads((run / "summary.json").read_text())
    series = {r["series"] for r in summary["rows"]}
    assert series == {"greedy", "best-of-N prm_min", "best-of-N orm", "best-of-N majority", "beam (PRM)", "mcts prm",
                      "mcts rollout_orm", "mcts rollout_oracle (upper bound)"}
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
