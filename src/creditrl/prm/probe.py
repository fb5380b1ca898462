"""The shortcut probe: how much of a PRM's score is explained by a step's length or surface.

A PRM can score well on held-out labels for the wrong reason: if wrong steps tend to be
longer, or to contain some character, a model that measures that gets a good AUROC without
checking anything (the "reward hacking by shortcuts" worry of PRM papers, e.g. Zheng et al.
2024, ProcessBench, arXiv:2412.06559). Given held-out step records (text, PRM score, true hard
label) the probe reports

- ``auroc_prm``: AUROC of the PRM score against the label (what the PRM achieves);
- ``auroc_length``: AUROC of the step length in tokens alone as the score ("longer = correct"),
  with ``auroc_length_best = max(a, 1 - a)`` and ``length_direction`` naming the better
  direction: what a length-only detector achieves;
- ``r2_length``: R^2 of a linear regression of the PRM score on step length;
- ``r2_surface``: R^2 of a linear regression of the PRM score on the step's bag of characters
  (counts of each of ``0-9 + - * = ; #``; their sum is the length for arithmetic steps, so
  ``r2_surface >= r2_length`` there);
- ``auroc_surface``: AUROC, on one half of the records, of a linear regression of the label on
  those counts fitted on the other half (halves stratified by label, seeded): what a keyword
  detector achieves.

Reading: a PRM whose ``auroc_prm`` is not clearly above ``auroc_length_best`` and
``auroc_surface``, or whose score has a high ``r2_length`` / ``r2_surface``, may be measuring
the surface rather than the step.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
from transformers import PreTrainedTokenizerBase

from creditrl.prm.metrics import auroc, fit_predict, linear_r2

__all__ = ["SURFACE_CHARS", "StepRecord", "ShortcutReport", "surface_features", "shortcut_probe"]

SURFACE_CHARS = "0123456789+-*=;#"
"""The characters whose counts make the surface features (the arithmetic step alphabet)."""


class StepRecord(NamedTuple):
    """One held-out step: its text, the PRM's score for it and its true hard label (0 or 1)."""

    text: str
    score: float
    label: float


@dataclass(frozen=True)
class ShortcutReport:
    """The probe's numbers (see the module docstring for each)."""

    n: int
    auroc_prm: float
    auroc_length: float
    auroc_length_best: float
    length_direction: str  # "longer is correct" or "shorter is correct"
    r2_length: float
    r2_surface: float
    auroc_surface: float

    def markdown(self) -> str:
        """A two-column Markdown table of the numbers, with what each measures."""
        rows = [
            ("auroc_prm", self.auroc_prm, "PRM score vs label"),
            ("auroc_length", self.auroc_length, "step length alone vs label (longer = correct)"),
            ("auroc_length_best", self.auroc_length_best, f"length in its better direction: {self.length_direction}"),
            ("r2_length", self.r2_length, "PRM score explained by a linear fit on length"),
            ("r2_surface", self.r2_surface, f"PRM score explained by a linear fit on counts of {SURFACE_CHARS}"),
            (
                "auroc_surface",
                self.auroc_surface,
                "character counts alone vs label (fit on a half, tested on the other)",
            ),
        ]
        lines = [f"| metric (n = {self.n}) | value | measures |", "|---|---:|---|"]
        lines += [f"| {name} | {value:.3f} | {what} |" for name, value, what in rows]
        return "\n".join(lines)


def surface_features(text: str) -> np.ndarray:
    """Counts of each character of :data:`SURFACE_CHARS` in ``text``: float (16,)."""
    return np.array([text.count(c) for c in SURFACE_CHARS], dtype=np.float64)


def _stratified_halves(labels: np.ndarray, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Index arrays of two halves with each label class split evenly between them."""
    rng = random.Random(seed)
    first, second = [], []
    for cls in (0.0, 1.0):
        idx = [int(i) for i in np.flatnonzero(labels == cls)]
        rng.shuffle(idx)
        first += idx[0::2]
        second += idx[1::2]
    return np.array(sorted(first), dtype=np.int64), np.array(sorted(second), dtype=np.int64)


def shortcut_probe(
    records: Sequence[StepRecord | tuple[str, float, float]],
    *,
    tokenizer: PreTrainedTokenizerBase | None = None,
    seed: int = 0,
) -> ShortcutReport:
    """Run the probe on held-out step records ``(text, score, label)``.

    Step length is counted in ``tokenizer`` tokens, or in characters without one (the same
    for the character tokenizer of the tiny preset). ``seed`` draws the halves of
    ``auroc_surface``.

    Raises:
        ValueError: if a label is not 0 or 1, if either label has fewer than 2 records (each
            half needs both), or on a non-finite score (e.g. the NaN of a step that did not
            fit in the PRM's context).
    """
    texts = [r[0] for r in records]
    scores = np.array([float(r[1]) for r in records])
    labels = np.array([float(r[2]) for r in records])
    if not np.all((labels == 0.0) | (labels == 1.0)):
        raise ValueError(f"labels must be hard (0 or 1), got {sorted(set(labels.tolist()) - {0.0, 1.0})[:5]}")
    n_pos = int(labels.sum())
    if min(n_pos, len(labels) - n_pos) < 2:
        raise ValueError(
            f"the probe needs at least 2 records of each label, got {n_pos} right and {len(labels) - n_pos} wrong"
        )
    if tokenizer is None:
        lengths = np.array([len(t) for t in texts], dtype=np.float64)
    else:
        lengths = np.array([len(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts], dtype=np.float64)
    surface = np.stack([surface_features(t) for t in texts])  # (n, 16)

    auroc_length = float(auroc(lengths.tolist(), labels.tolist()))
    first, second = _stratified_halves(labels, seed)
    predicted = fit_predict(surface[first], labels[first], surface[second])
    return ShortcutReport(
        n=len(records),
        auroc_prm=float(auroc(scores.tolist(), labels.tolist())),
        auroc_length=auroc_length,
        auroc_length_best=max(auroc_length, 1.0 - auroc_length),
        length_direction="longer is correct" if auroc_length >= 0.5 else "shorter is correct",
        r2_length=float(linear_r2(lengths[:, None], scores)),
        r2_surface=float(linear_r2(surface, scores)),
        auroc_surface=float(auroc(predicted.tolist(), labels[second].tolist())),
    )
