"""Hybrid stages: filters, scheduled reward mixes and the calibrator, against hand-worked numbers
and slow reference loops."""

import itertools
import math
from collections import Counter
from fractions import Fraction

import pytest
import torch

from creditrl.rewards.hybrid import (
    FILTERS,
    SCHEDULES,
    Calibrator,
    apply_filter,
    dense_verdict,
    filter_group_accuracy,
    filter_top_q,
    mix_rewards,
    mix_weights,
    register_filter,
)

# ----------------------------------------------------------------------------- top q


def test_top_q_keeps_the_highest_outcomes():
    outcome = torch.tensor([0.1, 0.9, 0.5, 0.7])
    assert filter_top_q(outcome, 0.5, torch.Generator().manual_seed(0)).tolist() == [False, True, False, True]
    assert filter_top_q(outcome, 0.01, None).tolist() == [False, True, False, False]  # ceil(0.04) = 1
    assert filter_top_q(outcome, 0.51, None).tolist() == [False, True, True, True]  # ceil(2.04) = 3


@pytest.mark.parametrize(
    "q, b, k", [(1.0, 7, 7), (0.3, 10, 3), (0.7, 10, 7), (0.25, 10, 3), (0.1, 30, 3), (0.5, 1, 1), (0.07, 100, 7)]
)
def test_top_q_keeps_ceil_q_b(q, b, k):
    gen = torch.Generator().manual_seed(1)
    outcome = torch.rand(b, generator=gen)
    keep = filter_top_q(outcome, q, gen)
    assert keep.dtype == torch.bool and keep.shape == (b,)
    assert int(keep.sum()) == k
    # slow reference: every kept outcome is >= every dropped one
    if 0 < k < b:
        assert outcome[keep].min() >= outcome[~keep].max()


def test_top_q_one_keeps_everything_even_with_ties():
    outcome = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.5])
    assert filter_top_q(outcome, 1.0, torch.Generator().manual_seed(3)).all()


def test_top_q_breaks_ties_uniformly_at_random():
    # three responses tie at 1.0 for two places: each pair should be chosen a third of the time
    outcome = torch.tensor([0.0, 1.0, 1.0, 0.0, 1.0])
    gen = torch.Generator().manual_seed(0)
    n = 3000
    counts = Counter(tuple(filter_top_q(outcome, 0.4, gen).nonzero().flatten().tolist()) for _ in range(n))
    assert set(counts) == {(1, 2), (1, 4), (2, 4)}
    for c in counts.values():
        assert abs(c / n - 1 / 3) < 5 * math.sqrt((1 / 3) * (2 / 3) / n)
    # a strictly higher outcome is always kept; the tie at the cut is broken at random
    outcome = torch.tensor([0.5, 2.0, 0.5, 0.5, -1.0])
    kept = Counter()
    for _ in range(n):
        keep = filter_top_q(outcome, 0.4, gen)
        assert keep[1] and not keep[4]
        kept.update(keep.nonzero().flatten().tolist())
    for i in (0, 2, 3):
        assert abs(kept[i] / n - 1 / 3) < 5 * math.sqrt((1 / 3) * (2 / 3) / n)


def test_top_q_same_seed_same_choice():
    outcome = torch.zeros(20)
    a = filter_top_q(outcome, 0.5, torch.Generator().manual_seed(9))
    b = filter_top_q(outcome, 0.5, torch.Generator().manual_seed(9))
    c = filter_top_q(outcome, 0.5, torch.Generator().manual_seed(10))
    assert torch.equal(a, b) and not torch.equal(a, c)


@pytest.mark.parametrize("q", [0.0, -0.5, 1.01])
def test_top_q_rejects_bad_q(q):
    with pytest.raises(ValueError, match=r"q must be in \(0, 1\]"):
        filter_top_q(torch.zeros(3), q, None)


