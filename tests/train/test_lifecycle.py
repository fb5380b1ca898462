"""How a run stops and starts again: Ctrl-C and SIGTERM, a full disk, a read-only run directory, a
failure before the first checkpoint, ``--resume --set``; each ends in one line, and the resumed run
reproduces the uninterrupted one."""

from __future__ import annotations

import ctypes
import errno
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from creditrl.config import load_config
from creditrl.errors import ConfigError
from creditrl.train import checkpoint, stages
from creditrl.train.checkpoint import CheckpointWriteError, latest_name, verify_checkpoint
from creditrl.train.lifecycle import RESUMABLE, Interrupted, Signals, checked_resume_config
from creditrl.train.rl import RLTrainer
from small_runs import TINY_RUN

ROOT = Path(__file__).resolve().parents[2]
SIX = [*TINY_RUN, "train.iterations=6", "train.checkpoint_every=2"]


@pytest.fixture(autouse=True)
def _sigint_handled_as_python_sets_it():
    """These tests send SIGINT to this process. A shell that started the suite in the background
    (``make test &`` in a script) leaves SIGINT ignored, and :class:`Signals` keeps an ignored SIGINT
    ignored, as it should for a run: give each test Python's own handler, then put the inherited one back."""
    before = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


def rows(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]


def same_metrics(a: list[dict], b: list[dict]) -> None:
    assert [r["iteration"] for r in a] == [r["iteration"] for r in b]
    for ra, rb in zip(a, b):
        assert sorted(ra) == sorted(rb)
        for key in ra:
            if not key.startswith("time/"):
                assert ra[key] == pytest.approx(rb[key], abs=1e-6), (ra["iteration"], key)


def sets(overrides: list[str]) -> list[str]:
    return [a for s in overrides for a in ("--set", s)]


def cli(*args: str, **kw) -> subprocess.Popen:
    """``creditrl ARGS`` with SIGINT at its default (a shell's ``&`` may have left it ignored)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1", **kw.pop("env", {})}
    return subprocess.Popen(
        [sys.executable, "-m", "creditrl.cli", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=kw.pop("preexec_fn", lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)),
        **kw,
    )


def run_cli(*args: str, timeout: float = 300, **kw) -> tuple[int, str]:
    proc = cli(*args, **kw)
    _, err = proc.communicate(timeout=timeout)
    return proc.returncode, err


def own_lines(err: str) -> list[str]:
    """stderr without the run's two informational lines (start policy, engine)."""
    return [x for x in err.splitlines() if not re.match(r"creditrl: (start policy|engine|resuming) ", x)]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> list[dict]:
    """Six iterations in one go, checkpoints every 2: what every resumed run must reproduce."""
    run = tmp_path_factory.mktemp("full") / "run"
    RLTrainer.from_config(load_config(overrides=SIX), run).run()
    return rows(run)


def signal_during_update(monkeypatch: pytest.MonkeyPatch, at: int, *signums: int) -> None:
    """Send ``signums`` to this process in the middle of iteration ``at``'s update."""
    real, seen = stages.learn, []

    def learn(*args, **kwargs):
        seen.append(1)
        if len(seen) == at:
            for signum in signums:
                os.kill(os.getpid(), signum)
                time.sleep(0.01)  # delivered here, in the main thread, between bytecodes
        return real(*args, **kwargs)

    monkeypatch.setattr(stages, "learn", learn)


# -- Ctrl-C and SIGTERM ------------------------------------------------------------------------------


def test_a_held_signal_waits_for_release_a_second_stops_at_once_and_handlers_come_back() -> None:
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    with Signals() as signals:
        signals.hold()
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.01)  # handled here, and held
        with pytest.raises(Interrupted) as caught:
            signals.release()
        assert (caught.value.signum, caught.value.at_once, caught.value.exit_code) == (signal.SIGTERM, False, 143)
        signals.hold()
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.01)
        with pytest.raises(Interrupted) as caught:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.01)
        assert (caught.value.signum, caught.value.at_once) == (signal.SIGINT, True)
        signals.reset()
        with pytest.raises(Interrupted):  # not holding: at once
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.01)
    assert {s: signal.getsignal(s) for s in before} == before
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with Signals():  # an ignored SIGINT (nohup, a shell's `&`) stays ignored
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, before[signal.SIGINT])


def test_the_math_verify_helper_leaves_ctrl_c_and_sigterm_to_the_trainer(capfd: pytest.CaptureFixture) -> None:
    """A terminal's Ctrl-C reaches the whole process group: the helper neither dies nor prints."""
    from creditrl.tasks.math_verify import _Helper

    helper = _Helper()
    try:
        assert helper.call("match", ("2", "so \\boxed{2}"), 10.0) is True
        for signum in (signal.SIGINT, signal.SIGTERM):
            os.kill(helper._proc.pid, signum)
        time.sleep(0.3)
        assert helper._proc.poll() is None
        assert helper.call("match", ("2", "so \\boxed{3}"), 10.0) is False
    finally:
        helper.close()
    assert "Traceback" not in capfd.readouterr().err


