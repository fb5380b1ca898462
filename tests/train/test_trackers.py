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