def test_top_q_rejects_non_float_outcome():
    with pytest.raises(ValueError, match=r"outcome must be a floating-point tensor of shape \(B,\)"):
        filter_top_q(torch.ones(3, dtype=torch.long), 0.5, None)


# ----------------------------------------------------------------------------- group accuracy


def test_group_accuracy_boundaries_are_inclusive():
    groups = {
        7: [1, 0, 0, 0, 0],  # 0.2 = lo: kept
        3: [1, 1, 1, 1, 0],  # 0.8 = hi: kept (a float32 mean would be 0.800000012 and lost)
        11: [1, 1, 1],  # 1.0: dropped, no contrast
        0: [0, 0],  # 0.0: dropped
        5: [1, 0],  # 0.5: kept
        2: [1, 0, 0, 0, 0, 0, 0, 0, 0, 0],  # 0.1: dropped
    }
    ids, outs = [], []
    for g, o in groups.items():
        ids += [g] * len(o)
        outs += o
    order = torch.randperm(len(ids), generator=torch.Generator().manual_seed(0))  # unsorted groups
    group_ids = torch.tensor(ids)[order]
    outcome = torch.tensor(outs, dtype=torch.float32)[order]
    keep = filter_group_accuracy(outcome, group_ids, 0.2, 0.8)
    kept_groups = {g: bool(k) for g, k in zip(group_ids.tolist(), keep.tolist())}
    assert kept_groups == {7: True, 3: True, 11: False, 0: False, 5: True, 2: False}
    # every response of a group shares the decision
    for g in groups:
        assert len({k for gi, k in zip(group_ids.tolist(), keep.tolist()) if gi == g}) == 1


@pytest.mark.parametrize("lo, hi", [(0.0, 1.0), (0.2, 0.8), (0.3, 0.3), (0.25, 0.75), (0.0, 0.0)])
def test_group_accuracy_matches_slow_reference(lo, hi):
    gen = torch.Generator().manual_seed(4)
    group_ids = torch.randint(0, 9, (60,), generator=gen) * 5
    outcome = (torch.rand(60, generator=gen) < 0.5).float()
    keep = filter_group_accuracy(outcome, group_ids, lo, hi)
    g, o = group_ids.tolist(), outcome.tolist()
    for b in range(60):
        members = [o[j] for j in range(60) if g[j] == g[b]]
        acc = sum(members) / len(members)
        assert bool(keep[b]) == (lo - 1e-9 <= acc <= hi + 1e-9)


def test_group_accuracy_validation():
    with pytest.raises(ValueError, match="need lo <= hi, got lo=0.8, hi=0.2"):
        filter_group_accuracy(torch.zeros(2), torch.zeros(2, dtype=torch.long), 0.8, 0.2)
    with pytest.raises(ValueError, match="group_ids must be a long"):
        filter_group_accuracy(torch.zeros(2), torch.zeros(3, dtype=torch.long), 0.2, 0.8)


# ----------------------------------------------------------------------------- registry


def test_filter_registry_names_and_dispatch():
    assert set(FILTERS) == {"none", "top_q", "group_accuracy"}
    outcome = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0])
    group_ids = torch.tensor([0, 0, 1, 1, 2, 2])
    assert apply_filter("none", outcome, group_ids).all()
    assert torch.equal(
        apply_filter("top_q", outcome, group_ids, q=0.5, generator=torch.Generator().manual_seed(2)),
        filter_top_q(outcome, 0.5, torch.Generator().manual_seed(2)),
    )
    assert apply_filter("group_accuracy", outcome, group_ids, lo=0.2, hi=0.8).tolist() == [
        True,
        True,
        False,
        False,
        False,
        False,
    ]
    # every registered filter has the one signature
    for name, fn in FILTERS.items():
        keep = fn(outcome, group_ids, q=1.0, lo=0.0, hi=1.0, generator=None)
        assert keep.dtype == torch.bool and keep.shape == (6,) and keep.all(), name


