"""``python -m studies.scheduled_sampling``: the table's numbers from its measurements, and a rerun that
reads every start and run back from the kept summaries."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from studies.scheduled_sampling import exposure_markdown, run_exposure_report


def test_the_table_is_the_means_and_paired_differences_of_the_measurements() -> None:
    start = lambda tf, fr, acc: {"tf_step_accuracy": tf, "free_step_accuracy": fr, "gap": tf - fr, "accuracy": acc}  # noqa: E731
    summary = {
        "starts": {
            "plain SFT": [start(0.9, 0.5, 0.2), start(0.8, 0.5, 0.3)],
            "scheduled sampling": [start(0.9, 0.6, 0.3), start(0.8, 0.7, 0.3)],
        },
        "finals": {
            "plain SFT": {"outcome GRPO": [0.3, 0.4], "process GRPO": [0.4, 0.4]},
            "scheduled sampling": {"outcome GRPO": [0.3, 0.5], "process GRPO": [0.5, 0.5]},
        },
    }
    md = exposure_markdown(summary)
    plain, mixed, paired = md.strip().splitlines()[2:]
    # t(1 dof) = 12.706: half-width 12.70620 * sd / sqrt(2); tf 0.9 and 0.8: sd 0.0707 -> 63.5 points
    assert plain.startswith("| plain SFT | 85.0 ± 63.5% | 50.0 ± 0.0% | 35.0 ± 63.5% | 25.0 ± 63.5% | 35.0 ± 63.5%")
    assert mixed.startswith("| scheduled sampling | 85.0 ± 63.5% | 65.0 ± 63.5% | 20.0 ± 127.1% | 30.0 ± 0.0%")
    # paired: free-running +0.1 and +0.2 -> +15.0 ± 63.5; gap -0.1, -0.2; process GRPO +0.1, +0.1
    assert "| +0.0 ± 0.0 points | +15.0 ± 63.5 points | -15.0 ± 63.5 points |" in paired
    assert paired.endswith("| +5.0 ± 63.5 points | +10.0 ± 0.0 points |")


def test_a_rerun_reads_every_start_and_run_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from creditrl.experiments import launch
    from studies import scheduled_sampling

    monkeypatch.setenv("CREDITRL_CACHE", str(tmp_path / "cache"))
    kept = tmp_path / "kept"
    first = run_exposure_report(tmp_path / "a", quick=True, seeds=1, summaries=kept)
    starts = sorted(p.relative_to(kept).as_posix() for p in kept.rglob("*.json"))
    assert starts == [
        "plain_SFT/outcome_GRPO/seed0.json",
        "plain_SFT/process_GRPO/seed0.json",
        "plain_SFT/start_seed0.json",
        "scheduled_sampling/outcome_GRPO/seed0.json",
        "scheduled_sampling/process_GRPO/seed0.json",
        "scheduled_sampling/start_seed0.json",
    ]
    measured = json.loads((kept / "scheduled_sampling" / "start_seed0.json").read_text())
    assert measured["gap"] == pytest.approx(measured["tf_step_accuracy"] - measured["free_step_accuracy"])
    assert Path(measured["init"]).is_dir() and measured["init"] != first["starts"]["plain SFT"][0]["init"]

    def no_training(*a, **k):
        raise AssertionError("something trained")

    monkeypatch.setattr(launch, "_run_one", no_training)
    monkeypatch.setattr(scheduled_sampling, "_sft_start", no_training)
    again = run_exposure_report(tmp_path / "b", quick=True, seeds=1, summaries=kept)
    assert again["starts"] == first["starts"] and again["finals"] == first["finals"]
