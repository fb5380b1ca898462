"""What the credit inspector reads: a few whole groups of one iteration, saved by the trainer.

Every ``train.inspect_every`` iterations (and at the first and the last one) the trainer calls
:func:`record_iteration`, which writes ``RUN_DIR/inspect/iter_NNNNNN.json`` (NNNNNN = the
iteration as numbered in ``metrics.jsonl``, 1-based) holding ``train.inspect_groups`` whole
groups, with everything the credit stage saw, so any estimator can be re-run on them offline
(:mod:`creditrl.inspect.compare`). Groups with mixed outcomes come first, then by group id. Per
response (``L`` = its length):

- ``tokens`` (L ids), ``texts`` (L strings, "" for special tokens), ``special`` ({pos: name});
- ``masked``: positions in ``[0, L)`` where ``response_mask`` is 0 (usually empty);
- ``rewards`` (L floats) and ``reward_mask`` (positions), as placed by the score stage;
- ``step_ends``: the task's step ends (positions); ``credit_step_ends``: the time steps of
  credit when a value source replaced them (a tree's segments), else null;
- ``values``, ``adv``, ``ret`` (L floats; ``values`` null without a value source): the run's;
- ``outcome``, ``kept`` (False when the error policy or hybrid filter dropped it), ``finished``;
- ``steps``: ``[start, end]`` token spans of the task's steps, and ``labels``: the task's step
  checker on their texts (``task.check_steps``), or null for a task without steps (or a
  checker that does not return one label per step).

Floats are written as the shortest decimal that reads back as the same float32, so a reload
gives bit-identical tensors. A file holds at most ``MAX_TOKENS_PER_FILE`` response tokens (whole
groups past it are left out), a few tens of bytes each.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import PreTrainedTokenizerBase

from creditrl.config import Config
from creditrl.rewards.stage import Scored
from creditrl.rollout.batch import TrajectoryBatch
from creditrl.rollout.segment import TokenTexts
from creditrl.tasks.base import Task

FORMAT_VERSION = 1
MAX_TOKENS_PER_FILE = 65_536  # response tokens per saved iteration, all groups together
INSPECT_DIR = "inspect"


def should_record(iteration: int, every: int, last: int) -> bool:
    """Whether ``iteration`` (1-based) is saved: every ``every``-th, plus the first and the last;
    ``every = 0`` turns recording off."""
    return every > 0 and (iteration == 1 or iteration == last or iteration % every == 0)


def choose_groups(group_ids: torch.Tensor, outcome: torch.Tensor, k: int) -> list[int]:
    """The ``k`` group ids to save: mixed outcomes (some responses right, some wrong) first,
    then ascending id. group_ids long (B,), outcome float (B,)."""
    ids = sorted(set(group_ids.tolist()))

    def mixed(g: int) -> bool:
        o = outcome[group_ids == g]
        return bool((o > 0.5).any() and (o <= 0.5).any())

    return sorted(ids, key=lambda g: (not mixed(g), g))[:k]


def floats(x: torch.Tensor) -> list[float]:
    """float32 values as the shortest decimals that read back as the same float32."""
    return [float(str(v)) for v in x.detach().to(torch.float32).numpy().astype(np.float32)]


def _positions(mask: torch.Tensor) -> list[int]:
    return mask.nonzero().squeeze(-1).tolist()


def step_spans(step_ends: list[int], length: int) -> list[list[int]]:
    """``[start, end]`` (inclusive) token spans of the steps: each step end closes one, and the
    tokens after the last step end form a final step."""
    ends = sorted(e for e in set(step_ends) if 0 <= e < length)
    if length and (not ends or ends[-1] != length - 1):
        ends.append(length - 1)
    starts = [0] + [e + 1 for e in ends[:-1]]
    return [[s, e] for s, e in zip(starts, ends)]


def _response(
    batch: TrajectoryBatch,
    scored: Scored,
    row: int,
    adv: torch.Tensor,
    ret: torch.Tensor,
    values: torch.Tensor | None,
    credit_step_ends: torch.Tensor | None,
    texts_of: TokenTexts,
    tokenizer: PreTrainedTokenizerBase,
    task: Task,
) -> dict[str, Any]:
    n = int(batch.response_lengths[row])
    ids = batch.response_ids[row, :n].tolist()
    texts = [texts_of(i) for i in ids]
    step_ends = _positions(scored.step_ends[row, :n])
    spans = step_spans(step_ends, n)
    labels = None
    if getattr(task, "step_separator", None) and "problems" in batch.extras:
        segments = ["".join(texts[s : e + 1]) for s, e in spans]
        labels = [bool(x) for x in task.check_steps(batch.extras["problems"][row], segments)]
        if len(labels) != len(spans):  # a checker that does not label every step: no labels
            labels = None
    return {
        "row": row,
        "tokens": ids,
        "texts": texts,
        "special": {str(p): tokenizer.convert_ids_to_tokens(i) for p, i in enumerate(ids) if i in texts_of.special},
        "masked": _positions(~batch.response_mask[row, :n]),
        "rewards": floats(scored.rewards[row, :n]),
        "reward_mask": _positions(scored.reward_mask[row, :n]),
        "step_ends": step_ends,
        "credit_step_ends": None if credit_step_ends is None else _positions(credit_step_ends[row, :n]),
        "values": None if values is None else floats(values[row, :n]),
        "adv": floats(adv[row, :n]),
        "ret": floats(ret[row, :n]),
        "outcome": float(scored.outcome[row]),
        "kept": bool(scored.keep[row]),
        "finished": bool(batch.finished[row]),
        "completion": "".join(texts),
        "steps": spans,
        "labels": labels,
    }


@dataclass(frozen=True)
class InspectSettings:
    """What the inspector reads of a resolved config: the cadence (``train.inspect_every``,
    ``train.iterations``), the groups per file (``train.inspect_groups``) and the run's settings
    written into every record (``credit.*``, the value and reward sources, the granularity, the
    task)."""

    every: int
    iterations: int
    groups: int
    settings: dict[str, Any]  # the record's "settings"; "lam" is the schedule's start

    @classmethod
    def of(cls, cfg: Config) -> InspectSettings:
        c, t = cfg.credit, cfg.train
        settings = {
            "estimator": c.estimator,
            "normaliser": c.normaliser,
            "resolution": c.resolution,
            "gamma": c.gamma,
            "lam": c.lam,
            "value_source": cfg.value.source,
            "reward_source": cfg.reward.source,
            "granularity": cfg.reward.granularity,
            "task": cfg.task.name,
        }
        return cls(t.inspect_every, t.iterations, t.inspect_groups, settings)


def iteration_record(
    iteration: int,
    batch: TrajectoryBatch,
    scored: Scored,
    adv: torch.Tensor,
    ret: torch.Tensor,
    settings: InspectSettings,
    tokenizer: PreTrainedTokenizerBase,
    task: Task,
    *,
    values: torch.Tensor | None = None,
    credit_step_ends: torch.Tensor | None = None,
    lam: float | None = None,
) -> dict[str, Any]:
    """The JSON object :func:`record_iteration` writes (see the module docstring); ``lam``: the
    iteration's lambda under a schedule (default: ``credit.lam``)."""
    texts_of = TokenTexts(tokenizer)
    problems = batch.extras.get("problems")
    groups, tokens = [], 0
    for g in choose_groups(batch.group_ids, scored.outcome, settings.groups):
        rows = (batch.group_ids == g).nonzero().squeeze(-1).tolist()
        size = int(batch.response_lengths[rows].sum())
        if tokens + size > MAX_TOKENS_PER_FILE:
            break
        tokens += size
        problem = problems[rows[0]] if problems else None
        groups.append(
            {
                "group_id": g,
                "prompt": problem.prompt if problem is not None else "",
                "answer": problem.answer if problem is not None else "",
                "responses": [
                    _response(batch, scored, r, adv, ret, values, credit_step_ends, texts_of, tokenizer, task)
                    for r in rows
                ],
            }
        )
    return {
        "version": FORMAT_VERSION,
        "iteration": iteration,
        "settings": {**settings.settings, **({} if lam is None else {"lam": lam})},
        "batch_size": batch.size,
        "groups_in_batch": len(set(batch.group_ids.tolist())),
        "groups": groups,
    }


def record_iteration(
    run_dir: Path,
    iteration: int,
    batch: TrajectoryBatch,
    scored: Scored,
    adv: torch.Tensor,
    ret: torch.Tensor,
    settings: InspectSettings,
    tokenizer: PreTrainedTokenizerBase,
    task: Task,
    **optional: Any,
) -> Path | None:
    """Write ``run_dir/inspect/iter_NNNNNN.json`` when :func:`should_record` says so; returns
    its path, or None. ``iteration`` is 1-based (the ``metrics.jsonl`` row); the tensors are the
    credit stage's: adv, ret, values float (B, T), credit_step_ends bool (B, T) or None
    (``optional``: ``values``, ``credit_step_ends`` and ``lam`` of :func:`iteration_record`)."""
    if not should_record(iteration, settings.every, settings.iterations):
        return None
    record = iteration_record(iteration, batch, scored, adv, ret, settings, tokenizer, task, **optional)
    out = Path(run_dir) / INSPECT_DIR
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"iter_{iteration:06d}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(record, separators=(",", ":")))
    os.replace(tmp, path)  # atomic: a reader never sees half a file
    return path
