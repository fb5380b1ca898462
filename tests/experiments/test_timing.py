"""``creditrl compare GRID --timing``: the rotation, the ratio and spread arithmetic, the time
verdict and the readings' clause on hand-made runs; a tiny end-to-end timing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from creditrl.experiments.timing import TimingRun, rotation, time_verdict, timing_markdown, timing_summary, timing_text


def test_rotation_starts_each_round_one_arm_later_and_runs_every_arm_once_per_round():
    assert rotation(["A", "B", "C"], 4) == [["A", "B", "C"], ["B", "C", "A"], ["C", "A", "B"], ["A", "B", "C"]]
    assert rotation(["A", "B"], 1) == [["A", "B"]]
    assert all(sorted(r) == ["A", "B", "C", "D"] for r in rotation(list("ABCD"), 5))
    # every arm is at every position once over len(arms) rounds
    assert {tuple(r[i] for r in rotation(list("ABC"), 3)) for i in range(3)} == {
        ("A", "B", "C"),
        ("B", "C", "A"),
        ("C", "A", "B"),
    }
    with pytest.raises(ValueError, match="at least one arm and one round"):
        rotation([], 3)


def _run(arm: str, r: int, iter_s: float, wall: float = 10.0, cpu: float = 20.0, prm: float = 0.0) -> TimingRun:
    return TimingRun(arm, r, 3, wall, cpu, iter_s, 0.1, prm)


def test_ratio_is_the_median_of_per_round_ratios_with_their_range():
    runs = [
        _run("ref", 0, 1.0, wall=9, cpu=18),
        _run("prm", 0, 3.0, prm=100.0),
        _run("ref", 1, 2.0, wall=11, cpu=22),
        _run("prm", 1, 5.0),
        _run("ref", 2, 1.0, wall=10, cpu=30),
        _run("prm", 2, 2.5),
    ]
    s = timing_summary(runs, "ref")
    assert list(s) == ["ref", "prm"]
    assert s["ref"]["ratio"] == {"median": 1.0, "lo": 1.0, "hi": 1.0}
    assert s["ref"]["iter_s"] == 1.0 and s["ref"]["wall_s"] == 10 and s["ref"]["cpu_s"] == 22
    # per round: 3.0 / 1.0, 5.0 / 2.0, 2.5 / 1.0
    assert s["prm"]["ratio"] == pytest.approx({"median": 2.5, "lo": 2.5, "hi": 3.0})
    assert s["prm"]["iter_s"] == 3.0 and s["prm"]["prm_s"] == 100.0 and s["prm"]["rounds"] == 3
    table = timing_markdown({"reference": "ref", "arms": s})
    assert "| prm | 3 | 3.000 | 2.50x [2.50, 3.00] | 10.0 | 20.0 | 100 |" in table
    with pytest.raises(ValueError, match="no run of the reference arm 'x'"):
        timing_summary(runs, "x")


def test_time_verdict_reads_about_c_as_within_a_factor_of_1_5():
    assert time_verdict({"lo": 2.1, "hi": 4.4}, 3) == "supported"
    assert time_verdict({"lo": 0.9, "hi": 1.4}, 3) == "contradicted"
    assert time_verdict({"lo": 4.6, "hi": 6.0}, 3) == "contradicted"
    assert time_verdict({"lo": 1.5, "hi": 2.5}, 3) == "inconclusive"


def test_a_reading_without_a_controlled_timing_decides_no_time_verdict():
    assert timing_text(None, "prm", "ref", 3) == "no controlled timing yet, so no time verdict"
    result = {
        "reference": "ref",
        "rounds": 3,
        "iterations": 3,
        "arms": {
            "ref": {"ratio": {"median": 1.0, "lo": 1.0, "hi": 1.0}},
            "prm": {"ratio": {"median": 1.2, "lo": 1.1, "hi": 1.3}},
        },
    }
    assert timing_text(result, "other", "ref", 3) == "no controlled timing of other against ref yet, so no time verdict"
    assert timing_text(result, "prm", "ref", 3) == (
        "1.20x [1.10, 1.30] the seconds per iteration in a controlled timing (3 interleaved rounds of 3 "
        "iterations, the PRM's one-off labelling and training apart); against about 3x: contradicted"
    )


def test_a_tiny_timing_of_two_arms_writes_both_with_cpu_seconds_and_ratio_one_for_the_reference(
    tmp_path: Path, monkeypatch
):
    from creditrl.cli import main

    monkeypatch.setenv("CREDITRL_CACHE", str(tmp_path / "cache"))
    grid = tmp_path / "two.yaml"
    grid.write_text(
        "name: two\nbudget: {samples: 100000}\nreference: rloo\narms:\n  grpo: [credit.estimator=grpo]\n"
        "  rloo: [credit.estimator=rloo]\n"
    )
    out, page = tmp_path / "out", tmp_path / "page.md"
    args = ["compare", str(grid), "--quick", "--timing", "--rounds", "1", "--timing-iterations", "1"]
    assert main([*args, "--out", str(out), "--results", str(page), "--threads", "1"]) == 0
    result = json.loads((out / "timing.json").read_text())
    assert result["reference"] == "rloo" and result["rounds"] == 1 and result["iterations"] == 1
    assert set(result["arms"]) == {"grpo", "rloo"}
    assert [r["arm"] for r in result["runs"]] == ["grpo", "rloo"]
    assert all(r["cpu_s"] > 0 and r["iter_s"] > 0 and r["wall_s"] > 0 for r in result["runs"])
    assert result["arms"]["rloo"]["ratio"] == {"median": 1.0, "lo": 1.0, "hi": 1.0}
    assert result["arms"]["grpo"]["cpu_s"] > 0
    assert "| rloo | 1 |" in (out / "timing.md").read_text() and "| rloo | 1 |" in page.read_text()
    assert not [p for p in out.iterdir() if p.is_dir()]  # the runs themselves are not kept


def test_a_readings_timing_placeholder_quotes_the_committed_timing_or_says_there_is_none(tmp_path: Path):
    from creditrl.config import ConfigError
    from creditrl.experiments.finding_files import fill, load_finding, load_timing

    rows = [{"arm": "PRM, MC labels"}, {"arm": "sequence + GAE"}]
    text = "Controlled: {timing:PRM_MC_labels/sequence_GAE.ratio}."
    finding = {"timing": "findings/timing/t.json"}
    assert load_timing(finding, tmp_path) is None  # named, not committed yet
    assert fill(text, rows, time_claim=3) == "Controlled: no controlled timing yet, so no time verdict."
    (tmp_path / "findings" / "timing").mkdir(parents=True)
    result = {
        "reference": "sequence + GAE",
        "rounds": 3,
        "iterations": 3,
        "arms": {"PRM, MC labels": {"ratio": {"median": 2.9, "lo": 2.5, "hi": 3.4}}},
    }
    (tmp_path / "findings" / "timing" / "t.json").write_text(json.dumps(result))
    timing = load_timing(finding, tmp_path)
    assert fill(text, rows, timing=timing, time_claim=3).endswith("against about 3x: supported.")
    with pytest.raises(ValueError, match="a controlled timing gives 'ratio' only"):
        fill("{timing:PRM_MC_labels/sequence_GAE.final}", rows, timing=timing)
    bad = tmp_path / "f.yaml"
    bad.write_text("id: X\ntitle: t\nquestion: q\nreading: r\ngrid: g.yaml\ntime_claim: fast\n")
    with pytest.raises(ConfigError, match="key 'time_claim' must be a positive number"):
        load_finding(bad)


def test_timed_runs_evaluate_only_a_few_problems_whatever_the_grid_says(tmp_path: Path, monkeypatch):
    from creditrl.experiments import timing

    seen: list[list[str]] = []

    def fake_run(base, overrides, where):
        seen.append(list(overrides))
        return 1.0, 1.0, {"time/total_s": 2.0, "prm_s": 0.0}

    monkeypatch.setattr(timing, "_one_run", fake_run)
    grid = tmp_path / "g.yaml"
    grid.write_text("name: g\nset: [train.eval_size=1024]\nbudget: {samples: 100}\ninit: policy\narms:\n  a: []\n")
    timing.run_timing(grid, tmp_path / "out", rounds=1, iterations=2, log=lambda _: None)
    (overrides,) = seen
    assert overrides.index("train.eval_size=1024") < overrides.index(f"train.eval_size={timing.EVAL_SIZE}")
    assert timing.EVAL_SIZE == 16
