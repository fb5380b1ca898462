"""Placement of span scores into (B, T) rewards, the granularity registry, and the scoring stage's
sources, granularity checks and error policies."""

import math
import pickle
import random
import sys
import textwrap

import pytest
import torch

from creditrl.policy.tokenizer import build_char_tokenizer
from creditrl.rewards import (
    GRANULARITIES,
    REWARD_SOURCES,
    RewardSource,
    check_granularity,
    get_granularity,
    get_source,
    make_segmenter,
    place,
    register_granularity,
    register_source,
    score_batch,
)
from creditrl.rollout.segment import TokenTexts, segment
from creditrl.tasks import make_task
from creditrl.tasks.bounded import UserFunctionError


def bool_mask(rows):
    return torch.tensor(rows, dtype=torch.bool)


def last_mask(mask):
    """True on each row's last valid token (the sequence granularity's span end)."""
    out = torch.zeros_like(mask)
    for b in range(mask.shape[0]):
        valid = [t for t in range(mask.shape[1]) if mask[b, t]]
        if valid:
            out[b, valid[-1]] = True
    return out


# ----------------------------------------------------------------------------- place: by hand


def test_sequence_scores_land_on_the_last_valid_token():
    mask = bool_mask([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [0, 0, 0, 0, 0], [1, 0, 1, 1, 0], [1, 0, 0, 0, 0]])
    rewards, placed = place([[2.5], [-1.0], [], [0.0], [3.0]], end_mask=last_mask(mask), response_mask=mask)
    assert rewards.dtype == torch.float32 and placed.dtype == torch.bool
    assert rewards.tolist() == [
        [0, 0, 2.5, 0, 0],
        [0, 0, 0, 0, -1.0],
        [0, 0, 0, 0, 0],  # an empty row receives nothing
        [0, 0, 0, 0.0, 0],  # a hole in the mask: still the last valid token
        [3.0, 0, 0, 0, 0],
    ]
    assert placed.tolist() == [
        [False, False, True, False, False],
        [False, False, False, False, True],
        [False] * 5,
        [False, False, False, True, False],  # a placed 0.0 is still placed
        [True, False, False, False, False],
    ]


def test_kth_score_on_kth_end_and_none_places_nothing():
    mask = bool_mask([[1, 1, 1, 1, 1, 0], [1, 1, 1, 0, 0, 0], [0, 0, 0, 0, 0, 0]])
    ends = bool_mask([[0, 1, 0, 1, 1, 0], [0, 0, 1, 0, 0, 0], [0, 0, 0, 0, 0, 0]])
    rewards, placed = place([[0.5, None, -2.0], [4.0], []], end_mask=ends, response_mask=mask)
    assert rewards.tolist() == [[0, 0.5, 0, 0, -2.0, 0], [0, 0, 4.0, 0, 0, 0], [0] * 6]
    assert placed.tolist() == [
        [False, True, False, False, True, False],
        [False, False, True, False, False, False],
        [False] * 6,
    ]


def test_ends_outside_the_mask_are_ignored():
    mask = bool_mask([[1, 1, 0, 1, 0, 0]])
    ends = bool_mask([[0, 1, 1, 1, 0, 1]])  # ends at 2 and 5 are masked out
    rewards, placed = place([[1.0, 2.0]], end_mask=ends, response_mask=mask)
    assert rewards.tolist() == [[0, 1.0, 0, 2.0, 0, 0]]
    assert placed.tolist() == [[False, True, False, True, False, False]]


def test_fallback_fills_an_unscored_last_token_only():
    mask = bool_mask([[1, 1, 1, 1, 0], [1, 1, 1, 0, 0], [1, 1, 0, 1, 0], [0, 0, 0, 0, 0], [1, 1, 0, 0, 0]])
    ends = bool_mask([[0, 1, 0, 1, 0], [0, 1, 1, 0, 0], [1, 0, 0, 1, 0], [0, 0, 0, 0, 0], [1, 1, 0, 0, 0]])
    scores = [[1.0, None], [0.5, 0.25], [None, None], [], [None, None]]
    rewards, placed = place(scores, end_mask=ends, response_mask=mask, fallback=[9.0, 9.0, -3.0, 9.0, None])
    assert rewards.tolist() == [
        [0, 1.0, 0, 9.0, 0],  # last token unscored (None): the fallback lands there
        [0, 0.5, 0.25, 0, 0],  # last token already scored: fallback unused
        [0, 0, 0, -3.0, 0],  # after a hole, on the last valid token
        [0] * 5,  # empty row: nothing
        [0] * 5,  # fallback None for this row
    ]
    assert placed.tolist() == [
        [False, True, False, True, False],
        [False, True, True, False, False],
        [False, False, False, True, False],
        [False] * 5,
        [False] * 5,
    ]


