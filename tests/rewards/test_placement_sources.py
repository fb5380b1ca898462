"""Placement of scores into (B, T) rewards, and the scoring stage's sources and error policies."""

import math

import pytest
import torch

from creditrl.policy.tokenizer import build_char_tokenizer
from creditrl.rewards.placement import PLACEMENTS, place
from creditrl.rewards.sources import (
    REWARD_SOURCES,
    RewardSource,
    get_source,
    score_batch,
)
from creditrl.rollout.segment import TokenTexts, segment, separator_segmenter
from creditrl.tasks import make_task


def bool_mask(rows):
    return torch.tensor(rows, dtype=torch.bool)


# ----------------------------------------------------------------------------- sequence


def test_sequence_puts_score_on_last_valid_token():
    mask = bool_mask([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [0, 0, 0, 0, 0], [1, 0, 1, 1, 0], [1, 0, 0, 0, 0]])
    rewards, placed = place("sequence", [[2.5], [-1.0], [7.0], [0.0], [3.0]], response_mask=mask)
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


def test_sequence_rewards_stay_inside_the_mask():
    g = torch.Generator().manual_seed(0)
    mask = torch.rand(50, 9, generator=g) < 0.6
    scores = [[float(x)] for x in torch.randn(50, generator=g)]
    rewards, placed = place("sequence", scores, response_mask=mask)
    assert not (placed & ~mask).any()
    assert placed.sum(1).tolist() == mask.any(1).long().tolist()
    for b in range(50):
        if mask[b].any():
            last = max(t for t in range(9) if mask[b, t])
            assert rewards[b, last].item() == pytest.approx(scores[b][0])
            assert float(rewards[b].abs().sum()) == pytest.approx(abs(scores[b][0]))


def test_sequence_needs_exactly_one_score():
    mask = bool_mask([[1, 1], [1, 0]])
    with pytest.raises(ValueError, match="exactly one score per response; row 1 has 2"):
        place("sequence", [[1.0], [1.0, 2.0]], response_mask=mask)
    with pytest.raises(ValueError, match="row 0 has 0"):
        place("sequence", [[], [1.0]], response_mask=mask)


# ----------------------------------------------------------------------------- step


def test_step_puts_kth_score_on_kth_step_end():
    mask = bool_mask([[1, 1, 1, 1, 1, 0], [1, 1, 1, 0, 0, 0], [0, 0, 0, 0, 0, 0]])
    ends = bool_mask([[0, 1, 0, 1, 1, 0], [0, 0, 1, 0, 0, 0], [0, 0, 0, 0, 0, 0]])
    rewards, placed = place("step", [[0.5, 0.0, -2.0], [4.0], []], response_mask=mask, step_ends=ends)
    assert rewards.tolist() == [[0, 0.5, 0, 0.0, -2.0, 0], [0, 0, 4.0, 0, 0, 0], [0] * 6]
    assert torch.equal(placed, ends)


def test_step_ends_outside_the_mask_are_ignored():
    mask = bool_mask([[1, 1, 0, 1, 0, 0]])
    ends = bool_mask([[0, 1, 1, 1, 0, 1]])  # ends at 2 and 5 are masked out
    rewards, placed = place("step", [[1.0, 2.0]], response_mask=mask, step_ends=ends)
    assert rewards.tolist() == [[0, 1.0, 0, 2.0, 0, 0]]
    assert placed.tolist() == [[False, True, False, True, False, False]]


def test_step_count_mismatch_names_the_row():
    mask = bool_mask([[1, 1, 1], [1, 1, 1]])
    ends = bool_mask([[0, 0, 1], [1, 1, 1]])
    with pytest.raises(ValueError, match="row 1: 2 step scores for 3 step ends"):
        place("step", [[1.0], [1.0, 2.0]], response_mask=mask, step_ends=ends)


