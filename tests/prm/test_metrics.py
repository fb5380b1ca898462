"""PRM metrics against hand-computed values and slow reference loops."""

import math
import random
import re

import numpy as np
import pytest

from creditrl.prm.metrics import (
    AGGREGATIONS,
    SELECTORS,
    Candidate,
    aggregate_steps,
    auroc,
    best_of_n,
    best_of_n_accuracy,
    false_positive_rate,
    linear_r2,
    majority_vote,
    select,
)


def auroc_reference(scores, labels):
    """The Mann-Whitney double loop over (positive, negative) pairs, ties 1/2."""
    pos = [s for s, y in zip(scores, labels) if y == 1]
    neg = [s for s, y in zip(scores, labels) if y == 0]
    wins = sum(1.0 if p > n else 0.5 if p == n else 0.0 for p in pos for n in neg)
    return wins / (len(pos) * len(neg))


# ----------------------------------------------------------------------------- AUROC, FPR


def test_auroc_by_hand():
    # positives 0.35, 0.8 against negatives 0.1, 0.4: 0.35 beats 0.1 only, 0.8 beats both -> 3/4
    assert auroc([0.1, 0.4, 0.35, 0.8], [0, 0, 1, 1]) == 0.75
    # ties count 1/2: positives {2, 3}, negatives {1, 2}: 1 + 1/2 + 1 + 1 = 3.5 of 4 pairs
    assert auroc([1, 2, 2, 3], [0, 1, 0, 1]) == 0.875
    assert auroc([0.5, 0.5, 0.5], [1, 0, 0]) == 0.5
    assert auroc([0.9, 0.1], [True, False]) == 1.0
    assert auroc([0.9, 0.1], [0.0, 1.0]) == 0.0
    # None labels are skipped, whatever their score
    assert auroc([0.1, 100.0, 0.8, -5.0], [0, None, 1, None]) == 1.0


def test_auroc_matches_the_pair_loop():
    rng = random.Random(0)
    for _ in range(50):
        n = rng.randint(2, 40)
        scores = [rng.choice([0.0, 0.25, 0.5, 0.75, 1.0]) if rng.random() < 0.5 else rng.random() for _ in range(n)]
        labels = [rng.randint(0, 1) for _ in range(n)]
        labels[0], labels[1] = 0, 1
        assert auroc(scores, labels) == pytest.approx(auroc_reference(scores, labels), abs=1e-12)


def test_auroc_errors():
    with pytest.raises(ValueError, match=re.escape("only positive (1) labels are present (2 labelled of 3)")):
        auroc([0.1, 0.2, 0.3], [1, 1, None])
    with pytest.raises(ValueError, match=re.escape("only negative (0) labels are present")):
        auroc([0.1, 0.2], [0, 0])
    with pytest.raises(ValueError, match="AUROC needs both classes"):
        auroc([0.1], [None])
    with pytest.raises(ValueError, match=re.escape("labels[1] must be a hard label 0/1 (or None), got 0.7")):
        auroc([0.1, 0.2], [1, 0.7])
    with pytest.raises(ValueError, match="same length, got 2 and 1"):
        auroc([0.1, 0.2], [1])
    with pytest.raises(ValueError, match="finite"):
        auroc([float("nan"), 0.2], [1, 0])


def test_false_positive_rate_by_hand():
    pred = [0.9, 0.2, 0.5, 1.0, 0.0, None]
    true = [0, 0, 0, 1, None, 0]
    # truly wrong and predicted: steps 0, 1, 2; called right (>= 0.5): steps 0 and 2
    assert false_positive_rate(pred, true) == pytest.approx(2 / 3)
    assert false_positive_rate([1.0, 0.0], [False, True]) == 1.0
    # hard MC labels pass a wrong step that one continuation in four recovers; soft ones do not
    oracle = [1, 0, 0, 1]
    soft = [1.0, 0.25, 0.0, 0.75]
    hard = [1.0 if x > 0 else 0.0 for x in soft]
    assert (false_positive_rate(hard, oracle), false_positive_rate(soft, oracle)) == (0.5, 0.0)


def test_false_positive_rate_errors():
    with pytest.raises(ValueError, match=re.escape("at least one truly wrong step (true label 0)")):
        false_positive_rate([0.0, 1.0, 0.2], [1, 1, None])
    with pytest.raises(ValueError, match=re.escape("true_labels[0] must be a hard label 0/1")):
        false_positive_rate([0.0], [0.5])
    with pytest.raises(ValueError, match="same length"):
        false_positive_rate([0.0], [0, 1])


# ----------------------------------------------------------------------------- aggregation