def test_ctrl_c_in_any_command_is_one_line(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    from creditrl.cli import main
    from creditrl.cli import train as train_commands

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(train_commands, "cmd_config", interrupted)
    assert main(["config"]) == 130
    assert capsys.readouterr().err == "creditrl: interrupted\n"


@pytest.mark.slow
def test_a_signal_during_an_update_finishes_that_iteration_checkpoints_it_and_resumes_exactly(
    tmp_path: Path, uninterrupted: list[dict], monkeypatch: pytest.MonkeyPatch
) -> None:
    run = tmp_path / "run"
    signal_during_update(monkeypatch, 3, signal.SIGINT)
    with pytest.raises(Interrupted) as caught:
        RLTrainer.from_config(load_config(overrides=SIX), run).run()
    monkeypatch.undo()
    assert str(caught.value) == (
        f"stopped by SIGINT after iteration 3 of 6; checkpoint iter_000003 written; "
        f"resume with: creditrl train --resume {run}"
    )
    assert caught.value.exit_code == 130
    assert latest_name(run / "checkpoints") == "iter_000003"
    assert verify_checkpoint(run / "checkpoints" / "iter_000003") is None
    assert [r["iteration"] for r in rows(run)] == [0, 1, 2, 3]
    RLTrainer.resume(run).run()
    same_metrics(rows(run), uninterrupted)


@pytest.mark.slow
def test_a_second_signal_abandons_the_iteration_and_the_run_resumes_from_the_last_checkpoint(
    tmp_path: Path, uninterrupted: list[dict], monkeypatch: pytest.MonkeyPatch
) -> None:
    run = tmp_path / "run"
    signal_during_update(monkeypatch, 3, signal.SIGTERM, signal.SIGTERM)
    with pytest.raises(Interrupted) as caught:
        RLTrainer.from_config(load_config(overrides=SIX), run).run()
    monkeypatch.undo()
    assert str(caught.value) == (
        "stopped by SIGTERM during iteration 3 of 6 (abandoned, not saved); the run continues from checkpoint "
        f"iter_000002; resume with: creditrl train --resume {run}"
    )
    assert caught.value.exit_code == 143
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["iter_000002", "latest"]
    RLTrainer.resume(run).run()
    same_metrics(rows(run), uninterrupted)


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_to_creditrl_train_is_one_line_naming_the_resume_command(tmp_path: Path, signum: int) -> None:
    """The command line, signalled as a terminal's Ctrl-C is (the whole process group: the trainer
    and its checker worker) or as ``kill`` does (SIGTERM)."""
    run = tmp_path / "run"
    over = [*TINY_RUN, "train.iterations=400", "train.checkpoint_every=400"]
    proc = cli("train", *sets(over), "--run-dir", str(run), start_new_session=True)  # its own process group
    deadline = time.time() + 120
    while not ((run / "metrics.jsonl").exists() and len(rows(run)) >= 3):
        assert proc.poll() is None and time.time() < deadline, proc.communicate()
        time.sleep(0.02)
    os.killpg(proc.pid, signum) if signum == signal.SIGINT else proc.send_signal(signum)
    _, err = proc.communicate(timeout=120)
    name = signal.Signals(signum).name
    (line,) = own_lines(err)
    found = re.fullmatch(
        rf"creditrl: stopped by {name} after iteration (\d+) of 400; checkpoint (iter_\d+) written; "
        rf"resume with: creditrl train --resume {re.escape(str(run))}",
        line,
    )
    assert found, err
    stopped = int(found.group(1))
    assert proc.returncode == 128 + signum and stopped >= 2 and found.group(2) == f"iter_{stopped:06d}"
    assert [r["iteration"] for r in rows(run)] == list(range(stopped + 1))
    code, err = run_cli("train", "--resume", str(run), "--set", f"train.iterations={stopped + 2}")
    assert code == 0, err[-2000:]
    assert f"creditrl: resuming {run} from checkpoint iter_{stopped:06d} (iteration {stopped})" in err
    assert [r["iteration"] for r in rows(run)] == list(range(stopped + 3))
    assert "Traceback" not in err


# -- a full disk, a read-only run directory ----------------------------------------------------------


@pytest.mark.slow
def test_disk_full_while_writing_a_checkpoint_is_one_error_and_the_run_resumes(
    tmp_path: Path, uninterrupted: list[dict], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The disk fills in the middle of iteration 4's optimizer state: half a file, then ENOSPC."""
    run = tmp_path / "run"
    real = checkpoint.torch.save

    def fills_the_disk(obj, f, *args, **kwargs):
        target = Path(f)
        if target.name == "optimizer.pt" and target.parent.name.startswith("iter_000004."):
            target.write_bytes(b"\0" * 1000)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(obj, f, *args, **kwargs)

    monkeypatch.setattr(checkpoint.torch, "save", fills_the_disk)
    with pytest.raises(CheckpointWriteError) as caught:
        RLTrainer.from_config(load_config(overrides=SIX), run).run()
    monkeypatch.undo()
    assert str(caught.value) == (
        f"cannot write checkpoint {run}/checkpoints/iter_000004: No space left on device; the last intact "
        f"checkpoint is iter_000002; resume with: creditrl train --resume {run}"
    )
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["iter_000002", "latest"]  # no *.tmp
    assert verify_checkpoint(run / "checkpoints" / "iter_000002") is None
    RLTrainer.resume(run).run()
    same_metrics(rows(run), uninterrupted)


def test_a_failed_write_with_the_device_full_is_called_a_full_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torch's zip writer reports a full disk only as ``unexpected pos``: the free space tells."""
    error = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 636608 vs 636500")
    monkeypatch.setattr(checkpoint.shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(100, 100, 0))
    assert str(checkpoint.write_failure(error, tmp_path / "iter_000004")) == (
        f"cannot write checkpoint {tmp_path}/iter_000004: no space left on the device (0 bytes free); "
        "no checkpoint was written before it"
    )
    monkeypatch.setattr(checkpoint.shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(1 << 40, 0, 1 << 40))
    assert str(checkpoint.write_failure(error, tmp_path / "x")).endswith(
        ": RuntimeError: [enforce fail at inline_container.cc:672] . unexpected pos 636608 vs 636500; "
        "no checkpoint was written before it"
    )


@pytest.fixture
def small_tmpfs(tmp_path: Path):
    """A 16 MB tmpfs (as root, where mounting is allowed): room for one tiny checkpoint, not two."""
    where = tmp_path / "disk"
    where.mkdir()
    mount = ["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(where)]
    if os.geteuid() != 0 or not shutil.which("mount") or subprocess.run(mount, capture_output=True).returncode:
        pytest.skip("needs root and a tmpfs mount")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


@pytest.mark.slow
def test_a_real_full_disk_under_creditrl_train_is_one_line_and_resume_completes(
    small_tmpfs: Path, uninterrupted: list[dict]
) -> None:
    run = small_tmpfs / "run"
    code, err = run_cli("train", *sets(SIX), "--run-dir", str(run))
    (line,) = own_lines(err)
    assert code == 2 and re.fullmatch(
        rf"creditrl: error: cannot write checkpoint {re.escape(str(run))}/checkpoints/iter_000004: no space left "
        r"on the device \([\d,]+ bytes free\); the last intact checkpoint is iter_000002; "
        rf"resume with: creditrl train --resume {re.escape(str(run))}",
        line,
    ), err
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["iter_000002", "latest"]
    subprocess.run(["mount", "-o", "remount,size=64m", str(small_tmpfs)], check=True)
    code, err = run_cli("train", "--resume", str(run))
    assert code == 0, err[-2000:]
    same_metrics(rows(run), uninterrupted)


def test_a_full_disk_outside_a_checkpoint_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """metrics.jsonl, the inspector's records: an OSError of a full disk or a read-only file is one line."""
    from creditrl.cli.train import _unwritable

    full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp_path / "metrics.jsonl"))
    assert _unwritable(full, tmp_path) == 2
    assert capsys.readouterr().err == (
        f"creditrl: error: {tmp_path}/metrics.jsonl: No space left on device; run the same command again\n"
    )
    (tmp_path / "checkpoints").mkdir()
    os.symlink("iter_000002", tmp_path / "checkpoints" / "latest")
    assert _unwritable(full, tmp_path) == 2
    assert capsys.readouterr().err.endswith(f"; resume with: creditrl train --resume {tmp_path}\n")
    with pytest.raises(FileNotFoundError):  # not a write failure: the command line's own handling
        _unwritable(FileNotFoundError(errno.ENOENT, "No such file or directory", "x.yaml"), tmp_path)


def _drop_write_override() -> None:
    """As root, lose CAP_DAC_OVERRIDE (from the bounding set, before exec): a mode-555 directory is
    then read-only to this process as it is to any user."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    if os.geteuid() == 0:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(24, 1, 0, 0, 0):  # PR_CAPBSET_DROP, CAP_DAC_OVERRIDE
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


def _can_drop_capabilities() -> bool:
    """CAP_SETPCAP (bit 8) in this process's effective set: root may shrink a child's bounding set."""
    status = Path("/proc/self/status").read_text()
    effective = int(re.search(r"^CapEff:\s*([0-9a-f]+)", status, re.M).group(1), 16)
    return bool(effective >> 8 & 1)


@pytest.mark.parametrize("missing", [False, True])
def test_a_read_only_run_directory_is_one_line(tmp_path: Path, missing: bool) -> None:
    if os.geteuid() == 0 and not _can_drop_capabilities():
        pytest.skip("root without CAP_SETPCAP: a mode-555 directory stays writable")
    parent = tmp_path / "ro"
    parent.mkdir()
    run = parent / "run"
    if not missing:
        run.mkdir()
    (run if not missing else parent).chmod(0o555)
    try:
        code, err = run_cli("train", "--run-dir", str(run), preexec_fn=_drop_write_override, timeout=60)
    finally:
        parent.chmod(0o755)
        run.chmod(0o755) if run.exists() else None
    assert code == 2 and err.splitlines() == [
        f"creditrl: error: cannot write the run directory {run}: Permission denied; choose another --run-dir"
    ], err


# -- failures before the first checkpoint, resuming with --set -----------------------------------------


@pytest.mark.slow
def test_a_run_that_fails_before_its_first_checkpoint_does_not_block_the_same_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = tmp_path / "run"
    config = [*TINY_RUN, "train.iterations=2", "train.checkpoint_every=2"]

    def broken(*args, **kwargs):
        raise ValueError("a reward function's bug")

    monkeypatch.setattr(stages, "learn", broken)
    with pytest.raises(ValueError, match="a reward function's bug"):
        RLTrainer.from_config(load_config(overrides=config), run).run()
    monkeypatch.undo()
    assert sorted(p.name for p in run.iterdir()) == [".lock"]  # no metrics.jsonl, config.yaml, inspect/
    RLTrainer.from_config(load_config(overrides=config), run).run()
    assert [r["iteration"] for r in rows(run)] == [0, 1, 2]


def test_a_config_error_leaves_no_run_directory(tmp_path: Path) -> None:
    run = tmp_path / "run"
    code, err = run_cli("train", "--set", "train.iteratons=2", "--run-dir", str(run), timeout=120)
    assert code == 2 and len(err.splitlines()) == 1 and "'iteratons'" in err, err
    assert not run.exists()


def test_resume_accepts_set_only_for_keys_that_leave_the_trained_iterations_alone(tmp_path: Path) -> None:
    saved = tmp_path / "config.yaml"
    load_config(overrides=SIX).dump(saved)
    cfg = checked_resume_config(saved, ["train.iterations=9", "train.eval_every=3", "train.report_to=tensorboard"])
    assert (cfg.train.iterations, cfg.train.eval_every, cfg.train.report_to) == (9, 3, ["tensorboard"])
    assert checked_resume_config(saved, ["train.seed=0"]).train.seed == 0  # unchanged: allowed
    for key, value in [("optim.lr", "0.5"), ("train.seed", "7"), ("rollout.group_size", "8")]:
        with pytest.raises(ConfigError) as caught:
            checked_resume_config(saved, [f"{key}={value}"])
        assert str(caught.value) == (
            f"--resume: --set {key} would change what the run trains; a resumed run may change only "
            + ", ".join(RESUMABLE)
        )


# -- trackers after a resume -------------------------------------------------------------------------


@pytest.mark.slow
def test_tensorboard_holds_each_iteration_once_after_a_resume(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A crash in iteration 4 after iteration 3 was logged (checkpoint 2): the resumed run replays 3,
    and TensorBoard shows the replayed value, once."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = tmp_path / "run"
    real, calls = stages.learn, []

    def crashes_in_iteration_4(*args, **kwargs):
        calls.append(1)
        if len(calls) == 4:
            raise RuntimeError("killed")
        return real(*args, **kwargs)

    monkeypatch.setattr(stages, "learn", crashes_in_iteration_4)
    config = [*TINY_RUN, "train.iterations=4", "train.checkpoint_every=2", "train.report_to=tensorboard"]
    with pytest.raises(RuntimeError, match="killed"):
        RLTrainer.from_config(load_config(overrides=config), run).run()
    monkeypatch.undo()
    with caplog.at_level(logging.INFO, logger="creditrl"):
        RLTrainer.resume(run).run()
    assert f"creditrl: resuming {run} from checkpoint iter_000002 (iteration 2)" in caplog.messages
    acc = EventAccumulator(str(run / "tensorboard"))
    acc.Reload()
    events = acc.Scalars("reward/mean")
    assert [e.step for e in events] == [1, 2, 3, 4]
    assert [e.value for e in events] == pytest.approx([r["reward/mean"] for r in rows(run)[1:]])
    assert [e.step for e in acc.Scalars("eval/accuracy")] == [0, 2, 4]