def test_unknown_filter_and_duplicate_registration():
    with pytest.raises(ValueError, match="unknown filter 'best'; valid: group_accuracy, none, top_q"):
        apply_filter("best", torch.zeros(2), torch.zeros(2, dtype=torch.long))
    with pytest.raises(ValueError, match="filter 'none' is already registered"):
        register_filter("none")(lambda *a, **k: None)


# ----------------------------------------------------------------------------- schedules


@pytest.mark.parametrize(
    "schedule, progress, expected",
    [
        ("constant", 0.0, (1.0, 0.5)),
        ("constant", 0.8, (1.0, 0.5)),
        ("constant", 1.0, (1.0, 0.5)),
        ("switch", 0.0, (1.0, 0.0)),
        ("switch", 0.79, (1.0, 0.0)),
        ("switch", 0.8, (0.0, 0.5)),  # switch_at itself is already dense
        ("switch", 1.0, (0.0, 0.5)),
        ("linear", 0.0, (1.0, 0.0)),
        ("linear", 0.25, (0.75, 0.125)),
        ("linear", 0.8, (1.0 - 0.8, 0.5 * 0.8)),
        ("linear", 1.0, (0.0, 0.5)),
        ("decay", 0.0, (1.0, 0.5)),
        ("decay", 0.3, (1.0, 0.5 * (1 - 0.3 / 0.8))),
        ("decay", 0.8, (1.0, 0.0)),
        ("decay", 0.95, (1.0, 0.0)),
    ],
)
def test_mix_weights_hand_values(schedule, progress, expected):
    assert mix_weights(schedule, progress, weight=0.5) == expected


def test_switch_over_a_run_is_sequence_only_for_the_first_80_percent():
    total = 10
    weights = [mix_weights("switch", i / total) for i in range(total)]
    assert weights == [(1.0, 0.0)] * 8 + [(0.0, 1.0)] * 2
    assert mix_weights("switch", 0.0, switch_at=0.0) == (0.0, 1.0)
    assert mix_weights("switch", 0.999, switch_at=1.0) == (1.0, 0.0)
    assert mix_weights("switch", 1.0, switch_at=1.0) == (0.0, 1.0)


def test_linear_weights_sum_to_one_with_unit_weight():
    for i in range(11):
        w_seq, w_dense = mix_weights("linear", i / 10)
        assert w_seq + w_dense == pytest.approx(1.0)


def test_schedule_errors():
    assert SCHEDULES == ("constant", "switch", "linear", "decay")
    with pytest.raises(ValueError, match="unknown reward schedule 'cosine'; valid: constant, decay, linear, switch"):
        mix_weights("cosine", 0.5)
    for bad in (-0.1, 1.5, 37):
        with pytest.raises(ValueError, match=r"progress must lie in \[0, 1\]"):
            mix_weights("linear", bad)
    with pytest.raises(ValueError, match=r"switch_at must lie in \[0, 1\]"):
        mix_weights("switch", 0.5, switch_at=2.0)


# ----------------------------------------------------------------------------- mix_rewards


def test_mix_rewards_weighted_sum_and_mask_union():
    seq = torch.tensor([[0.0, 0.0, 1.0], [0.0, 9.0, 0.0]])  # 9.0 sits at an unplaced position
    seq_mask = torch.tensor([[False, False, True], [False, False, True]])
    dense = torch.tensor([[0.5, -0.5, 0.25], [0.1, 7.0, 0.3]])
    dense_mask = torch.tensor([[True, True, False], [True, False, True]])
    rewards, mask = mix_rewards(seq, seq_mask, dense, dense_mask, 1.0, 2.0)
    assert torch.allclose(rewards, torch.tensor([[1.0, -1.0, 1.0], [0.2, 0.0, 0.6]]))
    assert mask.tolist() == [[True, True, True], [True, False, True]]
    # a zero weight switches a term off: its values and its mask drop out
    rewards, mask = mix_rewards(seq, seq_mask, dense, dense_mask, 1.0, 0.0)
    assert rewards.tolist() == [[0.0, 0.0, 1.0], [0.0, 0.0, 0.0]]
    assert torch.equal(mask, seq_mask)
    rewards, mask = mix_rewards(seq, seq_mask, dense, dense_mask, 0.0, 1.0)
    assert torch.equal(rewards, torch.where(dense_mask, dense, 0)) and torch.equal(mask, dense_mask)
    rewards, mask = mix_rewards(seq, seq_mask, dense, dense_mask, 0.0, 0.0)
    assert not mask.any() and not rewards.any()


