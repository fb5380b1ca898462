"""Tokenizer helpers: how every stage turns a prompt into token ids and a response back into text
(:func:`encode_prompt`, :func:`decode_response`), the prompt-length guard every encoded prompt
passes (:func:`set_prompt_limit`: a prompt over ``rollout.max_prompt_tokens`` is one error line
naming its row, before any engine sees it), and the embedded character-level tokenizer.

The character tokenizer is a real Hugging Face ``PreTrainedTokenizerFast`` (it saves and loads like
any hub tokenizer). Every printable ASCII character is one token, so token ``i`` of a response is
character ``i``: credit that lands on a token lands on a visible character.
"""

from __future__ import annotations

import string
from collections.abc import Sequence
from typing import Any

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

from creditrl.errors import ConfigError

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIAL_TOKENS = (PAD, BOS, EOS, UNK)
CHARACTERS = "".join(c for c in string.printable if c.isprintable())  # 95 chars incl. space


def build_char_tokenizer() -> PreTrainedTokenizerFast:
    """Build the character tokenizer (ids 0..3 are pad, bos, eos, unk; then printable ASCII).

    The pre-tokenizer isolates every character, the model maps each to an id, and the ``Fuse``
    decoder joins tokens without the spaces a word-level decoder would insert.
    """
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for ch in CHARACTERS:
        vocab.setdefault(ch, len(vocab))
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token=PAD,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )


DEFAULT_CONTEXT = 32768
"""The prompt limit of a model whose config states no context (``max_position_embeddings``)."""

_LIMIT_ATTR = "creditrl_max_prompt_tokens"
_PIECE = 1 << 16  # characters tokenised at once while a long prompt is counted


class PromptTooLong(ConfigError):
    """A prompt over the tokenizer's prompt limit (:func:`set_prompt_limit`), refused before any
    engine sees it: one line naming the problem (its file and row where it has them)."""


def set_prompt_limit(tokenizer: PreTrainedTokenizerBase, max_tokens: int) -> None:
    """Make :func:`encode_prompt` refuse a prompt of more than ``max_tokens`` tokens with this
    tokenizer (``rollout.max_prompt_tokens``; :func:`creditrl.policy.model.load_policy` sets it)."""
    setattr(tokenizer, _LIMIT_ATTR, int(max_tokens))


def prompt_limit(tokenizer: PreTrainedTokenizerBase) -> int | None:
    """The tokenizer's prompt limit in tokens; None when none was set."""
    return getattr(tokenizer, _LIMIT_ATTR, None)


def _pieces(text: str) -> list[str]:
    """``text`` cut into pieces of at most :data:`_PIECE` characters, each (where it can) after a
    space or newline, so that tokenising the pieces gives the tokens of the whole to a token or so."""
    out, start = [], 0
    while start < len(text):
        end = min(start + _PIECE, len(text))
        if end < len(text):
            cut = max(text.rfind(" ", start, end), text.rfind("\n", start, end))
            end = cut + 1 if cut > start else end
        out.append(text[start:end])
        start = end
    return out


def _over_limit(tokenizer: PreTrainedTokenizerBase, text: str, limit: int) -> int | None:
    """The token count of ``text`` counted piece by piece (:func:`_pieces`), stopped as soon as it
    passes ``limit``: the count so far when it does, else None. Memory stays that of one piece,
    whatever the length of ``text``."""
    if len(text) <= _PIECE:
        return None
    count = 0
    for piece in _pieces(text):
        count += len(tokenizer(piece, add_special_tokens=False)["input_ids"])
        if count > limit:
            return count
    return None


def _refuse(count: int, limit: int, text: str, exact: bool) -> PromptTooLong:
    size = f"{count} tokens" if exact else f"at least {count} tokens ({len(text)} characters)"
    return PromptTooLong(
        f"the prompt is {size}, over rollout.max_prompt_tokens={limit}; shorten it, or raise "
        "rollout.max_prompt_tokens (at most the policy's context)"
    )


def encode_prompt(
    tokenizer: PreTrainedTokenizerBase, prompt: str, messages: Sequence[tuple[str, str]] = ()
) -> list[int]:
    """The prompt's token ids. With a chat template (``policy.chat_template=auto`` finds one, and
    the template writes its own special tokens): the conversation ``messages`` (``(role,
    content)`` turns; none: one user turn holding ``prompt``) rendered with the generation prompt.
    Without one: bos + the tokens of the turns' contents joined by a blank line, or by a space
    when the tokenizer has no newline (the character tokenizer); ``prompt`` itself when there
    are no messages.

    Raises:
        PromptTooLong: The prompt has more tokens than the tokenizer's limit
            (:func:`set_prompt_limit`); a long text is counted piece by piece and refused once
            past the limit, never tokenised whole.
    """
    turns = list(messages) or [("user", prompt)]
    limit = prompt_limit(tokenizer)
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(
            [{"role": role, "content": content} for role, content in turns], add_generation_prompt=True, tokenize=False
        )
        bos = []
    else:
        text = _separator(tokenizer).join(content for _, content in turns)
        bos = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []
    if limit is not None and (count := _over_limit(tokenizer, text, limit - len(bos))) is not None:
        raise _refuse(count + len(bos), limit, text, exact=False)
    ids = bos + list(tokenizer(text, add_special_tokens=False)["input_ids"])
    if limit is not None and len(ids) > limit:
        raise _refuse(len(ids), limit, text, exact=True)
    return ids


def _separator(tokenizer: PreTrainedTokenizerBase) -> str:
    """A blank line, or a space when the tokenizer reads a newline as its unknown token."""
    unknown = tokenizer.unk_token_id
    newline = tokenizer("\n", add_special_tokens=False)["input_ids"]
    return " " if unknown is not None and unknown in newline else "\n\n"


def _where(problem: Any) -> str:
    """A problem's place for messages: ``FILE, line N`` (JSON Lines) or ``FILE, row N`` where its
    meta has them, else the start of its prompt."""
    meta = getattr(problem, "meta", None) or {}
    if "file" in meta and "row" in meta:
        unit = "line" if str(meta["file"]).lower().endswith(".jsonl") else "row"
        return f"{meta['file']}, {unit} {meta['row']}"
    start = " ".join(str(problem.prompt)[:40].split())
    return f"the problem whose prompt starts {start!r}"


def encode_problem(tokenizer: PreTrainedTokenizerBase, problem: Any) -> list[int]:
    """:func:`encode_prompt` of a :class:`~creditrl.tasks.base.Problem`'s prompt and conversation.

    Raises:
        PromptTooLong: Over the prompt limit: one line naming the problem's file and row (or
            the start of its prompt).
    """
    try:
        return encode_prompt(tokenizer, problem.prompt, getattr(problem, "messages", ()))
    except PromptTooLong as exc:
        raise PromptTooLong(f"{_where(problem)}: {exc}") from None


def decode_response(tokenizer: PreTrainedTokenizerBase, tokens: list[int]) -> str:
    return tokenizer.decode(tokens, skip_special_tokens=True)
