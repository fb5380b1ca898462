"""Reward spread and the notes that say why a group has no credit, on hand-made groups."""

from __future__ import annotations

from creditrl.inspect.spread import credit_notes, has_spread, num, sequence_reward, spread_counts, spread_note

STEPS, LABELS = [[0, 1], [2, 2]], [True, False]


def response(rewards: list[float], *, kept: bool = True, masked: list[int] | None = None, labels=LABELS) -> dict:
    return {
        "rewards": rewards,
        "masked": masked or [],
        "texts": ["a"] * len(rewards),
        "kept": kept,
        "steps": STEPS,
        "labels": labels,
    }


def group(*responses: dict) -> dict:
    return {"group_id": 0, "responses": list(responses)}


def zeros(g: dict) -> list[list[float]]:
    return [[0.0] * len(r["rewards"]) for r in g["responses"]]


def test_scores_and_spread() -> None:
    assert sequence_reward(response([0.0, 0.5, 1.0], masked=[2])) == 0.5  # masked tokens do not count
    assert (num(1.0), num(0.5), num(-0.0), num(1 / 3)) == ("1", "0.5", "0", "0.3333")
    flat = group(response([0, 0, 1.0]), response([0, 0, 1.0]), response([0, 0, 1.0]))
    assert not has_spread(flat) and spread_note(flat) == "no reward spread: all 3 completions scored 1"
    mixed = group(response([0, 0, 1.0]), response([0, 0, 0.0]))
    assert has_spread(mixed) and spread_note(mixed) == ""
    # equal within the tolerance (float32 sums in another order), and a real but small difference
    assert not has_spread(group(response([0.1, 0.2, 0.0]), response([0.3, 0.0, 1e-9])))
    assert has_spread(group(response([0, 0, 1.0]), response([0, 0, 1.001])))
    # dropped completions never enter credit, so they do not make spread
    part = group(response([0, 0, 1.0]), response([0, 0, 1.0]), response([0, 0, 0.0], kept=False))
    assert not has_spread(part)
    assert spread_note(part) == "no reward spread: all 2 kept completions scored 1 (1 dropped)"
    one = group(response([0, 0, 1.0]), response([0, 0, 0.0], kept=False))
    assert spread_note(one) == "no reward spread: only 1 of 2 completions was kept (it scored 1)"
    assert spread_note(group(response([0, 0, 0.5]))) == "no reward spread: the group's only completion scored 0.5"
    dropped = group(response([0, 0, 1.0], kept=False), response([0, 0, 0.0], kept=False))
    assert spread_note(dropped) == "no reward spread: all 2 completions were dropped"
    assert spread_counts([flat, mixed, part]) == {
        "none": 2,
        "groups": 3,
        "text": "2 of 3 saved groups have no reward spread",
    }
    assert spread_counts([mixed])["text"] == "0 of 1 saved groups have no reward spread"
    assert spread_counts([flat, mixed])["text"] == "1 of 2 saved groups has no reward spread"


def test_why_every_advantage_is_zero() -> None:
    flat = group(response([0, 0, 1.0]), response([0, 0, 1.0]))
    assert credit_notes(flat, zeros(flat), None) == {
        "why": "no reward spread: all 2 completions scored 1, so every advantage is 0",
        "short": "no reward spread",
        "note": "",
    }
    dropped = group(response([0, 0, 1.0], kept=False), response([0, 0, 0.0], kept=False))
    assert credit_notes(dropped, zeros(dropped), None)["why"] == (
        "no credit: all 2 completions were dropped, so every advantage is 0"
    )
    masked = group(response([0, 0, 1.0], masked=[0, 1, 2]), response([0, 0, 0.0], masked=[0, 1, 2]))
    assert credit_notes(masked, zeros(masked), None)["short"] == "all masked"
    # rewards differ, yet the estimator gave nothing: say so, not "no reward spread"
    mixed = group(response([0, 0, 1.0]), response([0, 0, 0.0]))
    notes = credit_notes(mixed, zeros(mixed), None)
    assert notes["short"] == "all advantages 0" and "reward spread" not in notes["why"]
    assert notes["why"] == (
        "no credit: every advantage is 0 although the completions scored 0 to 1 "
        "(this estimator found nothing to compare)"
    )


def test_no_note_where_there_is_credit() -> None:
    mixed = group(response([0, 0, 1.0]), response([0, 0, 0.0]))
    assert credit_notes(mixed, [[0.5, 0.5, 0.5], [-0.5, -0.5, -0.5]], 0.33) == {"why": "", "short": "", "note": ""}
    # credit but an undefined precision: no negative credit, or no labels at all
    assert credit_notes(mixed, [[0.5] * 3, [0.0] * 3], None)["why"] == "no negative credit on a labelled step"
    unlabelled = group(response([0, 0, 1.0], labels=None), response([0, 0, 0.0], labels=None))
    assert credit_notes(unlabelled, [[0.5] * 3, [-0.5] * 3], None)["short"] == "no step labels"
    # no spread, but the same advantage on every token (batch whitening, or a baseline-free estimator)
    flat = group(response([0, 0, 1.0]), response([0, 0, 1.0]))
    notes = credit_notes(flat, [[-0.25] * 3, [-0.25] * 3], 0.0)
    assert notes["why"] == "" and notes["note"] == (
        "no reward spread: all 2 completions scored 1; every advantage is -0.25, so the credit does not tell them apart"
    )
