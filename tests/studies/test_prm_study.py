"""``python -m studies.prm`` at quick sizes: every table, the summary, the plot and the PRMs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from studies import prm


def test_quick_report_writes_every_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CREDITRL_CACHE", str(tmp_path / "cache"))
    run = tmp_path / "report"
    assert prm.cli(["--quick", "--out", str(run), "--set", "train.progress=false"]) == 0
    text = (run / "report.md").read_text()
    for heading in (
        "Labelers against the oracle",
        "Step AUROC",
        "Shortcut probe",
        "MC labels",
        "Best-of-N",
        "RL with the learned PRM",
    ):
        assert heading in text
    summary = json.loads((run / "summary.json").read_text())
    assert set(summary["best_of_n"]) == {"prm_min", "prm_product", "prm_last", "prm_mean", "orm", "majority"}
    # the default config's task, whose answers majority compares (no note)
    assert summary["task"] == {"name": "arithmetic", "args": {"min_ops": 4, "max_ops": 6, "operand_max": 3}}
    assert summary["majority_note"] == "" and "Majority vote:" not in text
    assert [r["N"] for r in summary["mc_label_table"]] == [1, 2]
    assert (run / "plots" / "best_of_n.png").stat().st_size > 1000
    for name in ("oracle", "mc", "outcome_heuristic", "orm"):
        assert (run / "prms" / name / "prm_config.json").exists()
    torch.set_num_threads(1)  # the report may have changed it; keep the suite on one thread
