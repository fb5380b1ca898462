"""The trajectory batch (layout, padding invariance of the log-probs, select) and segmenters."""

import math

import pytest
import torch

from creditrl.policy.engines import Generation, HFEngine, SamplingParams
from creditrl.policy.tokenizer import build_char_tokenizer
from creditrl.rollout.batch import (
    TrajectoryBatch,
    batch_from_generation,
    response_logits,
    token_entropy,
    token_logprobs,
)
from creditrl.rollout.segment import (
    TokenTexts,
    after_text,
    block_segmenter,
    key_token_segmenter,
    last_token_segmenter,
    load_callable,
    segment,
    separator_segmenter,
    token_segmenter,
)

PAD = 0


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


@pytest.fixture(scope="module")
def model(peaked_tiny):
    """A tiny Llama with peaked, context-dependent next-token distributions (see conftest)."""
    return peaked_tiny(1, 5)[0]


def hand_generation():
    return Generation(
        prompt_index=[0, 0, 1, 2],
        prompt_ids=[[1, 10, 11], [1, 10, 11], [1], [1, 20, 21, 22, 23]],
        tokens=[[40, 41, 2], [42], [], [43, 44, 45, 46]],
        logprobs=[[-0.5, -1.0, -0.25], [-2.0], [], [-0.1, -0.2, -0.3, -0.4]],
        finished=[True, False, False, False],
    )


# ----------------------------------------------------------------------------- layout


def test_batch_from_generation_layout():
    b = batch_from_generation(hand_generation(), [0, 0, 1, 2], pad_id=PAD)
    assert b.size == 4
    assert b.prompt_ids.tolist() == [
        [0, 0, 1, 10, 11],
        [0, 0, 1, 10, 11],
        [0, 0, 0, 0, 1],
        [1, 20, 21, 22, 23],
    ]
    assert b.prompt_mask.tolist() == [[0, 0, 1, 1, 1], [0, 0, 1, 1, 1], [0, 0, 0, 0, 1], [1, 1, 1, 1, 1]]
    assert b.response_ids.tolist() == [[40, 41, 2, 0], [42, 0, 0, 0], [0, 0, 0, 0], [43, 44, 45, 46]]
    assert b.response_lengths.tolist() == [3, 1, 0, 4]
    assert b.response_mask.dtype == torch.bool
    assert b.response_mask.tolist() == [
        [True, True, True, False],
        [True, False, False, False],
        [False, False, False, False],
        [True, True, True, True],
    ]
    expected = [[-0.5, -1.0, -0.25, 0.0], [-2.0, 0.0, 0.0, 0.0], [0.0] * 4, [-0.1, -0.2, -0.3, -0.4]]
    assert torch.equal(b.old_logprobs, torch.tensor(expected, dtype=torch.float32))
    assert b.old_logprobs.dtype == torch.float32
    assert float(b.old_logprobs[~b.response_mask].abs().sum()) == 0.0
    assert b.group_ids.tolist() == [0, 0, 1, 2] and b.group_ids.dtype == torch.long
    assert b.finished.tolist() == [True, False, False, False] and b.finished.dtype == torch.bool
    assert b.extras == {}


def test_all_empty_responses_give_width_one():
    gen = Generation(prompt_index=[0], prompt_ids=[[1]], tokens=[[]], logprobs=[[]], finished=[False])
    b = batch_from_generation(gen, [0], pad_id=PAD)
    assert tuple(b.response_ids.shape) == (1, 1)
    assert b.response_mask.tolist() == [[False]]


def test_group_ids_count_mismatch_is_an_error():
    with pytest.raises(ValueError, match="group_ids has 3 entries for 4 samples"):
        batch_from_generation(hand_generation(), [0, 0, 1], pad_id=PAD)


# ----------------------------------------------------------------------------- log-probs