# ----------------------------------------------------------------------------- place: vs a loop


def reference_place(scores, end_mask, response_mask, fallback=None):
    b_n, t_n = response_mask.shape
    rewards = [[0.0] * t_n for _ in range(b_n)]
    placed = [[False] * t_n for _ in range(b_n)]
    for b in range(b_n):
        ends = [t for t in range(t_n) if end_mask[b, t] and response_mask[b, t]]
        assert len(ends) == len(scores[b])
        for t, s in zip(ends, scores[b]):
            if s is not None:
                rewards[b][t], placed[b][t] = float(s), True
        valid = [t for t in range(t_n) if response_mask[b, t]]
        if fallback is not None and fallback[b] is not None and valid and not placed[b][valid[-1]]:
            rewards[b][valid[-1]], placed[b][valid[-1]] = float(fallback[b]), True
    return torch.tensor(rewards, dtype=torch.float32), torch.tensor(placed)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("use_fallback", [False, True])
def test_place_matches_reference_loop(seed, use_fallback):
    rng = random.Random(seed)
    g = torch.Generator().manual_seed(seed)
    b_n, t_n = rng.randint(1, 12), rng.randint(1, 15)
    lengths = torch.randint(0, t_n + 1, (b_n,), generator=g)
    response_mask = (torch.arange(t_n)[None, :] < lengths[:, None]) & (torch.rand(b_n, t_n, generator=g) > 0.2)
    end_mask = torch.rand(b_n, t_n, generator=g) < 0.4
    n_ends = (end_mask & response_mask).sum(1).tolist()
    scores = [[None if rng.random() < 0.3 else rng.gauss(0, 1) for _ in range(n)] for n in n_ends]
    fallback = [None if rng.random() < 0.2 else rng.gauss(0, 1) for _ in range(b_n)] if use_fallback else None
    rewards, placed = place(scores, end_mask=end_mask, response_mask=response_mask, fallback=fallback)
    ref_r, ref_p = reference_place(scores, end_mask, response_mask, fallback)
    assert torch.equal(placed, ref_p)
    assert torch.allclose(rewards, ref_r)
    assert not (placed & ~response_mask).any() and not rewards[~response_mask].any()
    # what sits in end_mask on masked tokens cannot change the result
    noisy = end_mask | (~response_mask & (torch.rand(b_n, t_n, generator=g) < 0.5))
    again = place(scores, end_mask=noisy, response_mask=response_mask, fallback=fallback)
    assert torch.equal(again[0], rewards) and torch.equal(again[1], placed)


# ----------------------------------------------------------------------------- place: checks


def test_count_mismatch_names_the_row():
    mask = bool_mask([[1, 1, 1], [1, 1, 1]])
    ends = bool_mask([[0, 0, 1], [1, 1, 1]])
    with pytest.raises(ValueError, match="row 1: 2 scores for 3 span ends"):
        place([[1.0], [1.0, 2.0]], end_mask=ends, response_mask=mask)
    with pytest.raises(ValueError, match="row 0: 0 scores for 1 span ends"):
        place([[], [1.0, 2.0, 3.0]], end_mask=ends, response_mask=mask)


