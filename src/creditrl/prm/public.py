"""Public process reward models as step scorers: the three conventions people download.

``reward.prm=DIR`` (and ``search.prm``) reads creditrl's own PRM (``prm_config.json``, see
:mod:`creditrl.prm.model`) or one of these, detected from the saved files or named by
``prm.format``. Each reads the policy's steps (texts, each with its separator) in its own
tokenizer and input layout, and gives one probability per step, read at the PRM's step tag:

- ``math_shepherd`` (Wang et al. 2023, arXiv:2312.08935; ``peiyi9979/math-shepherd-mistral-7b-prm``):
  a causal LM over ``question + " " + "step_1 ки\\nstep_2 ки\\n..."`` (the tokenizer's own special
  tokens added). At each position t holding the tag ``ки``, the logits predict the next token and
  ``p_k = softmax(logits_t[['+', '-']])[0]``.
- ``qwen_prm`` (``Qwen/Qwen2.5-Math-PRM-7B``): a 2-label token-classification model over the chat
  template of ``[system, user: question, assistant: "step_1<extra_0>step_2<extra_0>..."]``;
  ``p_k = softmax(logits_t)[1]`` at each ``<extra_0>``.
- ``rlhflow`` (``RLHFlow/Llama3.1-8B-PRM-*``): a causal chat LM over one user turn per step (the
  first is ``question + " " + step_1``), each answered ``+`` by the assistant. The probability of
  step k is ``softmax(logits_t[['+', '-']])[0]`` at the position t whose next token is turn k's
  answer (the model card reads position -3 of the conversation through turn k, which ends
  ``+<|eot_id|>``: the same token). Causal attention makes that logit a function of turns 1..k
  only, so one forward pass over the whole conversation gives every step when the chat template
  renders each prefix as a prefix of the whole (checked per example; otherwise each prefix
  conversation is its own row, as the card scores it).

A step's text is stripped of surrounding whitespace and of the tag (a tag inside a step would be
read as a step end).

A model whose ``config.json`` names its own code (``auto_map``, as Qwen2.5-Math-PRM does) is
loaded with ``trust_remote_code=True``: the code is the files in that directory, read locally.
"""

from __future__ import annotations

