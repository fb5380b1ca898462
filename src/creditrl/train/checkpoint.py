"""Checkpoints written atomically: a temporary directory first, then a rename.

A checkpoint directory holds the HF model and tokenizer (``save_pretrained``), the optimizer
state, the RNG states and ``trainer_state.json``. A crash while writing leaves at most a
``*.tmp`` directory behind, never a half-written checkpoint under the final name.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

LATEST = "latest"


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
) -> Path:
    """Write a checkpoint to ``path`` atomically (replacing an older one of the same name).

    ``extra`` holds further training state (critic weights and optimizer, calibrator) in
    ``extra.pt``; ``files`` are further small text files (name -> content), e.g. a LoRA
    checkpoint's base-model pointer."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent))
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    if optimizer is not None:
        torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
    torch.save(rng_state(), tmp / "rng.pt")
    if extra:
        torch.save(extra, tmp / "extra.pt")
    (tmp / "trainer_state.json").write_text(json.dumps(state, indent=2))
    for name, text in (files or {}).items():
        (tmp / name).write_text(text)
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
    """Point ``checkpoints/latest`` at ``name`` (an atomic file replace)."""
    tmp = checkpoints_dir / (LATEST + ".tmp")
    tmp.write_text(name)
    os.replace(tmp, checkpoints_dir / LATEST)


def latest_checkpoint(checkpoints_dir: Path) -> Path | None:
    marker = Path(checkpoints_dir) / LATEST
    if not marker.exists():
        return None
    path = Path(checkpoints_dir) / marker.read_text().strip()
    return path if path.exists() else None


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
