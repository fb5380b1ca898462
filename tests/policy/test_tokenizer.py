"""The character tokenizer: one token per printable ASCII char, exact round trips, HF save/load."""

import random

import pytest
from transformers import AutoTokenizer

from creditrl.policy.tokenizer import CHARACTERS, build_char_tokenizer

PRINTABLE = [chr(c) for c in range(0x20, 0x7F)]  # space .. '~', the 95 printable ASCII chars


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


def encode(tokenizer, text):
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def random_strings(seed, count=200, max_len=40):
    rng = random.Random(seed)
    out = ["", " ", "  a  b  ", " leading", "trailing ", "a;b=c;#-12"]
    for _ in range(count):
        out.append("".join(rng.choice(PRINTABLE) for _ in range(rng.randint(0, max_len))))
    return out


def test_alphabet_is_exactly_printable_ascii():
    assert len(CHARACTERS) == 95
    assert sorted(CHARACTERS) == PRINTABLE


def test_every_printable_char_is_one_distinct_non_special_token(tok):
    ids = []
    for ch in PRINTABLE:
        enc = encode(tok, ch)
        assert len(enc) == 1, f"{ch!r} -> {enc}"
        ids.append(enc[0])
    assert len(set(ids)) == 95
    assert min(ids) == 4 and max(ids) == 98  # right after the 4 specials, no gaps
    assert tok.unk_token_id not in ids
    assert len(tok) == 99


def test_special_ids(tok):
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id, tok.unk_token_id) == (0, 1, 2, 3)
    assert tok.convert_ids_to_tokens([0, 1, 2, 3]) == ["<pad>", "<bos>", "<eos>", "<unk>"]
    assert tok.padding_side == "left"


def test_token_i_is_char_i_and_round_trip(tok):
    for s in random_strings(seed=0):
        ids = encode(tok, s)
        assert len(ids) == len(s)
        assert [tok.decode([i]) for i in ids] == list(s)
        assert tok.decode(ids) == s


def test_no_special_tokens_added_by_default(tok):
    # a prompt must be prefixed with bos explicitly; the tokenizer adds nothing on its own
    assert tok("12+3=")["input_ids"] == encode(tok, "12+3=")


def test_decode_skips_specials_when_asked(tok):
    ids = [tok.bos_token_id] + encode(tok, "a b") + [tok.eos_token_id, tok.pad_token_id]
    assert tok.decode(ids, skip_special_tokens=True) == "a b"


@pytest.mark.parametrize("text", ["é", "€", "\u00a0", "日本"])
def test_unknown_chars_map_to_unk(tok, text):
    assert encode(tok, text) == [tok.unk_token_id] * len(text)


def test_unknown_char_inside_text_is_one_unk(tok):
    ids = encode(tok, "aéb")
    assert ids == [encode(tok, "a")[0], tok.unk_token_id, encode(tok, "b")[0]]


def test_save_and_autotokenizer_round_trip(tok, tmp_path):
    tok.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path, local_files_only=True)
    assert (loaded.pad_token_id, loaded.bos_token_id, loaded.eos_token_id, loaded.unk_token_id) == (0, 1, 2, 3)
    assert len(loaded) == len(tok)
    assert loaded.padding_side == "left"
    assert loaded.get_vocab() == tok.get_vocab()
    for s in random_strings(seed=1, count=50) + ["aéb"]:
        ids = encode(tok, s)
        assert encode(loaded, s) == ids
        assert loaded.decode(ids) == tok.decode(ids)
    for s in random_strings(seed=2, count=50):
        assert loaded.decode(encode(loaded, s)) == s