import inspect
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import Tensor
from transformers import (
    AutoModel,
    AutoModelForCausalLM,
    AutoModelForTokenClassification,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from creditrl.errors import ConfigError
from creditrl.policy.device import resolve_device
from creditrl.prm.model import CONFIG_FILE, right_pad

SHEPHERD_TAG = "ки"
QWEN_SEPARATOR = "<extra_0>"
QWEN_SYSTEM = "Please reason step by step, and put your final answer within \\boxed{}."
GOOD, BAD = "+", "-"
TOKENS_PER_CALL = 1 << 15
"""Most padded tokens in one forward pass (a 7B PRM's activations and logits stay bounded)."""

Row = tuple[list[int], list[tuple[int, int]]]
"""One model input: token ids and the ``(step index, position)`` pairs read from it."""


class StepScorer(Protocol):
    """What the ``prm`` reward source and the search verifier call (``ProcessRewardModel`` too)."""

    def score(
        self,
        tokenizer: PreTrainedTokenizerBase,
        examples: Sequence[tuple[str, Sequence[str]]],
        *,
        batch_size: int = 32,
        max_len: int | None = None,
    ) -> list[list[float]]: ...


def token_id(tokenizer: PreTrainedTokenizerBase, text: str, fmt: str) -> int:
    """The id ``text`` ends in when encoded alone (the cards' ``encode(text)[-1]``); a clear error
    when the tokenizer has no single token for it."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if not ids or tokenizer.decode(ids[-1:]).strip() != text or ids[-1] == tokenizer.unk_token_id:
        raise ConfigError(f"prm.format={fmt}: the PRM's tokenizer has no single token for {text!r}")
    return int(ids[-1])


def _clean(text: str, tag: str) -> str:
    return text.replace(tag, "").strip()


def _shepherd_rows(tokenizer: PreTrainedTokenizerBase, prompt: str, steps: Sequence[str]) -> list[Row]:
    tag = token_id(tokenizer, SHEPHERD_TAG, "math_shepherd")
    body = "\n".join(f"{_clean(s, SHEPHERD_TAG)} {SHEPHERD_TAG}" for s in steps)
    ids = tokenizer(f"{_clean(prompt, SHEPHERD_TAG)} {body}")["input_ids"]
    return [(ids, _tagged(ids, tag, len(steps), "math_shepherd"))]


def _qwen_rows(tokenizer: PreTrainedTokenizerBase, prompt: str, steps: Sequence[str]) -> list[Row]:
    sep = token_id(tokenizer, QWEN_SEPARATOR, "qwen_prm")
    messages = [
        {"role": "system", "content": QWEN_SYSTEM},
        {"role": "user", "content": _clean(prompt, QWEN_SEPARATOR)},
        {"role": "assistant", "content": "".join(_clean(s, QWEN_SEPARATOR) + QWEN_SEPARATOR for s in steps)},
    ]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
    ids = tokenizer(text)["input_ids"]
    return [(ids, _tagged(ids, sep, len(steps), "qwen_prm"))]


def _tagged(ids: Sequence[int], tag: int, n: int, fmt: str) -> list[tuple[int, int]]:
    positions = [t for t, i in enumerate(ids) if i == tag]
    if len(positions) != n:
        raise ValueError(
            f"prm.format={fmt}: found {len(positions)} step tags for {n} steps (the tokenizer merges the tag "
            "with the text around it, or the chat template adds one)"
        )
    return list(enumerate(positions))


def _rlhflow_rows(tokenizer: PreTrainedTokenizerBase, prompt: str, steps: Sequence[str]) -> list[Row]:
    good = token_id(tokenizer, GOOD, "rlhflow")
    conversation: list[dict[str, str]] = []
    prefixes: list[tuple[list[int], int]] = []  # per step: the conversation through its answer, the read position
    for k, step in enumerate(steps):
        text = f"{prompt} {step.strip()}" if k == 0 else step.strip()
        conversation += [{"role": "user", "content": text}, {"role": "assistant", "content": GOOD}]
        rendered = tokenizer.apply_chat_template(conversation, tokenize=False)
        ids = tokenizer(rendered, add_special_tokens=False)["input_ids"]
        answers = [t for t, i in enumerate(ids) if i == good]
        if not answers or answers[-1] == 0:
            raise ValueError(f"prm.format=rlhflow: the chat template drops the assistant's {GOOD!r} answer")
        prefixes.append((ids, answers[-1] - 1))  # the token before the answer predicts it
    whole = prefixes[-1][0]
    if all(whole[: len(ids)] == ids for ids, _ in prefixes):
        return [(whole, [(k, t) for k, (_, t) in enumerate(prefixes)])]
    return [(ids, [(k, t)]) for k, (ids, t) in enumerate(prefixes)]


def _plus_over_minus(tokenizer: PreTrainedTokenizerBase, fmt: str) -> Callable[[Tensor], Tensor]:
    pair = [token_id(tokenizer, GOOD, fmt), token_id(tokenizer, BAD, fmt)]
    return lambda logits: torch.softmax(logits[:, pair].float(), dim=-1)[:, 0]


def _label_one(tokenizer: PreTrainedTokenizerBase, fmt: str) -> Callable[[Tensor], Tensor]:
    return lambda logits: torch.softmax(logits.float(), dim=-1)[:, 1]


@dataclass(frozen=True)
class PublicFormat:
    """A public PRM convention: how to load it, lay out its inputs and read a step's probability.

    ``rows(tokenizer, prompt, steps)`` -> model inputs; ``reader(tokenizer, fmt)`` -> a function of
    the logits at the read positions, (N, V) -> the N step probabilities; ``tokens``: the texts the
    tokenizer must hold as single tokens; ``chat``: whether it needs a chat template."""

    name: str
    auto_class: Any
    rows: Callable[[PreTrainedTokenizerBase, str, Sequence[str]], list[Row]]
    reader: Callable[[PreTrainedTokenizerBase, str], Callable[[Tensor], Tensor]]
    tokens: tuple[str, ...]
    chat: bool
    describe: str


FORMATS: dict[str, PublicFormat] = {
    f.name: f
    for f in (
        PublicFormat(
            "math_shepherd",
            AutoModelForCausalLM,
            _shepherd_rows,
            _plus_over_minus,
            (SHEPHERD_TAG, GOOD, BAD),
            False,
            f"a causal LM whose tokenizer has the step tag '{SHEPHERD_TAG}' and no chat template",
        ),
        PublicFormat(
            "qwen_prm",
            AutoModelForTokenClassification,
            _qwen_rows,
            _label_one,
            (QWEN_SEPARATOR,),
            True,
            "a 2-label token-classification model (or *ForProcessRewardModel)",
        ),
        PublicFormat(
            "rlhflow",
            AutoModelForCausalLM,
            _rlhflow_rows,
            _plus_over_minus,
            (GOOD, BAD),
            True,
            "a causal LM with a chat template",
        ),
    )
}
"""The public conventions by ``prm.format`` name."""

PRM_FORMATS = ("auto", "creditrl", *FORMATS)
"""Every ``prm.format`` value: ``auto`` detects, ``creditrl`` is :class:`ProcessRewardModel`."""


class PublicPRM:
    """A public PRM (``model`` in convention ``fmt``) with :meth:`ProcessRewardModel.score`'s contract."""

    def __init__(self, model: PreTrainedModel, fmt: str) -> None:
        self.model = model.eval()
        self.format = FORMATS[fmt]
        # a causal LM computes vocabulary logits only at the read positions (a 128k vocabulary
        # over every token of a batch would dwarf the activations)
        self.keeps_logits = "logits_to_keep" in inspect.signature(model.forward).parameters

    @property
    def max_positions(self) -> int:
        return int(getattr(self.model.config, "max_position_embeddings", 0) or 1 << 30)

    @torch.no_grad()
    def score(
        self,
        tokenizer: PreTrainedTokenizerBase,
        examples: Sequence[tuple[str, Sequence[str]]],
        *,
        batch_size: int = 32,
        max_len: int | None = None,
    ) -> list[list[float]]:
        """Per example ``(prompt, steps)``, per step, the PRM's probability that the step is right
        (NaN where the step's tag lies past ``max_len``, default the model's maximum positions)."""
        max_len = self.max_positions if max_len is None else max_len
        read = self.format.reader(tokenizer, self.format.name)
        rows: list[tuple[int, Row]] = [
            (e, (ids[:max_len], [(k, t) for k, t in reads if t < max_len]))
            for e, (prompt, steps) in enumerate(examples)
            if steps
            for ids, reads in self.format.rows(tokenizer, prompt, steps)
        ]
        rows.sort(key=lambda r: len(r[1][0]))  # rows of similar length share a batch: less padding
        out = [[math.nan] * len(steps) for _, steps in examples]
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (tokenizer.eos_token_id or 0)
        device = next(self.model.parameters()).device
        for chunk in _batches(rows, batch_size):
            ids, mask = right_pad([r[0] for _, r in chunk], pad)
            picks = [(e, k, b, t) for b, (e, (_, reads)) in enumerate(chunk) for k, t in reads]
            if not picks:
                continue
            kept = sorted({t for *_, t in picks})
            column = {t: j for j, t in enumerate(kept)} if self.keeps_logits else {t: t for t in kept}
            extra = {"logits_to_keep": torch.tensor(kept, device=device)} if self.keeps_logits else {}
            result = self.model(input_ids=ids.to(device), attention_mask=mask.to(device), **extra)
            logits = result.logits if hasattr(result, "logits") else result[0]  # (B, L or len(kept), V)
            at = logits[[p[2] for p in picks], [column[p[3]] for p in picks]]  # (N, V)
            for (e, k, _, _), p in zip(picks, read(at).cpu().tolist()):
                out[e][k] = float(p)
        return out


def _batches(rows: list[tuple[int, Row]], batch_size: int) -> list[list[tuple[int, Row]]]:
    """Consecutive rows, at most ``batch_size`` and :data:`TOKENS_PER_CALL` padded tokens a batch
    (rows sorted by length, so the last row of a batch is its longest)."""
    out: list[list[tuple[int, Row]]] = []
    for row in rows:
        if out and len(out[-1]) < batch_size and (len(out[-1]) + 1) * len(row[1][0]) <= TOKENS_PER_CALL:
            out[-1].append(row)
        else:
            out.append([row])
    return out


def _load_tokenizer(path: str | Path) -> PreTrainedTokenizerBase:
    try:
        return AutoTokenizer.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f"reward.prm: '{path}' has no tokenizer that loads ({first})") from exc