def test_mix_rewards_checks_shapes():
    x, m = torch.zeros(2, 3), torch.zeros(2, 3, dtype=torch.bool)
    with pytest.raises(ValueError, match="dense_rewards must be a floating-point tensor"):
        mix_rewards(x, m, torch.zeros(2, 4), m, 1.0, 1.0)
    with pytest.raises(ValueError, match="seq_mask must be a bool tensor"):
        mix_rewards(x, m.float(), x, m, 1.0, 1.0)


# ----------------------------------------------------------------------------- calibration


def test_dense_verdict():
    rewards = torch.tensor(
        [
            [0.9, 0.0, 0.5, 0.0],  # placed 0.9 and 0.5 (0.5 is at the threshold): correct
            [0.9, 0.0, 0.2, 0.0],  # one step below: wrong
            [0.0, 0.0, 0.0, 0.0],  # nothing placed: not valid
            [0.8, 0.1, 0.0, 0.0],  # the 0.1 sits on a masked (observation) token: ignored
        ]
    )
    reward_mask = torch.tensor(
        [[True, False, True, False], [True, False, True, False], [False] * 4, [True, True, False, False]]
    )
    response_mask = torch.tensor([[True] * 4, [True] * 4, [True] * 4, [True, False, True, False]])
    verdict, valid = dense_verdict(rewards, reward_mask, response_mask)
    assert verdict.tolist() == [True, False, False, True]
    assert valid.tolist() == [True, True, False, True]
    verdict, _ = dense_verdict(rewards, reward_mask, response_mask, threshold=0.6)
    assert verdict.tolist() == [False, False, False, True]


def test_calibrator_ema_hand_values():
    cal = Calibrator(momentum=0.9, weight=2.0)
    assert cal.agreement == 1.0 and cal.weight == 2.0  # trusted until shown otherwise
    outcome = torch.tensor([True, True, False, False])
    valid = torch.ones(4, dtype=torch.bool)
    # agreement 1/2: A = 1 + 0.1 * (0.5 - 1) = 0.95
    assert cal.update(torch.tensor([True, False, True, False]), outcome, valid) == pytest.approx(0.95)
    # agreement 0: A = 0.95 + 0.1 * (0 - 0.95) = 0.855
    assert cal.update(~outcome, outcome, valid) == pytest.approx(0.855)
    # agreement 1: A = 0.855 + 0.1 * (1 - 0.855) = 0.8695
    assert cal.update(outcome, outcome, valid) == pytest.approx(0.8695)
    assert cal.weight == pytest.approx(2.0 * (0.8695 - 0.5) / 0.5)
    assert cal.updates == 3


def test_calibrator_counts_only_valid_responses():
    cal = Calibrator(momentum=0.5)
    outcome = torch.tensor([True, False, True, False])
    verdicts = torch.tensor([True, False, False, True])  # rows 2 and 3 disagree, but are not valid
    valid = torch.tensor([True, True, False, False])
    assert cal.update(verdicts, outcome, valid) == 1.0
    cal.update(~outcome, outcome, torch.tensor([True, False, False, False]))  # 0 of 1 agree
    assert cal.agreement == 0.5 and cal.weight == 0.0
    # no valid response: no evidence, no change
    assert cal.update(verdicts, outcome, torch.zeros(4, dtype=torch.bool)) == 0.5


