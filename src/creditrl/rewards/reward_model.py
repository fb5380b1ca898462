"""``reward.source=rm:PATH``: a sequence-classification reward model, scored as TRL scores one.

PATH is a folder holding an ``AutoModelForSequenceClassification`` and its tokenizer (what
TRL's ``RewardTrainer``, OpenRLHF or a hub reward model saves). Each completion is scored at
sequence granularity by the model's first logit on one text: for a problem with a conversation,
the conversation and the completion as an assistant turn rendered with the reward model's own
chat template; otherwise (or when its tokenizer has no template) the prompt text followed by the
completion, as TRL's ``GRPOTrainer`` does. Texts are tokenized without added special tokens,
padded on the right, and scored :data:`RM_BATCH_ROWS` at a time on the policy's device
(``policy.device``), in the model's saved dtype. Combine it with other sources by
``reward.sources`` / ``reward.weights``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from creditrl.policy.device import resolve_device
from creditrl.rewards.sources import RewardSource, SourceFactory, register_source_prefix
from creditrl.tasks.base import Problem, Task

RM_BATCH_ROWS = 16  # completions per forward pass of the reward model


def _architectures(path: Path) -> list[str]:
    try:
        return list(json.loads((path / "config.json").read_text()).get("architectures") or [])
    except (OSError, ValueError):
        return []


def check_reward_model_dir(path: str) -> None:
    """ValueError (one line) unless ``path`` holds a saved sequence-classification model."""
    folder = Path(path)
    if not folder.is_dir():
        raise ValueError(
            f"reward source 'rm:{path}': '{path}' is not a directory (a saved "
            "AutoModelForSequenceClassification and its tokenizer)"
        )
    arch = _architectures(folder)
    if not any(a.endswith("ForSequenceClassification") for a in arch):
        got = ", ".join(arch) or "no architecture in config.json"
        raise ValueError(
            f"reward source 'rm:{path}': expected a sequence-classification model (a reward model), got {got}; "
            "a causal LM would score with an untrained head"
        )


@lru_cache(maxsize=4)
def load_reward_model(path: str, device: str = "cpu") -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The reward model at ``path`` on ``device`` (a ``policy.device`` name) in eval mode, and
    its tokenizer padding on the right (eos as the pad token when it has none); cached."""
    check_reward_model_dir(path)
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    tokenizer.padding_side = "right"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForSequenceClassification.from_pretrained(path, local_files_only=True, dtype="auto")
    if model.config.pad_token_id is None:  # where the model finds each row's last token
        model.config.pad_token_id = tokenizer.pad_token_id
    return model.eval().to(resolve_device(device)), tokenizer


def reward_model_texts(
    tokenizer: PreTrainedTokenizerBase, problems: Sequence[Problem], completions: Sequence[str]
) -> list[str]:
    """The text the reward model scores for each completion (module doc)."""
    texts = []
    for problem, completion in zip(problems, completions):
        if problem.messages and tokenizer.chat_template:
            turns = [{"role": r, "content": c} for r, c in problem.messages]
            turns.append({"role": "assistant", "content": completion})
            texts.append(tokenizer.apply_chat_template(turns, tokenize=False))
        else:
            texts.append(problem.prompt + completion)
    return texts


@torch.inference_mode()
def reward_model_scores(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, texts: Sequence[str], batch_rows: int = RM_BATCH_ROWS
) -> list[float]:
    """The model's first logit for each text, ``batch_rows`` texts per forward pass."""
    device = next(model.parameters()).device
    out: list[float] = []
    for start in range(0, len(texts), batch_rows):
        chunk = list(texts[start : start + batch_rows])
        enc = tokenizer(chunk, return_tensors="pt", padding=True, add_special_tokens=False)
        logits = model(**{k: v.to(device) for k, v in enc.items()}).logits  # (rows, labels)
        out.extend(logits[:, 0].float().tolist())
    return out


@register_source_prefix("rm")
def reward_model_source(name: str) -> SourceFactory:
    """The factory of source ``rm:PATH`` (the model is loaded when the run builds the source)."""
    path = name.partition(":")[2]
    check_reward_model_dir(path)

    def build(options: dict[str, Any]) -> RewardSource:
        model, tokenizer = load_reward_model(path, str(options.get("device") or "cpu"))

        def batch_fn(
            task: Task, problems: Sequence[Problem], completions: Sequence[str], spans: Sequence[Sequence[str]]
        ) -> list[list[float | None]]:
            texts = reward_model_texts(tokenizer, problems, completions)
            return [[s] for s in reward_model_scores(model, tokenizer, texts)]

        def fn(task: Task, problem: Problem, completion: str, spans: Sequence[str]) -> list[float | None]:
            return batch_fn(task, [problem], [completion], [spans])[0]

        return RewardSource(name, frozenset({"sequence"}), "sequence", fn, batch_fn)

    return SourceFactory(name, frozenset({"sequence"}), "sequence", build)