@pytest.mark.parametrize("name, expected", [("min", 0.5), ("product", 0.36), ("last", 0.8), ("mean", 2.2 / 3)])
def test_aggregations_by_hand(name, expected):
    assert aggregate_steps(name, [0.9, 0.5, 0.8]) == pytest.approx(expected, abs=1e-15)
    assert aggregate_steps(name, [0.7]) == pytest.approx(0.7)
    assert isinstance(aggregate_steps(name, (1, 1)), float)


def test_aggregation_registry_and_errors():
    assert sorted(AGGREGATIONS) == ["last", "mean", "min", "product"]
    with pytest.raises(ValueError, match=re.escape("unknown aggregation 'max'; valid: last, mean, min, product")):
        aggregate_steps("max", [0.5])
    with pytest.raises(ValueError, match=re.escape("cannot aggregate (min) an empty list of step scores")):
        aggregate_steps("min", [])


# ----------------------------------------------------------------------------- best-of-N


def test_best_of_n_and_majority_vote_by_hand():
    assert best_of_n([0.2, 0.7, 0.7, 0.1]) == 1  # tie: the first
    assert best_of_n([-3.0]) == 0
    assert best_of_n([float("-inf"), -1e9]) == 1
    assert majority_vote(["3", "5", None, "5", "3"]) == 0  # 2-2 tie: "3" was seen first
    assert majority_vote([None, "5", "3", "5", "3", "3"]) == 2  # "3" wins 3-2; its first holder
    assert majority_vote([None, "4"]) == 1
    assert majority_vote([None, None]) == 0
    with pytest.raises(ValueError, match="at least one candidate"):
        best_of_n([])
    with pytest.raises(ValueError, match="NaN"):
        best_of_n([0.1, float("nan")])
    with pytest.raises(ValueError, match="at least one candidate"):
        majority_vote([])


def cand(correct, steps, orm, answer):
    return Candidate(correct=correct, step_scores=tuple(steps), orm_score=orm, answer=answer)


# Problem A (answer "8"), 4 candidates in sampling order:
#   c0: wrong,   steps (0.9, 0.2)  min .2  prod .18  last .2  mean .55   orm .6  answer "7"
#   c1: right,   steps (0.6, 0.7)  min .6  prod .42  last .7  mean .65   orm .5  answer "8"
#   c2: wrong,   steps (0.95, 0.9) min .9  prod .855 last .9  mean .925  orm .4  answer "7"
#   c3: right,   steps (0.8,)      min .8  prod .8   last .8  mean .8    orm .9  answer "8"
# Problem B (answer "3"):
#   c0: right,   steps (0.5, 0.5)  min .5  prod .25  last .5  mean .5    orm .3  answer "3"
#   c1: wrong,   steps (0.4, 0.99) min .4  prod .396 last .99 mean .695  orm .8  answer "4"
#   c2: wrong,   steps (0.1,)      all .1                                orm .1  answer "4"
#   c3: wrong,   steps (0.3, 0.3)  min .3  prod .09  last .3  mean .3    orm .2  answer None
GROUPS = [
    [
        cand(False, (0.9, 0.2), 0.6, "7"),
        cand(True, (0.6, 0.7), 0.5, "8"),
        cand(False, (0.95, 0.9), 0.4, "7"),
        cand(True, (0.8,), 0.9, "8"),
    ],
    [
        cand(True, (0.5, 0.5), 0.3, "3"),
        cand(False, (0.4, 0.99), 0.8, "4"),
        cand(False, (0.1,), 0.1, "4"),
        cand(False, (0.3, 0.3), 0.2, None),
    ],
]


@pytest.mark.parametrize(
    "method, picks, expected",
    [
        # picks per N in (1, 2, 4): (index in A, index in B)
        ("orm", {1: (0, 0), 2: (0, 1), 4: (3, 1)}, {1: 0.5, 2: 0.0, 4: 0.5}),
        ("majority", {1: (0, 0), 2: (0, 0), 4: (0, 1)}, {1: 0.5, 2: 0.5, 4: 0.0}),
        ("prm_min", {1: (0, 0), 2: (1, 0), 4: (2, 0)}, {1: 0.5, 2: 1.0, 4: 0.5}),
        ("prm_product", {1: (0, 0), 2: (1, 1), 4: (2, 1)}, {1: 0.5, 2: 0.5, 4: 0.0}),
        ("prm_last", {1: (0, 0), 2: (1, 1), 4: (2, 1)}, {1: 0.5, 2: 0.5, 4: 0.0}),
        ("prm_mean", {1: (0, 0), 2: (1, 1), 4: (2, 1)}, {1: 0.5, 2: 0.5, 4: 0.0}),
    ],
)
def test_best_of_n_accuracy_by_hand(method, picks, expected):
    for n, (a, b) in picks.items():
        assert (select(method, GROUPS[0][:n]), select(method, GROUPS[1][:n])) == (a, b)
    assert best_of_n_accuracy(GROUPS, method, ns=(1, 2, 4)) == expected