def sampled_batch(model, tok):
    """Samples of mixed lengths: the engine's eos is the token this policy emits most often."""
    prompts = [[1, 5, 6], [1], [1, 20, 30, 40, 50, 60, 70]]
    params = SamplingParams(max_new_tokens=9)
    probe = HFEngine(model, eos_id=-1, pad_id=tok.pad_token_id).generate(
        prompts, 3, params, generator=torch.Generator().manual_seed(1)
    )
    stop = torch.tensor(sum(probe.tokens, [])).bincount().argmax().item()
    engine = HFEngine(model, eos_id=stop, pad_id=tok.pad_token_id)
    gen = engine.generate(prompts, 3, params, generator=torch.Generator().manual_seed(1))
    return gen, batch_from_generation(gen, gen.prompt_index, tok.pad_token_id)


def test_batched_logprobs_equal_unpadded_per_sample_forward(model, tok):
    gen, b = sampled_batch(model, tok)
    lengths = b.response_lengths.tolist()
    assert len(set(lengths)) > 1  # responses of different lengths: right padding is exercised
    with torch.no_grad():
        logits = response_logits(model, b)
        logp = token_logprobs(logits, b.response_ids)
    assert logits.shape == (*b.response_ids.shape, len(tok)) and logits.dtype == torch.float32
    for i, (prompt, toks) in enumerate(zip(gen.prompt_ids, gen.tokens)):
        with torch.no_grad():
            alone = model(input_ids=torch.tensor([prompt + toks])).logits[0]
        pred = alone[len(prompt) - 1 : len(prompt) - 1 + len(toks)]
        assert torch.allclose(logits[i, : len(toks)], pred, atol=1e-5)
        ref = torch.log_softmax(pred, -1).gather(-1, torch.tensor(toks)[:, None]).squeeze(-1)
        assert torch.allclose(logp[i, : len(toks)], ref, atol=1e-5)
    # the engine's log-probs (old policy) agree with the learner's recomputation
    assert torch.allclose(logp[b.response_mask], b.old_logprobs[b.response_mask], atol=1e-5)


def test_logprobs_ignore_what_sits_in_padding(model, tok):
    _, b = sampled_batch(model, tok)
    with torch.no_grad():
        base = token_logprobs(response_logits(model, b), b.response_ids)
    g = torch.Generator().manual_seed(9)
    noisy = b.select(torch.arange(b.size))
    noisy.prompt_ids = torch.where(
        b.prompt_mask.bool(), b.prompt_ids, torch.randint(4, 99, b.prompt_ids.shape, generator=g)
    )
    noisy.response_ids = torch.where(
        b.response_mask, b.response_ids, torch.randint(4, 99, b.response_ids.shape, generator=g)
    )
    with torch.no_grad():
        other = token_logprobs(response_logits(model, noisy), noisy.response_ids)
    assert torch.allclose(base[b.response_mask], other[b.response_mask], atol=1e-5)


def test_token_logprobs_and_entropy_by_hand():
    logits = torch.tensor([[[0.0, 0.0, 0.0, 0.0], [math.log(3.0), 0.0, -1e4, -1e4]]])  # (1, 2, 4)
    lp = token_logprobs(logits, torch.tensor([[2, 0]]))
    assert torch.allclose(lp, torch.tensor([[math.log(0.25), math.log(0.75)]]))
    ent = token_entropy(logits)
    h2 = -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))
    assert torch.allclose(ent, torch.tensor([[math.log(4.0), h2]]), atol=1e-6)


# ----------------------------------------------------------------------------- select


def test_select_takes_rows_and_extras_in_order():
    b = batch_from_generation(hand_generation(), [0, 0, 1, 2], pad_id=PAD)
    b.extras["completions"] = ["a", "b", "c", "d"]
    b.extras["problems"] = [10, 11, 12, 13]
    rows = torch.tensor([3, 0, 0])
    s = b.select(rows)
    assert isinstance(s, TrajectoryBatch) and s.size == 3
    for name in (
        "prompt_ids",
        "prompt_mask",
        "response_ids",
        "response_lengths",
        "response_mask",
        "old_logprobs",
        "group_ids",
        "finished",
    ):
        assert torch.equal(getattr(s, name), getattr(b, name)[rows]), name
    assert s.extras == {"completions": ["d", "a", "a"], "problems": [13, 10, 10]}
    assert s.response_lengths.tolist() == [4, 3, 3]
    # a copy: editing the sub-batch leaves the batch alone
    s.old_logprobs.zero_()
    assert float(b.old_logprobs[0, 0]) == -0.5