def _has_chat_template(tokenizer: PreTrainedTokenizerBase) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def _single(tokenizer: PreTrainedTokenizerBase, text: str) -> bool:
    try:
        token_id(tokenizer, text, "auto")
    except ConfigError:
        return False
    return True


def detect_format(path: str | Path, tokenizer: PreTrainedTokenizerBase | None = None) -> str:
    """The ``prm.format`` of the model saved at ``path``, from its files: ``creditrl`` (a
    ``prm_config.json``), ``qwen_prm`` (a 2-label token-classification ``config.json``, or a
    ``*ForProcessRewardModel``), ``rlhflow`` (a causal LM with a chat template), ``math_shepherd``
    (a causal LM without one whose tokenizer has the tag ``ки``).

    Raises:
        ConfigError: one line, when the model matches none of them.
    """
    path = Path(path)
    if (path / CONFIG_FILE).exists():
        return "creditrl"
    config_file = path / "config.json"
    config = json.loads(config_file.read_text()) if config_file.exists() else {}
    archs = [str(a) for a in config.get("architectures") or []]
    labels = len(config.get("id2label") or {}) or config.get("num_labels", 2)  # 2 is the default, not saved
    if any(a.endswith("ForProcessRewardModel") for a in archs) or (
        any(a.endswith("ForTokenClassification") for a in archs) and labels == 2
    ):
        return "qwen_prm"
    if any(a.endswith("ForCausalLM") for a in archs):
        tok = tokenizer or _load_tokenizer(path)
        if _has_chat_template(tok) and _single(tok, GOOD) and _single(tok, BAD):
            return "rlhflow"
        if _single(tok, SHEPHERD_TAG) and _single(tok, GOOD) and _single(tok, BAD):
            return "math_shepherd"
    found = ", ".join(archs) or "no config.json architectures"
    kinds = "; ".join(f"{f.name}: {f.describe}" for f in FORMATS.values())
    raise ConfigError(
        f"reward.prm: '{path}' ({found}) matches no PRM convention (creditrl: a prm_config.json; {kinds}); "
        f"set prm.format to one of {', '.join(PRM_FORMATS[1:])} if it is one"
    )


