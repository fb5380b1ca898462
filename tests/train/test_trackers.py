"""Experiment trackers (train.report_to): TensorBoard event files and a wandb offline run directory
hold the run's metrics under their metrics.jsonl names; plain progress lines off a terminal."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from creditrl.config import load_config
from creditrl.errors import ConfigError
from creditrl.train import trackers
from creditrl.train.rl import RLTrainer
from small_runs import MINI_RUN

ROOT = Path(__file__).resolve().parents[2]
RUN = [
    *MINI_RUN,
    "train.init=policy",
    "train.iterations=2",
    "train.eval_every=2",
    "train.checkpoint_every=2",
]


def rows(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def test_report_to_takes_trls_forms() -> None:
    assert load_config(overrides=RUN + ["train.report_to=tensorboard,wandb"]).train.report_to == [
        "tensorboard",
        "wandb",
    ]
    assert load_config(overrides=RUN + ["train.report_to=none"]).train.report_to == []
    assert load_config(overrides=RUN + ["train.report_to=[wandb]"]).train.report_to == ["wandb"]


def test_tensorboard_event_files_hold_the_metrics(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = tmp_path / "run"
    RLTrainer.from_config(load_config(overrides=RUN + ["train.report_to=tensorboard"]), run).run()
    acc = EventAccumulator(str(run / "tensorboard"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    got = rows(run)
    assert {"reward/mean", "eval/accuracy", "time/rollout_s", "policy/entropy"} <= tags
    assert [e.step for e in acc.Scalars("reward/mean")] == [1, 2]
    assert [e.value for e in acc.Scalars("reward/mean")] == pytest.approx([r["reward/mean"] for r in got[1:]])
    assert [e.step for e in acc.Scalars("eval/accuracy")] == [0, 2]
    assert any("config" in tag for tag in acc.Tags()["tensors"])  # the config, as text


def test_wandb_offline_writes_its_run_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    run = tmp_path / "run"
    RLTrainer.from_config(load_config(overrides=RUN + ["train.report_to=wandb"]), run).run()
    runs = list((run / "wandb").glob("offline-run-*"))
    assert len(runs) == 1
    (data,) = list(runs[0].glob("*.wandb"))  # its records (protobuf: keys are stored as written)
    # wandb's service process writes the records behind finish(): wait for them, within a bound
    deadline = time.monotonic() + 60
    while b"time/rollout_s" not in data.read_bytes() and time.monotonic() < deadline:
        time.sleep(0.2)
    raw = data.read_bytes()
    for key in ("reward/mean", "eval/accuracy", "policy/entropy", "time/rollout_s"):
        assert key.encode() in raw, key
    assert b"group_size" in raw and b"estimator" in raw  # the run's config as hyperparameters


def test_a_missing_tracker_library_is_one_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "mlflow" else real(name, *a))
    with pytest.raises(ConfigError, match=r"^train.report_to: 'mlflow' needs the 'mlflow' package: pip install mlflow"):
        trackers.make_trackers(["mlflow"], tmp_path, {})
    with pytest.raises(ConfigError, match="unknown tracker 'comet'; valid: none, tensorboard, wandb, mlflow, trackio"):
        trackers.make_trackers(["comet"], tmp_path, {})


def test_progress_off_a_terminal_is_plain_lines(tmp_path: Path) -> None:
    sets = [a for s in RUN + ["train.progress=true"] for a in ("--set", s)]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    out = subprocess.run(
        [sys.executable, "-m", "creditrl.cli", "train", *sets, "--run-dir", str(tmp_path / "run")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    lines = [x for x in out.stdout.splitlines() if x.startswith("creditrl: iteration")]
    assert len(lines) == 2
    assert lines[0].startswith("creditrl: iteration 1/2, reward ") and "held-out accuracy" in lines[1]
    assert "\r" not in out.stdout + out.stderr


def test_sft_progress_off_a_terminal_is_plain_lines(tmp_path: Path) -> None:
    steps = ["task.args={min_ops: 1, max_ops: 2, operand_max: 3}", "sft.steps=6", "sft.batch_size=2"]
    sets = [a for s in [*steps, "train.eval_size=2", "train.progress=true"] for a in ("--set", s)]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1", "CREDITRL_CACHE": str(tmp_path)}
    out = subprocess.run(
        [sys.executable, "-m", "creditrl.cli", "sft", *sets], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    lines = [x for x in out.stderr.splitlines() if x.startswith("creditrl: sft step")]
    assert [x.split(",")[0] for x in lines] == [f"creditrl: sft step {n}/6" for n in range(1, 7)]
    assert "\r" not in out.stdout + out.stderr


def test_log_completions_writes_each_iterations_sample_to_the_run_and_tensorboard(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = tmp_path / "run"
    sets = ["train.report_to=tensorboard", "train.log_completions=2", "train.inspect_every=1"]
    RLTrainer.from_config(load_config(overrides=RUN + sets), run).run()
    logged = [json.loads(x) for x in (run / "completions.jsonl").read_text().splitlines()]
    assert [c["iteration"] for c in logged] == [1, 1, 2, 2]
    for it, row in zip([1, 2], rows(run)[1:]):
        record = json.loads((run / "inspect" / f"iter_{it:06d}.json").read_text())  # every group of the batch
        responses = {r["row"]: (g, r) for g in record["groups"] for r in g["responses"]}
        assert len(responses) == record["batch_size"] == 4
        # the inspector's per-row sequence rewards are the ones reward/mean averages
        assert sum(sum(r["rewards"]) for _, r in responses.values()) / 4 == pytest.approx(row["reward/mean"], abs=1e-6)
        sample = [c for c in logged if c["iteration"] == it]
        assert [c["group"] for c in sample] == [0, 1]  # the first row of each of the first two groups
        for c in sample:
            group, response = responses[c["row"]]
            assert c["row"] == min(r["row"] for r in group["responses"])
            assert c["reward"] == pytest.approx(sum(response["rewards"]), abs=1e-6)
            trained = [a for i, a in enumerate(response["adv"]) if i not in response["masked"]]
            assert c["advantage"] == pytest.approx(sum(trained) / len(trained), abs=1e-6)
            assert c["prompt"] == group["prompt"] and c["prompt"]
    acc = EventAccumulator(str(run / "tensorboard"))
    acc.Reload()
    events = acc.Tensors("completions/text_summary")
    assert [e.step for e in events] == [1, 2]
    for e in events:
        table = e.tensor_proto.string_val[0].decode()
        lines = table.splitlines()
        assert lines[0] == "| iteration | row | group | reward | advantage | prompt | completion |"
        assert len(lines) == 4 and all(x.startswith(f"| {e.step} | ") for x in lines[2:])


def test_completions_are_the_first_rows_of_the_groups_in_order() -> None:
    from creditrl.train.metrics import first_rows

    groups = torch.tensor([3, 3, 3, 1, 1, 7])
    assert first_rows(groups, 2) == [0, 3]
    assert first_rows(groups, 4) == [0, 3, 5, 1]  # then each group's second row
    assert first_rows(groups, 10) == [0, 3, 5, 1, 4, 2]
    assert first_rows(groups, 0) == []


def test_completion_tables_keep_one_row_per_completion() -> None:
    sample = {"iteration": 3, "row": 0, "group": 0, "reward": 0.123456, "advantage": -1.0, "prompt": "1+2="}
    table = trackers.markdown_table([{**sample, "completion": "a|b\nc"}])
    assert table.splitlines()[2] == "| 3 | 0 | 0 | 0.1235 | -1 | 1+2= | a\\|b<br>c |"

    import wandb

    logged = []
    wb = trackers.Wandb.__new__(trackers.Wandb)  # without wandb.init: a run that records its log calls
    wb.wandb = wandb
    wb.run = type("Run", (), {"log": lambda self, data, step: logged.append((data, step))})()
    wb.log_completions(3, [{**sample, "completion": "3"}])
    ((data, step),) = logged
    assert step == 3 and data["completions"].columns == list(trackers.COMPLETION_COLUMNS)
    assert data["completions"].data == [[3, 0, 0, 0.123456, -1.0, "1+2=", "3"]]


def test_a_resume_drops_the_completions_of_the_iterations_it_replays(tmp_path: Path) -> None:
    trainer = RLTrainer.__new__(RLTrainer)  # only what _restart reads: the run directory and the checkpoint's iteration
    trainer.run_dir, trainer.start_iteration = tmp_path, 1
    for name in ("metrics.jsonl", "completions.jsonl"):
        (tmp_path / name).write_text("".join(json.dumps({"iteration": i}) + "\n" for i in (0, 1, 1, 2, 2)))
    trainer._restart()
    kept = [json.loads(x)["iteration"] for x in (tmp_path / "completions.jsonl").read_text().splitlines()]
    assert kept == [0, 1, 1]