def test_majority_groups_answers_by_the_equivalence_given():
    """With ``same``, answers that agree vote together; only majority reads it."""
    same = lambda a, b: float(a) == float(b)  # noqa: E731
    assert majority_vote(["1", "0.5", "0.50", "1", ".5"], same) == 1  # 0.5 three times beats 1 twice
    assert majority_vote(["1", "0.5", "0.50", "1", ".5"]) == 0  # as strings only "1" repeats
    groups = [[cand(False, (0.9,), 0.9, "1"), cand(True, (0.1,), 0.1, "2.0"), cand(True, (0.2,), 0.2, "2")]]
    assert best_of_n_accuracy(groups, "majority", ns=(3,)) == {3: 0.0}  # "1", "2.0", "2": the first
    assert best_of_n_accuracy(groups, "majority", ns=(3,), same=same) == {3: 1.0}
    for method in ("orm", "prm_min"):  # the equivalence changes nothing for the score selectors
        assert select(method, groups[0], same=same) == select(method, groups[0]) == 0


def test_best_of_n_accuracy_defaults_and_order():
    groups = [[Candidate(correct=(i % 3 == 0), orm_score=float(i % 5)) for i in range(64)]]
    # first N: N=1 -> c0 (right); N=4 -> c3 (score 3, right); N=16 -> c4 (first score 4, wrong)
    assert best_of_n_accuracy(groups, "orm") == {1: 1.0, 4: 1.0, 16: 0.0, 64: 0.0}
    assert list(best_of_n_accuracy(groups, "orm", ns=[16, 1])) == [16, 1]


def test_best_of_n_accuracy_errors():
    assert sorted(SELECTORS) == ["majority", "orm", "prm_last", "prm_mean", "prm_min", "prm_product"]
    with pytest.raises(ValueError, match=re.escape("group 1 has 4 candidates; best-of-8 needs at least 8")):
        best_of_n_accuracy([GROUPS[0] + GROUPS[0], GROUPS[1]], "orm", ns=(8,))
    with pytest.raises(ValueError, match=re.escape("unknown best-of-N method 'prm_max'; valid: majority, orm,")):
        best_of_n_accuracy(GROUPS, "prm_max")
    with pytest.raises(ValueError, match="every N must be >= 1, got 0"):
        best_of_n_accuracy(GROUPS, "orm", ns=(0,))
    with pytest.raises(ValueError, match="at least one group"):
        best_of_n_accuracy([], "orm")
    with pytest.raises(ValueError, match="method 'orm' needs orm_score on every candidate; candidate 1 has none"):
        select("orm", [Candidate(True, orm_score=0.1), Candidate(False)])
    with pytest.raises(ValueError, match="method 'prm_min': candidate 0 has no step scores"):
        select("prm_min", [Candidate(True)])


# ----------------------------------------------------------------------------- R^2


def test_linear_r2_exact_linear_fit_is_one():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(30, 2))
    assert linear_r2(x, 2.0 * x[:, 0] - 3.0 * x[:, 1] + 1.0) == pytest.approx(1.0, abs=1e-12)
    assert linear_r2([1, 2, 3, 4], [5, 3, 1, -1]) == pytest.approx(1.0, abs=1e-12)


def test_linear_r2_by_hand():
    # x = 0..3, y = (0, 1, 1, 3): Sxy = 4.5, Sxx = 5, Syy = 4.75, R^2 = Sxy^2 / (Sxx Syy) = 81/95
    assert linear_r2([[0], [1], [2], [3]], [0, 1, 1, 3]) == pytest.approx(81 / 95, abs=1e-12)


def test_linear_r2_constant_cases_are_zero():
    assert linear_r2([1.0, 1.0, 1.0, 1.0], [0.2, 0.9, 0.4, 0.1]) == pytest.approx(0.0, abs=1e-12)
    assert linear_r2([1.0, 2.0, 3.0], [0.1, 0.1, 0.1]) == 0.0


def test_linear_r2_errors():
    with pytest.raises(ValueError, match="features have 3 rows but target has 2 values"):
        linear_r2([1, 2, 3], [1, 2])
    with pytest.raises(ValueError, match="at least 2 samples"):
        linear_r2([1], [1])
    with pytest.raises(ValueError, match=re.escape("features must be (n,) or (n, d) and target (n,)")):
        linear_r2(np.zeros((2, 2, 2)), [1, 2])
    with pytest.raises(ValueError, match="finite"):
        linear_r2([1, math.inf], [1, 2])