def load_public(path: str | Path, fmt: str, device: str = "cpu") -> tuple[PublicPRM, PreTrainedTokenizerBase]:
    """The public PRM at ``path`` in convention ``fmt`` (a :data:`FORMATS` name) and its own
    tokenizer, the model on ``device`` (a ``policy.device`` name): float32 on the CPU, the saved
    dtype elsewhere. Checks that the tokenizer has the tokens the convention reads."""
    if fmt not in FORMATS:
        raise ConfigError(f"prm.format: unknown value {fmt!r}; valid: {', '.join(PRM_FORMATS)}")
    form = FORMATS[fmt]
    tokenizer = _load_tokenizer(path)
    for text in form.tokens:
        token_id(tokenizer, text, fmt)
    if form.chat and not _has_chat_template(tokenizer):
        raise ConfigError(f"prm.format={fmt}: the PRM's tokenizer at '{path}' has no chat template")
    target = resolve_device(device)
    config_file = Path(path) / "config.json"
    if not config_file.exists():
        raise ConfigError(f"prm.format={fmt}: '{path}' has no config.json (a model saved with save_pretrained)")
    config = json.loads(config_file.read_text())
    custom = fmt == "qwen_prm" and "ForProcessRewardModel" in str(config.get("architectures"))  # its head is code
    if custom and not config.get("auto_map"):
        raise ConfigError(f"prm.format={fmt}: '{config_file}' names {config['architectures']} but no auto_map code")
    kind = form.auto_class.__name__.removeprefix("AutoModel")  # ForCausalLM, ForTokenClassification
    archs = [str(a) for a in config.get("architectures") or []]
    if not custom and not any(a.endswith(kind) for a in archs):
        raise ConfigError(f"prm.format={fmt}: '{path}' holds {', '.join(archs) or 'no architecture'}, not a *{kind}")
    auto_class = AutoModel if custom else form.auto_class
    model = auto_class.from_pretrained(
        path,
        local_files_only=True,
        dtype=torch.float32 if target.type == "cpu" else "auto",
        trust_remote_code=custom,
    )
    return PublicPRM(model.to(target), fmt), tokenizer
