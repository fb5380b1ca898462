"""Tokenizer helpers: how every stage turns a prompt into token ids and a response back into text
(:func:`encode_prompt`, :func:`decode_response`), and the embedded character-level tokenizer.

The character tokenizer is a real Hugging Face ``PreTrainedTokenizerFast``. Every printable ASCII character is one
token, so token ``i`` of a response is character ``i``:
credit that lands on a token lands on a visible character. It saves and loads with
``save_pretrained`` / ``AutoTokenizer.from_pretrained`` like any hub tokenizer.
"""

from __future__ import annotations

import string
from collections.abc import Sequence
from typing import Any

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

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


def encode_prompt(
    tokenizer: PreTrainedTokenizerBase, prompt: str, messages: Sequence[tuple[str, str]] = ()
) -> list[int]:
    """The prompt's token ids. With a chat template (``policy.chat_template=auto`` finds one, and
    the template writes its own special tokens): the conversation ``messages`` (``(role,
    content)`` turns; none: one user turn holding ``prompt``) rendered with the generation prompt.
    Without one: bos + the tokens of the turns' contents joined by a blank line, or by a space
    when the tokenizer has no newline (the character tokenizer); ``prompt`` itself when there
    are no messages."""
    turns = list(messages) or [("user", prompt)]
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(
            [{"role": role, "content": content} for role, content in turns], add_generation_prompt=True, tokenize=False
        )
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])
    ids = tokenizer(_separator(tokenizer).join(content for _, content in turns), add_special_tokens=False)["input_ids"]
    return ([tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []) + list(ids)


def _separator(tokenizer: PreTrainedTokenizerBase) -> str:
    """A blank line, or a space when the tokenizer reads a newline as its unknown token."""
    unknown = tokenizer.unk_token_id
    newline = tokenizer("\n", add_special_tokens=False)["input_ids"]
    return " " if unknown is not None and unknown in newline else "\n\n"


def encode_problem(tokenizer: PreTrainedTokenizerBase, problem: Any) -> list[int]:
    """:func:`encode_prompt` of a :class:`~creditrl.tasks.base.Problem`'s prompt and conversation."""
    return encode_prompt(tokenizer, problem.prompt, getattr(problem, "messages", ()))


def decode_response(tokenizer: PreTrainedTokenizerBase, tokens: list[int]) -> str:
    return tokenizer.decode(tokens, skip_special_tokens=True)
