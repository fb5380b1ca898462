"""The demo's outputs (quick mode) and the summary arithmetic behind its table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from creditrl.cli import main
from creditrl.experiments.report import markdown_table, summarise


def test_summarise_reads_before_after_and_samples_to_target() -> None:
    history = [
        {
            "iteration": 0,
            "samples/total": 0,
            "tokens/total": 0,
            "time/total_s": 0.0,
            "eval/accuracy": 0.20,
            "eval/step_accuracy": 0.5,
        },
        {"iteration": 1, "samples/total": 100, "tokens/total": 900, "time/total_s": 1.0},
        {
            "iteration": 2,
            "samples/total": 200,
            "tokens/total": 1800,
            "time/total_s": 2.0,
            "eval/accuracy": 0.31,
            "eval/step_accuracy": 0.6,
        },
        {
            "iteration": 3,
            "samples/total": 300,
            "tokens/total": 2700,
            "time/total_s": 3.5,
            "eval/accuracy": 0.28,
            "eval/step_accuracy": 0.55,
        },
    ]
    s = summarise("arm", history, target=0.30)
    assert (s.before_accuracy, s.after_accuracy, s.best_accuracy) == (0.20, 0.28, 0.31)
    assert s.samples_to_target == 200 and s.samples == 300 and s.tokens == 2700 and s.wall_s == 3.5
    assert s.gain_points == pytest.approx(8.0)
    assert summarise("arm", history, target=0.5).samples_to_target is None
    table = markdown_table([s], 0.30)
    assert "| arm | 20.0% | 28.0% | +8.0 | 31.0% | 50.0% | 55.0% | 200 | 300 | 2,700 | 4 s |" in table
    assert "not reached" in markdown_table([summarise("arm", history, target=0.5)], 0.5)


def test_quick_demo_writes_every_output(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.setenv("CREDITRL_CACHE", str(tmp_path / "cache"))
    run = tmp_path / "demo"
    assert main(["demo", "--quick", "--run-dir", str(run), "--set", "train.progress=false"]) == 0
    out = capsys.readouterr().out
    assert "outcome + grpo" in out and "oracle steps + grpo_process" in out
    png = run / "plots" / "accuracy_vs_samples.png"
    assert png.exists() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    report = (run / "report.md").read_text()
    assert "Quick mode" in report and "| outcome + grpo |" in report
    summary = json.loads((run / "summary.json").read_text())
    assert [a["name"] for a in summary["arms"]] == ["outcome + grpo", "oracle steps + grpo_process"]
    for arm in summary["arms"]:
        assert arm["samples"] == 3 * 4 * 4  # iterations x prompts x group size, equal per arm
    for arm_dir in ("outcome_grpo", "oracle_steps_grpo_process"):
        rows = [json.loads(x) for x in (run / arm_dir / "metrics.jsonl").read_text().splitlines()]
        assert [r["iteration"] for r in rows] == [0, 1, 2, 3]
        assert (run / arm_dir / "config.yaml").exists()
    # the final check: the SFT start and each arm's last checkpoint on 32 held-out problems, paired
    final = summary["final_eval"]
    assert [r["checkpoint"] for r in final] == ["SFT start", "outcome + grpo", "oracle steps + grpo_process"]
    assert all(r["n"] == 32 for r in final) and final[0]["diff"] is None
    for r in final[1:]:
        assert r["diff"] == pytest.approx(r["accuracy"] - final[0]["accuracy"])
    assert "Greedy held-out exact match on 32 problems" in report and "| SFT start |" in report
    # ... with where each one's solutions first go wrong: every problem counted once
    for r in final:
        assert sum(r["errors"].values()) == 32 and r["errors"]["correct"] == round(r["accuracy"] * 32)
    assert "Where greedy solutions first go wrong" in report and "| slip multi digit |" in report


def test_cli_rejects_unknown_estimator_with_valid_names(capsys) -> None:
    assert main(["train", "--set", "credit.estimator=ppo"]) == 2
    err = capsys.readouterr().err
    assert "credit.estimator: unknown value 'ppo'" in err and "grpo_process" in err and "rloo" in err


def test_cli_rejects_unknown_key(capsys) -> None:
    assert main(["train", "--set", "optim.learning_rate=1"]) == 2
    err = capsys.readouterr().err
    assert "unknown key 'learning_rate' in section 'optim'" in err and "lr" in err


def test_demo_uses_operands_1_to_3_and_arith_keeps_the_measured_sft_key() -> None:
    from creditrl.config import load_config
    from creditrl.config.loader import arith_config_path, demo_config_path
    from creditrl.tasks import make_task
    from creditrl.train.sft import sft_key

    demo, quick, arith = (
        load_config(p) for p in (demo_config_path(False), demo_config_path(True), arith_config_path(False))
    )
    for cfg in (demo, quick):  # SFT and RL both on operands 1-3, RL on 4-6 operations
        assert cfg.task.args["operand_max"] == 3 and cfg.sft.task_args["operand_max"] == 3
        assert (cfg.task.args["min_ops"], cfg.task.args["max_ops"]) == (4, 6)
    problems = make_task(demo.task.name, **demo.task.args).sample(64, split="heldout", seed=0)
    assert max(max(map(int, p.prompt[:-1].replace("*", "+").replace("-", "+").split("+"))) for p in problems) == 3
    # arith.yaml is the demo's config as it was until 2026-11-30: every finding, report and bench
    # number was measured from the SFT checkpoint cached under this key
    assert make_task(arith.task.name, **arith.task.args).config.operand_max == 9
    assert sft_key(arith) == "08812f9fefa79ea7"
    assert sft_key(demo) != sft_key(arith)


def test_demo_takes_another_config_but_not_with_quick(tmp_path: Path, capsys) -> None:
    from creditrl.config.loader import arith_config_path

    assert main(["demo", str(arith_config_path(False)), "--quick", "--run-dir", str(tmp_path / "d")]) == 2
    assert "give a config or --quick, not both" in capsys.readouterr().err
    assert main(["demo", str(tmp_path / "nope.yaml"), "--run-dir", str(tmp_path / "d")]) == 2
    err = capsys.readouterr().err
    assert "config file not found" in err and "nope.yaml" in err
    assert not (tmp_path / "d").exists()  # nothing written before the config is known