def test_step_needs_step_ends_of_the_right_shape():
    mask = bool_mask([[1, 1, 1]])
    with pytest.raises(ValueError, match="step placement needs step_ends"):
        place("step", [[1.0]], response_mask=mask)
    with pytest.raises(ValueError, match="step placement needs step_ends"):
        place("step", [[1.0]], response_mask=mask, step_ends=bool_mask([[1, 1]]))


# ----------------------------------------------------------------------------- place() checks


def test_unknown_placement_lists_valid_names():
    with pytest.raises(ValueError, match=r"unknown placement 'token'; valid: sequence, step"):
        place("token", [[1.0]], response_mask=bool_mask([[1]]))
    assert {"sequence", "step"} <= set(PLACEMENTS)


def test_place_checks_mask_and_row_count():
    with pytest.raises(ValueError, match="response_mask must be bool"):
        place("sequence", [[1.0]], response_mask=torch.ones(1, 3))
    with pytest.raises(ValueError, match=r"response_mask must be bool \(B, T\)"):
        place("sequence", [[1.0]], response_mask=torch.ones(3, dtype=torch.bool))
    with pytest.raises(ValueError, match="got scores for 1 responses, response_mask has 2 rows"):
        place("sequence", [[1.0]], response_mask=bool_mask([[1], [1]]))


# ----------------------------------------------------------------------------- score_batch


@pytest.fixture(scope="module")
def task():
    return make_task("arithmetic")


@pytest.fixture(scope="module")
def problem(task):
    return task.make_problem("7+3*2-5=")


def run(fn, task, problems, granularity="sequence", on_error="raise", segments=None):
    source = RewardSource("probe", granularity, fn)
    n = len(problems)
    segments = segments if segments is not None else [["x"]] * n
    return score_batch(source, task, problems, ["c"] * n, segments, on_error=on_error)


def failing_on_second(kind):
    """A source that is fine on response 0 and 2 and fails on response 1 in the given way."""
    calls = {"n": 0}

    def fn(task, problem, completion, segments):
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
        return [1.0, 2.0]  # wrong count

    return fn


BAD = ["raise", "nan", "inf", "count"]
DETAIL = {"raise": "boom", "nan": "non-finite", "inf": "non-finite", "count": "returned 2 scores, expected 1"}


@pytest.mark.parametrize("kind", BAD)
def test_raise_policy_names_response_and_prompt(task, problem, kind):
    problems = [problem, task.make_problem("1+2="), problem]
    with pytest.raises(RuntimeError) as info:
        run(failing_on_second(kind), task, problems, on_error="raise")
    msg = str(info.value)
    assert "reward source 'probe' failed on response 1" in msg
    assert "(prompt '1+2=')" in msg
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


def test_step_source_wrong_count_is_an_error_with_zeros_per_segment(task, problem):
    segs = [["a;", "b;", "#c"], ["a;"]]
    res = run(lambda t, p, c, s: [1.0, 1.0], task, [problem, problem], "step", "skip", segs)
    # 2 scores for 3 segments is wrong, 2 for 1 too
    assert res.errors == 2 and res.keep == [False, False]
    assert res.scores == [[0.0, 0.0, 0.0], [0.0]]
    assert "returned 2 scores, expected 3" in res.first_error


def test_errors_counted_and_first_error_kept(task, problem):
    def fn(task, problem, completion, segments):
        raise ValueError(f"bad {completion}")

    source = RewardSource("probe", "sequence", fn)
    res = score_batch(source, task, [problem] * 3, ["r0", "r1", "r2"], [[]] * 3, on_error="zero")
    assert res.errors == 3
    assert res.first_error.startswith("reward source 'probe' failed on response 0")
    assert res.first_error.endswith("bad r0")


def test_clean_scores_are_floats(task, problem):
    res = run(lambda t, p, c, s: [True], task, [problem], on_error="raise")
    assert res.scores == [[1.0]] and isinstance(res.scores[0][0], float)
    assert res.errors == 0 and res.first_error is None and res.keep == [True]


