"""Checkpoints you can trust: a manifest of checksums written last, verified on resume, with a
fallback to the newest intact checkpoint."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest

from creditrl.config import load_config
from creditrl.errors import ConfigError
from creditrl.train.checkpoint import MANIFEST, latest_name, resume_checkpoint, verify_checkpoint
from creditrl.train.rl import RLTrainer
from small_runs import TINY_RUN

TINY = [*TINY_RUN, "train.iterations=6", "train.checkpoint_every=2"]
FILES = [
    "model.safetensors",
    "config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "optimizer.pt",
    "rng.pt",
    "extra.pt",
    "trainer_state.json",
    MANIFEST,
]


def rows(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A finished six-iteration run with checkpoints at 2, 4 and 6."""
    run = tmp_path_factory.mktemp("ckpt") / "run"
    RLTrainer.from_config(load_config(overrides=TINY), run).run()
    return run


def damage(path: Path, how: str) -> None:
    data = path.read_bytes()
    if how == "flip":  # 4 KB in the middle (or all of a small file) overwritten
        mid, n = len(data) // 2, min(4096, max(1, len(data) // 2))
        path.write_bytes(data[:mid] + bytes(b ^ 0xFF for b in data[mid : mid + n]) + data[mid + n :])
    elif how == "truncate":
        path.write_bytes(data[: len(data) // 2])
    else:
        path.unlink()


def test_every_checkpoint_has_a_manifest_of_its_files(finished: Path) -> None:
    ckpt = finished / "checkpoints" / "iter_000006"
    entries = json.loads((ckpt / MANIFEST).read_text())["files"]
    on_disk = sorted(str(p.relative_to(ckpt)) for p in ckpt.rglob("*") if p.is_file() and p.name != MANIFEST)
    assert sorted(entries) == on_disk and set(FILES) - {MANIFEST} <= set(entries)
    assert all(len(e["sha256"]) == 64 and e["bytes"] == (ckpt / n).stat().st_size for n, e in entries.items())
    assert verify_checkpoint(ckpt) is None


@pytest.mark.parametrize("how", ["flip", "truncate", "delete"])
@pytest.mark.parametrize("name", FILES)
def test_damage_to_any_file_is_found_and_the_previous_checkpoint_used(
    finished: Path, tmp_path: Path, name: str, how: str, caplog: pytest.LogCaptureFixture
) -> None:
    ckpts = tmp_path / "checkpoints"
    shutil.copytree(finished / "checkpoints", ckpts, symlinks=True)
    damage(ckpts / "iter_000006" / name, how)
    problem = verify_checkpoint(ckpts / "iter_000006")
    assert problem is not None and problem.startswith(name), problem
    with caplog.at_level(logging.WARNING, logger="creditrl"):
        assert resume_checkpoint(ckpts) == ckpts / "iter_000004"
    warned = [r.getMessage() for r in caplog.records]
    assert any("iter_000006 is damaged: " + name in m for m in warned), warned
    assert any("resuming from iter_000004 instead" in m for m in warned), warned


def test_no_intact_checkpoint_is_a_one_line_error_listing_them(finished: Path, tmp_path: Path) -> None:
    ckpts = tmp_path / "checkpoints"
    shutil.copytree(finished / "checkpoints", ckpts, symlinks=True)
    for name in ("iter_000002", "iter_000004", "iter_000006"):
        damage(ckpts / name / "optimizer.pt", "truncate")
    with pytest.raises(ConfigError) as err:
        resume_checkpoint(ckpts)
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"{ckpts}: no intact checkpoint to resume from: ")
    assert message.count("optimizer.pt: ") == 3 and "iter_000006 (optimizer.pt" in message


def test_latest_naming_a_missing_folder_falls_back_to_the_newest_iteration(finished: Path, tmp_path: Path) -> None:
    ckpts = tmp_path / "checkpoints"
    shutil.copytree(finished / "checkpoints", ckpts, symlinks=True)
    shutil.rmtree(ckpts / "iter_000006")
    assert latest_name(ckpts) == "iter_000006"
    assert resume_checkpoint(ckpts) == ckpts / "iter_000004"
    (ckpts / "iter_000005.abc.tmp").mkdir()  # a partial write is never a candidate
    (ckpts / "iter_000004.old").mkdir()
    assert resume_checkpoint(ckpts) == ckpts / "iter_000004"
    assert resume_checkpoint(tmp_path / "none") is None


def test_a_checkpoint_from_before_manifests_is_taken_as_it_is(finished: Path, tmp_path: Path) -> None:
    ckpt = tmp_path / "iter_000002"
    shutil.copytree(finished / "checkpoints" / "iter_000002", ckpt)
    (ckpt / MANIFEST).unlink()
    assert verify_checkpoint(ckpt) == "manifest.json: missing"  # its state file says it had one
    state = json.loads((ckpt / "trainer_state.json").read_text())
    del state["checksums"]
    (ckpt / "trainer_state.json").write_text(json.dumps(state))
    assert verify_checkpoint(ckpt) is None
    (ckpt / "trainer_state.json").unlink()
    assert verify_checkpoint(ckpt) == "no manifest.json and no readable trainer_state.json"


def test_resume_past_a_damaged_checkpoint_gives_the_same_metrics(finished: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(finished, run, symlinks=True)
    (run / ".lock").unlink(missing_ok=True)
    damage(run / "checkpoints" / "iter_000006" / "model.safetensors", "flip")  # silent before manifests
    trainer = RLTrainer.resume(run)
    assert trainer.start_iteration == 4
    trainer.run()
    a, b = rows(finished), rows(run)
    assert [r["iteration"] for r in b] == list(range(7))
    for ra, rb in zip(a, b):
        for key in ra:
            if not key.startswith("time/"):
                assert ra[key] == pytest.approx(rb[key], abs=1e-6), (ra["iteration"], key)
    assert verify_checkpoint(run / "checkpoints" / "iter_000006") is None  # written again, intact