# ----------------------------------------------------------------------------- segment


def encode(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


def pack(tok, rows):
    """Right-pad id lists into (ids, lengths)."""
    width = max(1, max(len(r) for r in rows))
    ids = torch.full((len(rows), width), PAD, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r, dtype=torch.long)
    return ids, torch.tensor([len(r) for r in rows])


def test_segment_on_separator(tok):
    eos = tok.eos_token_id
    rows = [
        encode(tok, "3*2=6;7+6=13;#13") + [eos],  # finished
        encode(tok, "1+2=3;") + [eos],  # eos-only tail
        encode(tok, "1+2=3;4-1="),  # truncated mid-step
        encode(tok, "1+2=3;5*5=25;"),  # truncated right after a separator
        [],  # empty response
        encode(tok, "#7") + [eos],  # no separator at all
    ]
    ids, lengths = pack(tok, rows)
    seg = segment(ids, lengths, TokenTexts(tok), separator_segmenter(";"))

    assert seg.ends == [[5, 12, 16], [5, 6], [5, 9], [5, 12], [], [2]]
    assert seg.texts == [
        ["3*2=6;", "7+6=13;", "#13"],
        ["1+2=3;", ""],
        ["1+2=3;", "4-1="],
        ["1+2=3;", "5*5=25;"],
        [],
        ["#7"],
    ]
    assert seg.end_mask.dtype == torch.bool and seg.end_mask.shape == ids.shape
    for i, ends in enumerate(seg.ends):
        assert seg.end_mask[i].nonzero().squeeze(-1).tolist() == ends
        # step texts concatenate to the response text (specials decode to nothing)
        assert "".join(seg.texts[i]) == tok.decode(rows[i], skip_special_tokens=True)
        # every step end is a ';' or the last valid token, never padding
        for e in ends:
            assert e < lengths[i]
            assert tok.decode([rows[i][e]]) == ";" or e == lengths[i] - 1
    assert not seg.end_mask[4].any()


def test_user_segment_function_is_cleaned_and_closed(tok):
    row = encode(tok, "ab=cd=ef")
    ids, lengths = pack(tok, [row, encode(tok, "x")])
    seen = []

    def cut(texts):
        seen.append(list(texts))
        # unsorted, duplicated and out-of-range indices must be tolerated
        return [5, 2, 2, -1, 100] if len(texts) > 1 else []

    seg = segment(ids, lengths, TokenTexts(tok), cut)
    assert seen == [list("ab=cd=ef"), ["x"]]  # the function sees per-token texts of valid tokens
    assert seg.ends == [[2, 5, 7], [0]]
    assert seg.texts == [["ab=", "cd=", "ef"], ["x"]]


def test_separator_segmenter_rejects_empty_separator():
    with pytest.raises(ValueError, match="separator must be a non-empty string"):
        separator_segmenter("")


def test_separator_segmenter_matches_tokens_containing_the_separator():
    fn = separator_segmenter(";")
    assert fn(["a", ";", "b;c", "", ";"]) == [1, 2, 4]


def test_token_texts_specials_are_empty(tok):
    texts = TokenTexts(tok)
    assert [texts(i) for i in (0, 1, 2, 3)] == ["", "", "", ""]
    assert texts(encode(tok, ";")[0]) == ";"
    assert texts(encode(tok, " ")[0]) == " "


def test_block_token_and_last_token_segmenters():
    texts = list("abcdefg")
    assert block_segmenter(3)(texts) == [2, 5]
    assert block_segmenter(1)(texts) == list(range(7))
    assert block_segmenter(10)(texts) == []
    assert token_segmenter()(texts) == list(range(7))
    assert last_token_segmenter()(texts) == [6]
    assert last_token_segmenter()([]) == [] and token_segmenter()([]) == [] and block_segmenter(2)([]) == []
    with pytest.raises(ValueError, match="block size must be >= 1, got 0"):
        block_segmenter(0)


def test_key_token_segmenter_and_after_text():
    after_eq = after_text("=")
    texts = ["1", "+", "2", "=", "3", ";", "x=", "4", "5"]
    assert [i for i in range(len(texts)) if after_eq(texts, i)] == [4, 7]
    assert not after_eq(["=", "1"], 0)  # the first token has no previous token
    assert key_token_segmenter(after_eq)(texts) == [4, 7]
    assert key_token_segmenter(lambda t, i: t[i].isdigit())(texts) == [0, 2, 4, 7, 8]
    with pytest.raises(ValueError, match="after_text needs a non-empty string"):
        after_text("")


def test_builtin_segmenters_through_segment(tok):
    """The last valid token closes the final span whatever the segmenter; blocks restart per row."""
    eos = tok.eos_token_id
    rows = [encode(tok, "1+2=3;#3") + [eos], encode(tok, "12=")]
    ids, lengths = pack(tok, rows)
    texts_of = TokenTexts(tok)
    assert segment(ids, lengths, texts_of, block_segmenter(3)).ends == [[2, 5, 8], [2]]
    assert segment(ids, lengths, texts_of, last_token_segmenter()).texts == [["1+2=3;#3"], ["12="]]
    key = segment(ids, lengths, texts_of, key_token_segmenter(after_text("=")))
    assert key.ends == [[4, 8], [2]] and key.texts == [["1+2=3", ";#3"], ["12="]]
    assert segment(ids, lengths, texts_of, token_segmenter()).texts[1] == ["1", "2", "="]


def test_segment_checks_shapes(tok):
    with pytest.raises(
        ValueError, match=r"expected response_ids \(B, T\) and response_lengths \(B,\), got \(2, 3\) and \(3,\)"
    ):
        segment(torch.zeros(2, 3, dtype=torch.long), torch.tensor([1, 2, 3]), TokenTexts(tok), token_segmenter())


def test_load_callable_imports_and_explains_failures():
    assert load_callable("creditrl.rollout.segment:token_segmenter") is token_segmenter
    from creditrl.tasks.arithmetic import ArithmeticTask

    assert load_callable("creditrl.tasks.arithmetic:ArithmeticTask.check_outcome") is ArithmeticTask.check_outcome
    with pytest.raises(
        ValueError, match=r"'creditrl.rollout.segment.token_segmenter' is not of the form 'package.module:attribute'"
    ):
        load_callable("creditrl.rollout.segment.token_segmenter")
    with pytest.raises(ValueError, match=r"':f' is not of the form"):
        load_callable(":f")
    with pytest.raises(
        ValueError, match=r"cannot import module 'creditrl.no_such_module' named in 'creditrl.no_such_module:f'"
    ):
        load_callable("creditrl.no_such_module:f")
    with pytest.raises(
        ValueError, match=r"'creditrl.rollout.segment:nope': 'creditrl.rollout.segment' has no attribute 'nope'"
    ):
        load_callable("creditrl.rollout.segment:nope")
    with pytest.raises(ValueError, match=r"'creditrl.tasks.arithmetic:SPLITS' is not callable \(it is a tuple\)"):
        load_callable("creditrl.tasks.arithmetic:SPLITS")


def test_step_stop_ids_are_the_tokens_whose_text_holds_the_separator():
    from creditrl.policy.tokenizer import build_char_tokenizer
    from creditrl.rollout.segment import step_stop_ids

    tok = build_char_tokenizer()
    ids = step_stop_ids(tok, ";")
    assert [tok.decode([i]) for i in ids] == [";"]
    with pytest.raises(ValueError, match="no token of the tokenizer contains the step separator '@@'"):
        step_stop_ids(tok, "@@")