def test_unknown_error_policy_and_source(task, problem):
    with pytest.raises(ValueError, match="unknown reward error policy 'ignore'; valid: raise, zero, skip"):
        run(lambda *a: [1.0], task, [problem], on_error="ignore")
    with pytest.raises(ValueError, match="unknown reward source 'prm'; valid: oracle_steps, outcome"):
        get_source("prm")
    assert get_source("outcome").granularity == "sequence"
    assert get_source("oracle_steps").granularity == "step"
    assert set(REWARD_SOURCES) >= {"outcome", "oracle_steps"}


# ----------------------------------------------------------------------------- built-in sources


GOOD = "3*2=6;7+6=13;13-5=8;#8"
WRONG = "3*2=6;7+6=14;14-5=9;#9"


def test_outcome_source(task, problem):
    assert problem.solution == GOOD and problem.answer == "8"
    src = get_source("outcome")
    res = score_batch(src, task, [problem] * 4, [GOOD, WRONG, "#8", ""], [[]] * 4)
    assert res.scores == [[1.0], [0.0], [1.0], [0.0]]
    assert res.errors == 0


def test_oracle_steps_source(task, problem):
    src = get_source("oracle_steps")
    good_segs = ["3*2=6;", "7+6=13;", "13-5=8;", "#8"]
    wrong_segs = ["3*2=6;", "7+6=14;", "14-5=9;", "#9"]
    late_answer = ["3*2=6;", "7+6=13;", "13-5=8;", ""]  # eos after ';': empty final segment
    res = score_batch(src, task, [problem] * 3, ["".join(good_segs), "".join(wrong_segs), "x"], [good_segs, wrong_segs, late_answer])
    # labels stop at the first error (PRM800K convention): later steps are unlabelled (None)
    assert res.scores == [[1.0, 1.0, 1.0, 1.0], [1.0, 0.0, None, None], [1.0, 1.0, 1.0, 0.0]]
    assert res.errors == 0


def test_segment_score_place_end_to_end(task, problem):
    """Step rewards land on the ';' tokens and the answer's last token of the real response."""
    tok = build_char_tokenizer()
    eos = tok.eos_token_id
    rows = [tok(GOOD, add_special_tokens=False)["input_ids"] + [eos], tok(WRONG, add_special_tokens=False)["input_ids"]]
    width = max(len(r) for r in rows)
    ids = torch.zeros((2, width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r)
    lengths = torch.tensor([len(r) for r in rows])
    mask = torch.arange(width)[None, :] < lengths[:, None]
    seg = segment(ids, lengths, TokenTexts(tok), separator_segmenter(";"))
    src = get_source("oracle_steps")
    res = score_batch(src, task, [problem] * 2, [GOOD, WRONG], seg.texts)
    rewards, placed = place(src.granularity, res.scores, response_mask=mask, step_ends=seg.step_ends)
    # the wrong response is labelled up to its first error only
    assert placed.nonzero().tolist() == [[0, 5], [0, 12], [0, 19], [0, 22], [1, 5], [1, 12]]
    assert rewards[0].sum().item() == 4.0
    assert rewards[1, 5].item() == 1.0 and rewards[1, 12].item() == 0.0 and rewards[1].sum().item() == 1.0


def test_step_placement_skips_unlabelled_steps():
    mask = torch.ones((1, 6), dtype=torch.bool)
    ends = torch.tensor([[False, True, False, True, False, True]])
    rewards, placed = place("step", [[0.5, None, 0.0]], response_mask=mask, step_ends=ends)
    assert placed.tolist() == [[False, True, False, False, False, True]]
    assert rewards.tolist() == [[0.0, 0.5, 0.0, 0.0, 0.0, 0.0]]


def test_sequence_source_returning_none_is_an_error(task, problem):
    src = RewardSource("none_seq", "sequence", lambda *a: [None])
    res = score_batch(src, task, [problem], ["#8"], [["#8"]], on_error="zero")
    assert res.errors == 1 and "must return a score" in res.first_error
