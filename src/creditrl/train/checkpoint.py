"""Checkpoints written atomically and verified when read.

A checkpoint directory holds the HF model and tokenizer (``save_pretrained``), the optimizer
state, the RNG states, ``trainer_state.json`` and, written last, ``manifest.json``: the size and
SHA-256 of every other file. It is written in a temporary directory first, then renamed, so a
crash while writing leaves at most a ``*.tmp`` directory behind, never a half-written checkpoint
under the final name.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from creditrl.errors import ConfigError

LATEST = "latest"
MANIFEST = "manifest.json"
LOW_SPACE = 1 << 20  # bytes: less free space than this after a failed write reads as a full disk
WRITE_ERRORS = (OSError, RuntimeError, SafetensorError)  # a failed write (RuntimeError: torch's zip writer)
log = logging.getLogger("creditrl")


class CheckpointWriteError(ConfigError):
    """A checkpoint could not be written; the ones written before it are intact."""


def _why_unwritten(exc: BaseException, where: Path) -> str:
    """Why a write into ``where`` failed: the errno's text, else a full disk (torch's zip writer
    and safetensors say so only as ``unexpected pos ...`` or ``I/O error``), else the error itself."""
    if isinstance(exc, OSError) and exc.errno:
        return os.strerror(exc.errno)
    try:
        free = shutil.disk_usage(where).free
    except OSError:
        free = None
    if free is not None and free < LOW_SPACE:
        return f"no space left on the device ({free:,} bytes free)"
    first = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {first[0] if first else ''}"


def write_failure(exc: BaseException, path: Path) -> CheckpointWriteError:
    """The one-line error of a failed write of checkpoint ``path``, naming the last intact one."""
    intact = latest_name(path.parent) if path.parent.is_dir() else None
    last = f"the last intact checkpoint is {intact}" if intact else "no checkpoint was written before it"
    return CheckpointWriteError(f"cannot write checkpoint {path}: {_why_unwritten(exc, path.parent)}; {last}")


def rng_state() -> dict[str, Any]:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def save_checkpoint(
    path: Path,
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    optimizer: torch.optim.Optimizer | None,
    state: dict[str, Any],
    extra: dict[str, Any] | None = None,
    files: dict[str, str] | None = None,
    rng: dict[str, Any] | None = None,
) -> Path:
    """Write a checkpoint to ``path`` atomically (replacing an older one of the same name).

    ``extra`` holds further training state (critic weights and optimizer, calibrator) in
    ``extra.pt``; ``files`` are further small text files (name -> content), e.g. a LoRA
    checkpoint's base-model pointer; ``rng`` the RNG states to save (default: the current ones).

    Raises:
        CheckpointWriteError: The write failed (a full disk, an unwritable directory); its
            temporary directory is gone and an older checkpoint of the same name stays.
    """
    path, tmp = Path(path), None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent))
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        if optimizer is not None:
            torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
        torch.save(rng or rng_state(), tmp / "rng.pt")
        if extra:
            torch.save(extra, tmp / "extra.pt")
        (tmp / "trainer_state.json").write_text(json.dumps({**state, "checksums": MANIFEST}, indent=2))
        for name, text in (files or {}).items():
            (tmp / name).write_text(text)
        write_manifest(tmp)
    except WRITE_ERRORS as exc:
        failure = write_failure(exc, path)  # before the partial files go: the free space they took tells
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        raise failure from exc
    if path.exists():
        old = path.with_name(path.name + ".old")
        shutil.rmtree(old, ignore_errors=True)
        os.rename(path, old)
        os.rename(tmp, path)
        shutil.rmtree(old)
    else:
        os.rename(tmp, path)
    return path


def mark_latest(checkpoints_dir: Path, name: str) -> None:
    """Point ``checkpoints/latest`` at ``name``: a relative symlink (so ``from_pretrained`` loads
    ``checkpoints/latest``), replaced atomically."""
    tmp = Path(checkpoints_dir) / (LATEST + ".tmp")
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    os.symlink(name, tmp)
    os.replace(tmp, Path(checkpoints_dir) / LATEST)


def latest_name(checkpoints_dir: Path) -> str | None:
    """The folder name ``checkpoints/latest`` points at: its symlink's target, or, in a run from
    before the symlink, the name the file holds; None without one."""
    marker = Path(checkpoints_dir) / LATEST
    if marker.is_symlink():
        return os.readlink(marker)
    return marker.read_text().strip() if marker.is_file() else None


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def write_manifest(path: Path) -> None:
    """``manifest.json`` in checkpoint ``path``: the size and SHA-256 of each of its other files,
    written last (to a temporary name, then renamed)."""
    files = sorted(f for f in Path(path).rglob("*") if f.is_file() and f.name not in (MANIFEST, MANIFEST + ".tmp"))
    entries = {str(f.relative_to(path)): {"bytes": f.stat().st_size, "sha256": _sha256(f)} for f in files}
    tmp = Path(path) / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps({"files": entries}, indent=1))
    os.replace(tmp, Path(path) / MANIFEST)


def verify_checkpoint(path: Path) -> str | None:
    """``None`` when every file of checkpoint ``path`` matches its manifest, else what is wrong
    with the first damaged file (a checkpoint from before manifests is taken as it is)."""
    path = Path(path)
    manifest = path / MANIFEST
    if not path.is_dir():
        return "missing"
    if not manifest.exists():  # a checkpoint from before manifests has a state file that names none
        try:
            names_one = "checksums" in json.loads((path / "trainer_state.json").read_text())
        except (OSError, ValueError, TypeError):
            return f"no {MANIFEST} and no readable trainer_state.json"
        return f"{MANIFEST}: missing" if names_one else None
    try:
        entries = json.loads(manifest.read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return f"{MANIFEST}: unreadable"
    for name, want in entries.items():
        f = path / name
        if not f.is_file():
            return f"{name}: missing"
        size = f.stat().st_size
        if size != want["bytes"]:
            return f"{name}: {size:,} bytes, the manifest says {want['bytes']:,}"
        if _sha256(f) != want["sha256"]:
            return f"{name}: checksum mismatch"
    return None


def _iteration_of(path: Path) -> int:
    """N of a checkpoint folder ``iter_N``; -1 for any other name (``*.tmp``, ``*.old``)."""
    m = re.fullmatch(r"iter_(\d+)", path.name)
    return int(m.group(1)) if m else -1


def latest_checkpoint(checkpoints_dir: Path) -> Path | None:
    """The folder ``checkpoints/latest`` names, when it exists (unverified)."""
    name = latest_name(checkpoints_dir)
    if name is None:
        return None
    path = Path(checkpoints_dir) / name
    return path if path.exists() else None


def resume_checkpoint(checkpoints_dir: Path) -> Path | None:
    """The newest intact checkpoint in ``checkpoints_dir``: the one ``latest`` names, else the
    newest ``iter_*``; each damaged one passed over with a one-line warning naming the damaged
    file. ``None`` when there is no checkpoint at all; :class:`ConfigError` when none is intact."""
    ckpts = Path(checkpoints_dir)
    found = sorted((p for p in ckpts.glob("iter_*") if p.is_dir() and _iteration_of(p) >= 0), key=_iteration_of)
    latest = latest_checkpoint(ckpts)
    candidates = ([latest] if latest is not None else []) + [p for p in reversed(found) if p != latest]
    if not candidates:
        return None
    damaged = []
    for path in candidates:
        problem = verify_checkpoint(path)
        if problem is None:
            if damaged:
                log.warning("creditrl: resuming from %s instead", path.name)
            return path
        damaged.append(f"{path.name} ({problem})")
        log.warning("creditrl: checkpoint %s is damaged: %s", path, problem)
    raise ConfigError(f"{ckpts}: no intact checkpoint to resume from: {'; '.join(damaged)}")


def load_training_state(path: Path, optimizer: torch.optim.Optimizer | None) -> dict[str, Any]:
    """Restore optimizer and RNG state from a checkpoint; return its trainer_state.json."""
    path = Path(path)
    if optimizer is not None:
        optimizer.load_state_dict(torch.load(path / "optimizer.pt", weights_only=False))
    set_rng_state(torch.load(path / "rng.pt", weights_only=False))
    return json.loads((path / "trainer_state.json").read_text())


def load_extra(path: Path) -> dict[str, Any]:
    """The ``extra`` state saved with a checkpoint ({} when there was none)."""
    f = Path(path) / "extra.pt"
    return torch.load(f, weights_only=False) if f.exists() else {}


def push_folder(folder: Path, repo_id: str) -> str:
    """Upload ``folder`` (a run's ``final`` model) to the hub model repo ``repo_id``, creating it
    when missing (``train.push_to_hub``); returns the commit's URL.

    Raises:
        ConfigError: One line naming the repo and the hub's reason (no token, no access, offline);
            the folder stays where it is.
    """
    from huggingface_hub import HfApi

    api = HfApi()
    try:
        api.create_repo(repo_id, repo_type="model", exist_ok=True)
        info = api.upload_folder(folder_path=str(folder), repo_id=repo_id, repo_type="model")
    except Exception as exc:  # noqa: BLE001 - the hub client raises HTTP, auth and connection errors
        reason = " ".join(str(exc).split()) or type(exc).__name__
        raise ConfigError(f"train.push_to_hub: cannot upload {folder} to {repo_id!r}: {reason}") from None
    return str(getattr(info, "commit_url", info))
