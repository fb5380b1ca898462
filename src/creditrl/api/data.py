"""Datasets handed to :class:`creditrl.Trainer`, as a run reads them.

A ``datasets.Dataset`` (or any iterable of row dicts) in TRL's formats is written to the run
directory as JSON Lines (``RUN_DIR/data/train.jsonl``, ``eval.jsonl``), so the run's
``config.yaml`` names files that a resume reads again. Rows with an ``answer`` column train the
``math`` task (answers checked with math-verify: held-out accuracy means something); rows without
one train :class:`PromptTask`, TRL's setting, where the reward functions alone judge a completion.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from creditrl.errors import ConfigError
from creditrl.tasks.base import Problem, draw_from_pool
from creditrl.tasks.datafile import read_dataset
from creditrl.tasks.prompts import read_prompt

__all__ = ["PROMPT_TASK", "PromptTask", "write_rows"]

PROMPT_TASK = "creditrl.api.data:PromptTask"  # its task.name: an import path, so a resume finds it


def write_rows(dataset: Any, path: Path, what: str) -> list[str]:
    """Write ``dataset``'s rows to ``path`` as JSON Lines; returns its column names.

    Raises:
        ConfigError: ``dataset`` is a ``DatasetDict`` or another mapping (name a split), holds no rows, a row is not a
            mapping, or a cell is not JSON (naming the row and column).
    """
    if isinstance(dataset, Mapping):  # a DatasetDict is one
        keys = ", ".join(map(str, dataset)) or "none"
        raise ConfigError(f"{what}: a mapping of splits ({keys}); pass one split, e.g. {what}['train']")
    if isinstance(dataset, (str, bytes)) or not isinstance(dataset, Iterable):
        raise ConfigError(f"{what}: expected a datasets.Dataset or a list of rows, got a {type(dataset).__name__}")
    path.parent.mkdir(parents=True, exist_ok=True)
    columns: dict[str, None] = {}
    n = 0
    with path.open("w", encoding="utf-8") as f:
        for n, row in enumerate(dataset, 1):
            if not isinstance(row, dict):
                raise ConfigError(f"{what}, row {n}: expected a mapping of columns, got a {type(row).__name__}")
            for key, value in row.items():
                try:
                    json.dumps(value)
                except (TypeError, ValueError):
                    raise ConfigError(
                        f"{what}, row {n}, column {key!r}: a {type(value).__name__} is not JSON (text, numbers, "
                        "lists and mappings are)"
                    ) from None
            columns.update(dict.fromkeys(row))
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    if n == 0:
        raise ConfigError(f"{what}: the dataset holds no rows")
    return list(columns)


class PromptTask:
    """TRL's prompt-only rows as a task (``task.name=creditrl.api.data:PromptTask``): a ``prompt``
    column (text, or ``{role, content}`` turns) or a ``messages`` one, no reference answer.

    The reward functions alone judge completions, so ``check_outcome`` is False for every
    completion (``eval/accuracy`` reads 0; the rewards are the measure); a ``solution`` or
    ``completion`` column, or a conversation's final assistant turn, is the reference solution,
    and every other column reaches the reward functions as a keyword list.

    Args:
        train_file: The training rows (a JSONL, JSON or Parquet file, or a ``save_to_disk`` folder).
        heldout_file: The held-out rows; None evaluates on ``train_file``'s.
        step_separator: Text that ends a step (None: no steps).
    """

    name = "prompts"

    def __init__(self, train_file: str, heldout_file: str | None = None, step_separator: str | None = None) -> None:
        self.step_separator = step_separator
        train = self._read(train_file, "train")
        self.pools = {"train": train, "heldout": self._read(heldout_file, "heldout") if heldout_file else train}

    @staticmethod
    def _read(source: str, split: str) -> list[Problem]:
        data = read_dataset(source)
        problems = []
        for number, row in data.rows:
            key = "prompt" if "prompt" in row else "messages" if "messages" in row else None
            if key is None:
                fields = ", ".join(map(str, row)) or "none"
                expected = "expected 'prompt' (text or turns) or 'messages'"
                raise data.error(number, f"field 'prompt' is missing (fields: {fields}); {expected}")
            try:
                prompt = read_prompt(row[key])
            except ValueError as exc:
                raise data.field_error(number, key, str(exc)) from None
            solution = row.get("solution", row.get("completion", prompt.solution))
            columns = {k: v for k, v in row.items() if k != key}
            problems.append(
                Problem(
                    prompt=prompt.text,
                    answer="",
                    solution=solution if isinstance(solution, str) else "",
                    meta={**columns, "file": source, "row": number, "split": split},
                    messages=prompt.messages,  # a conversation, even of one user turn, stays one (TRL's format)
                )
            )
        return problems

    def sample(self, n: int, *, split: str, seed: int) -> list[Problem]:
        """``n`` rows of ``split`` drawn with replacement, deterministic in ``seed``."""
        return draw_from_pool(
            self.pools.get(split, []), n, split=split, seed=seed, namespace="prompts", empty=f"no {split!r} rows"
        )

    def check_outcome(self, problem: Problem, completion: str) -> bool:
        """False: without a reference answer nothing is checked (the rewards judge)."""
        return False

    def check_steps(self, problem: Problem, segments: list[str]) -> list[bool]:
        """Every step False, like the outcome."""
        return [False] * len(segments)