def test_place_checks_shapes_dtypes_and_row_counts():
    ones = bool_mask([[1, 1, 1]])
    with pytest.raises(ValueError, match=r"response_mask must be bool \(B, T\), got torch.float32"):
        place([[1.0]], end_mask=ones, response_mask=torch.ones(1, 3))
    with pytest.raises(ValueError, match=r"response_mask must be bool \(B, T\)"):
        place([[1.0]], end_mask=ones, response_mask=torch.ones(3, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"end_mask must be bool \(1, 3\), got torch.bool \(1, 2\)"):
        place([[1.0]], end_mask=bool_mask([[1, 1]]), response_mask=ones)
    with pytest.raises(ValueError, match="got scores for 1 responses, response_mask has 2 rows"):
        place([[1.0]], end_mask=bool_mask([[1], [1]]), response_mask=bool_mask([[1], [1]]))
    with pytest.raises(ValueError, match="got 2 fallback scores, response_mask has 1 rows"):
        place([[1.0, 1.0, 1.0]], end_mask=ones, response_mask=ones, fallback=[0.0, 1.0])


# ----------------------------------------------------------------------------- granularity registry


def test_registry_names_and_fallback_flag():
    assert set(GRANULARITIES) == {"sequence", "step", "segment", "token", "key_token"}
    assert [n for n, g in GRANULARITIES.items() if g.uses_fallback] == ["key_token"]
    assert all(g.doc for g in GRANULARITIES.values())
    with pytest.raises(ValueError, match="granularity 'token' is already registered"):
        register_granularity("token")(lambda opts: None)
    with pytest.raises(
        ValueError, match="unknown granularity 'word'; valid: key_token, segment, sequence, step, token"
    ):
        get_granularity("word")
    with pytest.raises(ValueError, match="unknown granularity 'word'"):
        make_segmenter("word")


def reference_ends(texts, granularity, *, sep=";", k=3, key_after="="):
    n = len(texts)
    if granularity == "sequence":
        ends = []
    elif granularity == "step":
        ends = [i for i in range(n) if sep in texts[i]]
    elif granularity == "segment":
        ends = [i for i in range(n) if (i + 1) % k == 0]
    elif granularity == "token":
        ends = list(range(n))
    else:
        ends = [i for i in range(1, n) if texts[i - 1].endswith(key_after)]
    if n and (not ends or ends[-1] != n - 1):
        ends.append(n - 1)
    return ends


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


def random_rows(tok, rng, n):
    """Char-token rows of random arithmetic-ish text, some ending with eos, some empty."""
    rows = []
    for _ in range(n):
        text = "".join(rng.choice("0123456789+-*=;#=;") for _ in range(rng.randint(0, 24)))
        row = tok(text, add_special_tokens=False)["input_ids"]
        rows.append(row + [tok.eos_token_id] if rng.random() < 0.5 else row)
    width = max(1, max(len(r) for r in rows))
    ids = torch.full((n, width), tok.pad_token_id, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r, dtype=torch.long)
    return rows, ids, torch.tensor([len(r) for r in rows])


@pytest.mark.parametrize("granularity", ["sequence", "step", "segment", "token", "key_token"])
@pytest.mark.parametrize("seed", range(3))
def test_each_granularity_segments_like_the_reference(tok, granularity, seed):
    rng = random.Random(seed)
    k = rng.randint(1, 5)
    rows, ids, lengths = random_rows(tok, rng, 20)
    fn = make_segmenter(granularity, step_separator=";", segment_tokens=k, key_after="=")
    texts_of = TokenTexts(tok)
    seg = segment(ids, lengths, texts_of, fn)
    assert seg.end_mask.shape == ids.shape and seg.end_mask.dtype == torch.bool
    for i, row in enumerate(rows):
        texts = [texts_of(t) for t in row]
        expected = reference_ends(texts, granularity, k=k)
        assert seg.ends[i] == expected
        assert seg.end_mask[i].nonzero().squeeze(-1).tolist() == expected
        assert "".join(seg.texts[i]) == "".join(texts)
    # placing one score per span puts exactly one reward on every span end
    mask = torch.arange(ids.shape[1])[None, :] < lengths[:, None]
    scores = [[float(j) for j in range(len(e))] for e in seg.ends]
    rewards, placed = place(scores, end_mask=seg.end_mask, response_mask=mask)
    assert torch.equal(placed, seg.end_mask)


def test_segmenters_pickle_and_behave_the_same_after(tok):
    for name in GRANULARITIES:
        fn = make_segmenter(name, step_separator=";", segment_tokens=2)
        texts = list("1+2=3;4*5=20;#20")
        assert pickle.loads(pickle.dumps(fn))(texts) == fn(texts)


def test_make_segmenter_options_and_errors(tmp_path, monkeypatch):
    texts = list("12=3;4=56")
    assert make_segmenter("sequence")(texts) == [8]
    assert make_segmenter("step", step_separator=";")(texts) == [4]
    assert make_segmenter("segment", segment_tokens=4)(texts) == [3, 7]
    assert make_segmenter("token")(texts) == list(range(9))
    assert make_segmenter("key_token")(texts) == [3, 7]  # the token after '='
    assert make_segmenter("key_token", key_after="4")(texts) == [6]
    with pytest.raises(
        ValueError, match=r"step granularity needs a separator \(the task's step_separator\) or a cut function"
    ):
        make_segmenter("step")
    with pytest.raises(ValueError, match="segment granularity needs segment_tokens >= 1, got 0"):
        make_segmenter("segment", segment_tokens=0)
    # user functions by import path
    (tmp_path / "user_cuts_for_test.py").write_text(
        textwrap.dedent(
            """
            def cut(texts):
                return [i for i, t in enumerate(texts) if t == "="]

            def is_digit_after_op(texts, i):
                return i > 0 and texts[i - 1] in "+-*" and texts[i].isdigit()

            NOT_CALLABLE = 3
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "user_cuts_for_test", raising=False)
    assert make_segmenter("step", cut_fn="user_cuts_for_test:cut", step_separator=";")(texts) == [2, 6]
    assert make_segmenter("segment", cut_fn="user_cuts_for_test:cut")(texts) == [2, 6]
    key = make_segmenter("key_token", key_fn="user_cuts_for_test:is_digit_after_op")
    assert key(list("1+2*34")) == [2, 4]
    with pytest.raises(ValueError, match="'user_cuts_for_test:NOT_CALLABLE' is not callable"):
        make_segmenter("step", cut_fn="user_cuts_for_test:NOT_CALLABLE")
    with pytest.raises(
        ValueError, match="'user_cuts_for_test:missing': 'user_cuts_for_test' has no attribute 'missing'"
    ):
        make_segmenter("key_token", key_fn="user_cuts_for_test:missing")


# ----------------------------------------------------------------------------- sources: registry


@pytest.fixture(scope="module")
def task():
    return make_task("arithmetic")


@pytest.fixture(scope="module")
def problem(task):
    return task.make_problem("7+3*2-5=")


def test_builtin_sources_declare_their_granularities():
    import creditrl.prm  # noqa: F401  (importing the PRM layer registers reward.source=prm)

    assert set(REWARD_SOURCES) >= {"outcome", "oracle_steps"}
    out, orc = get_source("outcome"), get_source("oracle_steps")
    assert out.granularities == {"sequence"} and out.default_granularity == "sequence"
    assert orc.granularities == {"step", "segment", "token", "key_token"} and orc.default_granularity == "step"
    with pytest.raises(
        ValueError,
        match="unknown reward source 'orm'; valid: bleu, chrf, implicit_prm, oracle_steps, outcome, prm, rouge, "
        "step_format, unit_tests",
    ):
        get_source("orm")


def test_register_source_checks():
    with pytest.raises(ValueError, match="reward source 'outcome' is already registered"):
        register_source("outcome")(lambda *a: [1.0])
    with pytest.raises(ValueError, match="reward source 'multi' scores several granularities; name its default"):
        register_source("multi", granularities=("step", "token"))
    with pytest.raises(
        ValueError, match=r"default granularity 'token' is not among its granularities \(sequence, step\)"
    ):
        RewardSource("bad", frozenset({"sequence", "step"}), "token", lambda *a: [])


def test_check_granularity_messages():
    check_granularity(get_source("oracle_steps"), "key_token")  # supported: no error
    with pytest.raises(ValueError) as info:
        check_granularity(get_source("outcome"), "step")
    assert str(info.value) == (
        "reward source 'outcome' scores whole sequences only (granularities: sequence); "
        "it cannot be used at granularity 'step'"
    )
    with pytest.raises(ValueError) as info:
        check_granularity(get_source("oracle_steps"), "sequence")
    assert str(info.value) == (
        "reward source 'oracle_steps' scores spans (granularities: key_token, segment, step, token); "
        "it cannot be used at granularity 'sequence'"
    )
    with pytest.raises(
        ValueError, match="unknown granularity 'word'; valid: key_token, segment, sequence, step, token"
    ):
        check_granularity(get_source("outcome"), "word")


def test_score_batch_refuses_unsupported_granularity_whatever_the_policy(task, problem):
    for policy in ("raise", "zero", "skip"):
        with pytest.raises(ValueError, match="reward source 'outcome' .* cannot be used at granularity 'token'"):
            score_batch(
                get_source("outcome"), task, [problem], ["#8"], [["#", "8"]], granularity="token", on_error=policy
            )


def test_sequence_granularity_needs_one_span(task, problem):
    with pytest.raises(ValueError, match="sequence granularity has one span per response .*; response 1 has 2"):
        score_batch(get_source("outcome"), task, [problem] * 2, ["#8", "1;#8"], [["#8"], ["1;", "#8"]])


# ----------------------------------------------------------------------------- sources: error policies


def run(fn, task, problems, granularity="sequence", on_error="raise", spans=None):
    source = RewardSource("probe", frozenset({granularity}), granularity, fn)
    n = len(problems)
    spans = spans if spans is not None else [["x"]] * n
    return score_batch(source, task, problems, ["c"] * n, spans, on_error=on_error)


def failing_on_second(kind):
    """A source that is fine on response 0 and 2 and fails on response 1 in the given way."""
    calls = {"n": 0}

    def fn(task, problem, completion, spans):
        i = calls["n"]
        calls["n"] += 1
        if i != 1:
            return [0.5]
        if kind == "raise":
            raise KeyError("boom")
        if kind == "nan":
            return [math.nan]
        if kind == "inf":
            return [-math.inf]
        if kind == "text":
            return ["1"]
        return [1.0, 2.0]  # wrong count

    return fn


BAD = ["raise", "nan", "inf", "count", "text"]
DETAIL = {
    "raise": "boom",
    "nan": "non-finite",
    "inf": "non-finite",
    "count": "returned 2 scores, expected 1",
    "text": "returned a score of type str ('1'); a score is a real number, a bool or None",
}


@pytest.mark.parametrize("kind", BAD)
def test_raise_policy_names_response_and_prompt(task, problem, kind):
    problems = [problem, task.make_problem("1+2="), problem]
    with pytest.raises(UserFunctionError) as info:
        run(failing_on_second(kind), task, problems, on_error="raise")
    msg = str(info.value)
    assert "\n" not in msg and "reward source 'probe' failed on response 1" in msg
    assert "prompt '1+2=')" in msg
    assert DETAIL[kind] in msg


@pytest.mark.parametrize("kind", BAD)
def test_zero_policy_scores_zero_and_counts(task, problem, kind):
    res = run(failing_on_second(kind), task, [problem] * 3, on_error="zero")
    assert res.scores == [[0.5], [0.0], [0.5]]
    assert res.keep == [True, True, True]
    assert res.errors == 1
    assert "failed on response 1" in res.first_error and DETAIL[kind] in res.first_error


@pytest.mark.parametrize("kind", BAD)
def test_skip_policy_drops_and_counts(task, problem, kind):
    res = run(failing_on_second(kind), task, [problem] * 3, on_error="skip")
    assert res.keep == [True, False, True]
    assert res.scores == [[0.5], [0.0], [0.5]]  # placeable shape even when dropped
    assert res.errors == 1


@pytest.mark.parametrize("granularity", ["step", "segment", "token", "key_token"])
def test_span_source_wrong_count_is_an_error_with_zeros_per_span(task, problem, granularity):
    spans = [["a;", "b;", "#c"], ["a;"]]
    res = run(lambda t, p, c, s: [1.0, None], task, [problem, problem], granularity, "skip", spans)
    # 2 scores for 3 spans is wrong, 2 for 1 too
    assert res.errors == 2 and res.keep == [False, False]
    assert res.scores == [[0.0, 0.0, 0.0], [0.0]]
    assert "returned 2 scores, expected 3" in res.first_error


def test_none_span_scores_pass_at_span_granularities(task, problem):
    res = run(lambda t, p, c, s: [None, 1, 0.0], task, [problem], "token", "raise", [["a", "b", "c"]])
    assert res.scores == [[None, 1.0, 0.0]] and res.errors == 0


def test_a_none_sequence_score_places_nothing_and_is_counted(task, problem):
    res = run(lambda t, p, c, s: [None], task, [problem] * 2, "sequence", "raise")
    assert res.scores == [[None], [None]] and res.errors == 0 and res.nones == 2 and res.keep == [True, True]
    last = torch.tensor([[False, False, True]] * 2)
    rewards, placed = place(res.scores, end_mask=last, response_mask=torch.ones(2, 3, dtype=torch.bool))
    assert not placed.any() and not rewards.any()


def test_empty_response_is_not_scored(task, problem):
    calls = []

    def fn(task, problem, completion, spans):
        calls.append(completion)
        return [1.0]

    res = run(fn, task, [problem] * 2, "sequence", "raise", [[], ["x"]])
    assert res.scores == [[], [1.0]] and calls == ["c"] and res.keep == [True, True]


def test_errors_counted_and_first_error_kept(task, problem):
    def fn(task, problem, completion, spans):
        raise ValueError(f"bad {completion}")

    source = RewardSource("probe", frozenset({"sequence"}), "sequence", fn)
    res = score_batch(source, task, [problem] * 3, ["r0", "r1", "r2"], [["r0"], ["r1"], ["r2"]], on_error="zero")
    assert res.errors == 3
    assert res.first_error.startswith("reward source 'probe' failed on response 0")
    assert res.first_error.endswith("bad r0")


def test_clean_scores_are_floats(task, problem):
    res = run(lambda t, p, c, s: [True], task, [problem], on_error="raise")
    assert res.scores == [[1.0]] and isinstance(res.scores[0][0], float)
    assert res.errors == 0 and res.first_error is None and res.keep == [True]


def test_unknown_error_policy_and_length_mismatch(task, problem):
    with pytest.raises(ValueError, match="unknown reward error policy 'ignore'; valid: raise, zero, skip"):
        run(lambda *a: [1.0], task, [problem], on_error="ignore")
    with pytest.raises(ValueError, match="got 2 problems, 1 completions and 2 span lists"):
        score_batch(get_source("outcome"), task, [problem] * 2, ["#8"], [["#8"]] * 2)


# ----------------------------------------------------------------------------- outcome end to end


GOOD = "3*2=6;7+6=13;13-5=8;#8"
WRONG = "3*2=6;7+6=14;14-5=9;#9"


def test_outcome_source_at_sequence_granularity(task, problem, tok):
    assert problem.solution == GOOD and problem.answer == "8"
    completions = [GOOD, WRONG, "#8", ""]
    rows = [tok(c, add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for c in completions]
    width = max(len(r) for r in rows)
    ids = torch.zeros((4, width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r)
    lengths = torch.tensor([len(r) for r in rows])
    mask = torch.arange(width)[None, :] < lengths[:, None]
    seg = segment(ids, lengths, TokenTexts(tok), make_segmenter("sequence"))
    assert seg.texts == [[c] for c in completions]  # one span: the whole response (eos decodes to "")
    res = score_batch(get_source("outcome"), task, [problem] * 4, completions, seg.texts)
    assert res.scores == [[1.0], [0.0], [1.0], [0.0]] and res.errors == 0
    rewards, placed = place(res.scores, end_mask=seg.end_mask, response_mask=mask)
    assert placed.nonzero().tolist() == [[0, 22], [1, 22], [2, 2], [3, 0]]  # the eos tokens
    assert rewards.sum(1).tolist() == [1.0, 0.0, 1.0, 0.0]


# ----------------------------------------------------------------------------- batch_fn and factories


def test_batch_fn_is_used_and_falls_back_to_fn_per_response_when_it_raises():
    from creditrl.rewards.sources import RewardSource

    task = make_task("arithmetic", min_ops=1, max_ops=2)
    probs = [task.make_problem("1+2="), task.make_problem("2*3=")]
    calls = {"batch": 0, "fn": 0}

    def fn(task, problem, completion, spans):
        calls["fn"] += 1
        return [0.25] * len(spans)

    def good_batch(task, problems, completions, spans):
        calls["batch"] += 1
        return [[0.75] * len(s) for s in spans]

    def bad_batch(task, problems, completions, spans):
        raise RuntimeError("model crashed")

    spans = [["1+2=3;", "#3"], ["2*3=6;", "#6"]]
    res = score_batch(RewardSource("b", frozenset({"step"}), "step", fn, good_batch), task, probs, ["", ""], spans)
    assert res.scores == [[0.75, 0.75], [0.75, 0.75]] and calls == {"batch": 1, "fn": 0}
    res = score_batch(RewardSource("b", frozenset({"step"}), "step", fn, bad_batch), task, probs, ["", ""], spans)
    assert res.scores == [[0.25, 0.25], [0.25, 0.25]] and calls["fn"] == 2 and res.errors == 0


def test_source_factories_are_named_validated_and_built_with_options(tmp_path):
    import creditrl.prm  # noqa: F401  (importing the PRM layer registers reward.source=prm)
    from creditrl.rewards.sources import SOURCE_FACTORIES, make_source, register_source_factory, source_names

    assert "prm" in SOURCE_FACTORIES and "prm" in source_names()
    assert SOURCE_FACTORIES["prm"].requires == ("prm",)
    with pytest.raises(ValueError, match="reward source 'prm' is already registered"):
        register_source_factory("prm", ("step",), "step")(lambda options: None)
    with pytest.raises(FileNotFoundError, match="is not a PRM directory"):
        make_source("prm", {"prm": str(tmp_path / "missing")})
    assert make_source("outcome").name == "outcome"  # a static source ignores options