def test_oracle_source_keeps_full_weight():
    gen = torch.Generator().manual_seed(0)
    cal = Calibrator(momentum=0.9, weight=1.5)
    for _ in range(100):
        outcome = torch.rand(32, generator=gen) < 0.3
        cal.update(outcome.clone(), outcome, torch.ones(32, dtype=torch.bool))
    assert cal.agreement == 1.0 and cal.weight == 1.5


def test_coin_flip_source_decays_toward_zero_and_a_contrarian_hits_zero():
    gen = torch.Generator().manual_seed(1)
    cal = Calibrator(momentum=0.9)
    trace = []
    for _ in range(200):
        outcome = torch.rand(64, generator=gen) < 0.5
        verdicts = torch.rand(64, generator=gen) < 0.5
        cal.update(verdicts, outcome, torch.ones(64, dtype=torch.bool))
        trace.append(cal.weight)
    assert trace[0] > 0.8  # one batch barely moves a trusted source
    assert abs(cal.agreement - 0.5) < 0.1
    assert max(trace[100:]) < 0.25 and sum(trace[100:]) / 100 < 0.1
    contrarian = Calibrator(momentum=0.9)
    outcome = torch.tensor([True, False] * 8)
    for _ in range(30):
        contrarian.update(~outcome, outcome, torch.ones(16, dtype=torch.bool))
    assert contrarian.agreement < 0.05 and contrarian.weight == 0.0  # clamped, never negative


def test_calibrator_state_dict_round_trip():
    gen = torch.Generator().manual_seed(2)
    batches = [
        (torch.rand(8, generator=gen) < 0.5, torch.rand(8, generator=gen) < 0.5, torch.rand(8, generator=gen) < 0.8)
        for _ in range(6)
    ]
    a = Calibrator(momentum=0.8)
    for batch in batches[:3]:
        a.update(*batch)
    b = Calibrator(momentum=0.8)
    b.load_state_dict(a.state_dict())
    assert b.state_dict() == a.state_dict() and b.weight == a.weight
    for batch in batches[3:]:
        assert a.update(*batch) == b.update(*batch)
    with pytest.raises(KeyError, match="missing"):
        b.load_state_dict({"agreement": 0.7})


def test_calibrator_validation():
    with pytest.raises(ValueError, match=r"momentum must lie in \[0, 1\)"):
        Calibrator(momentum=1.0)
    with pytest.raises(ValueError, match="weight must be >= 0"):
        Calibrator(weight=-1.0)
    cal = Calibrator()
    ok = torch.ones(3, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"outcome must be a bool tensor of shape \(B,\) = \(3,\)"):
        cal.update(ok, torch.ones(3), ok)
    with pytest.raises(ValueError, match="valid must be a bool tensor"):
        cal.update(ok, ok, torch.ones(4, dtype=torch.bool))


def test_dense_verdict_feeds_the_calibrator():
    # a step source that rejects a step of every correct response is trusted less and less
    outcome = torch.tensor([True, True, False, False])
    rewards = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 0.0], [0.0, 1.0]])
    mask = torch.ones(4, 2, dtype=torch.bool)
    verdict, valid = dense_verdict(rewards, mask, mask)
    assert verdict.tolist() == [False, False, False, False]
    cal = Calibrator(momentum=0.0)  # no memory: the agreement is the last batch's
    assert cal.update(verdict, outcome, valid) == 0.5 and cal.weight == 0.0


def test_top_q_count_matches_exact_rational_ceiling():
    # ceil(q * B) on a grid of q = 0.01..1.00 agrees with exact rational arithmetic; in floats
    # 0.07 * 100 = 7.000000000000001, 0.28 * 25 = 7.000000000000001, ...
    for q_pct, b in itertools.product(range(1, 101), [*range(1, 25), 25, 50, 75, 100]):
        keep = filter_top_q(torch.zeros(b), q_pct / 100, None)
        assert int(keep.sum()) == math.ceil(Fraction(q_pct, 100) * b), (q_pct, b)
