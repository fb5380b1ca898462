"""A run directory belongs to one run: the lock, fresh starts, crashes and resumes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from creditrl.config import load_config
from creditrl.errors import ConfigError
from creditrl.train import checkpoint, rundir
from creditrl.train.checkpoint import latest_name
from creditrl.train.rl import RLTrainer
from small_runs import TINY_RUN

ROOT = Path(__file__).resolve().parents[2]
TINY = TINY_RUN


def rows(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]


def same_metrics(a: list[dict], b: list[dict]) -> None:
    assert [r["iteration"] for r in a] == [r["iteration"] for r in b]
    for ra, rb in zip(a, b):
        assert sorted(ra) == sorted(rb)
        for key in ra:
            if not key.startswith("time/"):
                assert ra[key] == pytest.approx(rb[key], abs=1e-6), (ra["iteration"], key)


def cli(*args: str, **kw) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "creditrl.cli", *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw
    )


def train(run: Path, iterations: int, checkpoint_every: int, *extra: str) -> RLTrainer:
    over = TINY + [f"train.iterations={iterations}", f"train.checkpoint_every={checkpoint_every}", *extra]
    trainer = RLTrainer.from_config(load_config(overrides=over), run)
    trainer.run()
    return trainer


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> list[dict]:
    """Six iterations in one go, checkpoints every 2: what every resumed run must reproduce."""
    run = tmp_path_factory.mktemp("full") / "run"
    train(run, 6, 2)
    return rows(run)


def test_the_lock_is_exclusive_re_entrant_and_names_its_holder(tmp_path: Path) -> None:
    code = "import sys; from creditrl.train.rundir import hold\nwith hold(sys.argv[1]): pass"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    with rundir.hold(tmp_path):
        with rundir.hold(tmp_path):  # the same process again: re-entrant
            assert (tmp_path / rundir.LOCK).read_text().strip() == str(os.getpid())
        other = subprocess.run([sys.executable, "-c", code, str(tmp_path)], env=env, capture_output=True, text=True)
        assert other.returncode == 1
        assert f"{tmp_path} is in use by another run (PID {os.getpid()})" in other.stderr
    # released: another process now takes it
    again = subprocess.run([sys.executable, "-c", code, str(tmp_path)], env=env, capture_output=True, text=True)
    assert again.returncode == 0, again.stderr


def test_two_runs_on_one_directory_one_proceeds_the_other_fails_at_once(tmp_path: Path) -> None:
    run = tmp_path / "run"
    sets = [a for s in TINY + ["train.iterations=80", "train.checkpoint_every=20"] for a in ("--set", s)]
    first = cli("train", *sets, "--run-dir", str(run))
    deadline = time.time() + 120
    while not ((run / rundir.LOCK).exists() and (run / rundir.LOCK).read_text().strip()):
        assert first.poll() is None and time.time() < deadline, first.communicate()
        time.sleep(0.05)
    start = time.time()
    second = cli("train", *sets, "--run-dir", str(run))
    _, err = second.communicate(timeout=120)
    took = time.time() - start
    still_running = first.poll() is None
    _, err_first = first.communicate(timeout=600)
    assert first.returncode == 0, err_first.decode()[-2000:]
    lines = err.decode().strip().splitlines()
    assert second.returncode == 2 and len(lines) == 1, err.decode()
    assert lines[0] == (
        f"creditrl: error: {run} is in use by another run (PID {first.pid}); wait for it to end or choose "
        "another --run-dir"
    )
    assert still_running and took < 10  # refused before torch is even imported, while the first one ran
    assert [r["iteration"] for r in rows(run)] == list(range(81))  # one run's rows, none interleaved


def test_a_new_run_refuses_a_directory_that_holds_one(tmp_path: Path, uninterrupted) -> None:
    run = tmp_path / "run"
    train(run, 2, 2)
    with pytest.raises(ConfigError, match=r"already holds a run .*: continue it with --resume .*--overwrite"):
        train(run, 6, 2)
    assert [r["iteration"] for r in rows(run)] == [0, 1, 2]  # nothing lost
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["iter_000002", "latest"]


def test_overwrite_starts_afresh_and_keeps_other_files(tmp_path: Path, uninterrupted) -> None:
    run = tmp_path / "run"
    train(run, 2, 2)
    (run / "notes.txt").write_text("mine")
    trainer = RLTrainer.from_config(
        load_config(overrides=TINY + ["train.iterations=6", "train.checkpoint_every=2"]), run, overwrite=True
    )
    trainer.run()
    same_metrics(rows(run), uninterrupted)
    assert (run / "notes.txt").read_text() == "mine"


def test_a_run_killed_before_its_first_checkpoint_resumes_from_the_start(tmp_path: Path, uninterrupted) -> None:
    run = tmp_path / "run"
    sets = [a for s in TINY + ["train.iterations=6", "train.checkpoint_every=2"] for a in ("--set", s)]
    slow = [*sets, "--set", "train.iterations=400", "--set", "train.checkpoint_every=400"]
    proc = cli("train", *slow, "--run-dir", str(run))
    deadline = time.time() + 120
    while not ((run / "metrics.jsonl").exists() and len(rows(run)) >= 3):
        assert proc.poll() is None and time.time() < deadline, proc.communicate()
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not list((run / "checkpoints").glob("iter_*")) if (run / "checkpoints").exists() else True
    again = cli("train", *sets, "--run-dir", str(run))
    _, err = again.communicate(timeout=120)
    assert again.returncode == 2 and "already holds a run" in err.decode() and len(err.decode().splitlines()) == 1
    # the saved config is the 400-iteration one; resuming it replays the same first iterations
    config = run / "config.yaml"
    config.write_text(config.read_text().replace("iterations: 400", "iterations: 6").replace("every: 400", "every: 2"))
    resumed = cli("train", "--resume", str(run))
    _, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err.decode()[-2000:]
    assert "has no checkpoint yet; the run starts again from iteration 0" in err.decode()
    same_metrics(rows(run), uninterrupted)


def test_a_kill_during_a_checkpoint_write_resumes_to_the_same_metrics(
    tmp_path: Path, uninterrupted, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = tmp_path / "run"
    real = checkpoint.write_manifest

    def dies_at_iteration_4(path: Path) -> None:
        if ".tmp" in Path(path).name and Path(path).name.startswith("iter_000004"):
            raise KeyboardInterrupt("killed while writing iter_000004")
        real(path)

    monkeypatch.setattr(checkpoint, "write_manifest", dies_at_iteration_4)
    with pytest.raises(KeyboardInterrupt):
        train(run, 6, 2)
    monkeypatch.undo()
    assert [p.name.endswith(".tmp") for p in (run / "checkpoints").iterdir() if p.name.startswith("iter_000004")]
    assert latest_name(run / "checkpoints") == "iter_000002"
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"iteration": 5, "reward/me')  # and a row cut in the middle
    RLTrainer.resume(run).run()
    same_metrics(rows(run), uninterrupted)
    assert not list((run / "checkpoints").glob("*.tmp"))


def test_a_bad_line_before_the_last_is_an_error_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"iteration": 0}\nnot json\n{"iteration": 1}\n')
    with pytest.raises(ConfigError, match=rf"^{path} line 2: not a metrics row"):
        rundir.read_metrics(path)
    path.write_text('{"iteration": 0}\n{"iteration": 1}\n{"itera')
    assert [r["iteration"] for r in rundir.read_metrics(path)] == [0, 1]


def test_metrics_are_rewritten_atomically(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"iteration": 0}\n{"iteration": 1}\n')

    def crash(*a):
        raise OSError("disk gone")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError):
        rundir.write_metrics(path, [{"iteration": 0}])
    assert path.read_text() == '{"iteration": 0}\n{"iteration": 1}\n'  # the old file, whole


def test_the_refusal_comes_before_torch_is_imported(tmp_path: Path) -> None:
    """The command line takes the lock first: a second run fails in the time Python starts."""
    code = (
        "import sys\nfrom creditrl.cli import main\nrc = main(['train', '--run-dir', sys.argv[1]])\n"
        "print(rc, 'torch' in sys.modules)"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    with rundir.hold(tmp_path):
        out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], env=env, capture_output=True, text=True)
    assert out.stdout.split() == ["2", "False"], out.stderr


def test_the_inspect_help_states_the_report_default() -> None:
    from creditrl.cli import build_parser
    from creditrl.inspect.report import MAX_ITERATIONS

    sub = next(a for a in build_parser()._actions if a.dest == "command" or hasattr(a, "choices") and a.choices)
    action = next(a for a in sub.choices["inspect"]._actions if a.dest == "max_iterations")
    assert f"(default {MAX_ITERATIONS})" in action.help
