"""A PRM as a step-granularity reward source (``reward.source=prm``, ``reward.prm=DIR``).

Each step's reward is the PRM's probability that the step is right. The source scores a whole
batch in one pass (``batch_fn``); spans that are empty (an eos alone) or do not fit the PRM's
context get no reward (``None``). A PRM directory holds the model (:meth:`ProcessRewardModel.save`)
and the tokenizer it reads, as ``creditrl prm train`` writes it, or a public PRM with its own
tokenizer (Math-Shepherd, Qwen2.5-Math-PRM or RLHFlow style: :mod:`creditrl.prm.public`), detected
from its files or named by ``prm.format``. Importing :mod:`creditrl.prm` registers the source (the
rewards layer below does not know about PRMs).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

from transformers import AutoTokenizer, PreTrainedTokenizerBase

from creditrl.errors import ConfigError
from creditrl.policy.device import resolve_device
from creditrl.prm.model import CONFIG_FILE, ProcessRewardModel
from creditrl.prm.public import StepScorer, detect_format, load_public
from creditrl.rewards.sources import RewardSource, register_source_factory
from creditrl.tasks.base import Problem, Task


@lru_cache(maxsize=4)
def load_prm(path: str, device: str = "cpu", fmt: str = "auto") -> tuple[StepScorer, PreTrainedTokenizerBase]:
    """The PRM and its tokenizer saved at ``path``, the PRM on ``device`` (a ``policy.device``
    name; cached: a run builds its sources once per stage, and several sources may read the
    same PRM). ``fmt`` is ``prm.format``: ``auto`` detects it (:func:`detect_format`),
    ``creditrl`` is a :class:`ProcessRewardModel`, the others are public conventions."""
    if not Path(path).is_dir():
        raise FileNotFoundError(f"reward.prm: '{path}' is not a PRM directory (write one with `creditrl prm train`)")
    fmt = detect_format(path) if fmt == "auto" else fmt
    if fmt != "creditrl":
        return load_public(path, fmt, device)
    if not (Path(path) / CONFIG_FILE).exists():
        raise ConfigError(f"prm.format=creditrl: '{path}' has no {CONFIG_FILE} (write one with `creditrl prm train`)")
    prm = ProcessRewardModel.load(path).eval().to(resolve_device(device))
    return prm, AutoTokenizer.from_pretrained(path, local_files_only=True)


def prm_step_scores(
    prm: StepScorer, tokenizer: PreTrainedTokenizerBase, prompts: Sequence[str], spans: Sequence[Sequence[str]]
) -> list[list[float | None]]:
    """Per response, per span: the PRM probability, ``None`` for an empty or unscored span."""
    kept = [[i for i, s in enumerate(row) if s] for row in spans]
    scored = prm.score(tokenizer, [(p, [row[i] for i in idx]) for p, row, idx in zip(prompts, spans, kept)])
    out: list[list[float | None]] = []
    for row, idx, vals in zip(spans, kept, scored):
        full: list[float | None] = [None] * len(row)
        for i, v in zip(idx, vals):
            full[i] = None if math.isnan(v) else float(v)
        out.append(full)
    return out


def prm_reward_source(path: str, device: str = "cpu", fmt: str = "auto") -> RewardSource:
    prm, tokenizer = load_prm(str(path), device, fmt)

    def fn(task: Task, problem: Problem, completion: str, spans: Sequence[str]) -> list[float | None]:
        return prm_step_scores(prm, tokenizer, [problem.prompt], [spans])[0]

    def batch_fn(
        task: Task, problems: Sequence[Problem], completions: Sequence[str], spans: Sequence[Sequence[str]]
    ) -> list[list[float | None]]:
        return prm_step_scores(prm, tokenizer, [p.prompt for p in problems], spans)

    return RewardSource("prm", frozenset({"step"}), "step", fn, batch_fn)


@register_source_factory("prm", granularities=("step",), default="step", requires=("prm",))
def _prm_source(options: dict[str, Any]) -> RewardSource:
    """A process reward model (``reward.prm``: written by ``creditrl prm train``, or a public one,
    ``prm.format``): each step's reward is the PRM's probability that the step is correct."""
    return prm_reward_source(options["prm"], options.get("device", "cpu"), options.get("prm_format", "auto"))
