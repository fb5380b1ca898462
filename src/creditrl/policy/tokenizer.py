"""A character-level tokenizer that is a real Hugging Face ``PreTrainedTokenizerFast``.

Every printable ASCII character is one token, so token ``i`` of a response is character ``i``:
credit that lands on a token lands on a visible character. It saves and loads with
``save_pretrained`` / ``AutoTokenizer.from_pretrained`` like any hub tokenizer.
"""

from __future__ import annotations

import string

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

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
