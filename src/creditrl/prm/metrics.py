"""PRM metrics: step-level discrimination (:func:`auroc`, :func:`false_positive_rate`), solution
scores (:func:`aggregate_steps`), best-of-N selection (:func:`select`, :func:`best_of_n_accuracy`)
and the shortcut probe's fit (:func:`linear_r2`)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from creditrl.credit.registry import lookup

__all__ = [
    "AGGREGATIONS",
    "SELECTORS",
    "Candidate",
    "SameAnswer",
    "aggregate_steps",
    "answer_groups",
    "auroc",
    "best_of_n",
    "best_of_n_accuracy",
    "false_positive_rate",
    "linear_r2",
    "majority_vote",
    "select",
]


def _hard(value: float | bool, what: str, i: int) -> int:
    """A true label as 0/1; anything but 0/1 (or a bool) is an error."""
    if isinstance(value, bool) or value in (0, 1):
        return int(value)
    raise ValueError(f"{what}[{i}] must be a hard label 0/1 (or None), got {value!r}")


def _check_lengths(a: Sequence, b: Sequence, names: str) -> None:
    if len(a) != len(b):
        raise ValueError(f"{names} must have the same length, got {len(a)} and {len(b)}")


def auroc(scores: Sequence[float], labels: Sequence[float | bool | None]) -> float:
    """Area under the ROC curve of ``scores`` for hard ``labels`` (pairs with label None skipped).

    The Mann-Whitney form, ties counted as one half::

        AUROC = (1 / (P N)) sum_{i: y_i=1} sum_{j: y_j=0} ([s_i > s_j] + 1/2 [s_i = s_j])

    computed from mid-ranks: ``(R_pos - P (P + 1) / 2) / (P N)`` with ``R_pos`` the sum of the
    (tie-averaged, 1-based) ranks of the positives. 1.0: every right step scores above every
    wrong one; 0.5: chance.

    Raises:
        ValueError: On different lengths, a non-finite score, a label other than 0/1/None, or
            when only one class is present among the labelled pairs.
    """
    _check_lengths(scores, labels, "scores and labels")
    kept = [(float(s), _hard(y, "labels", i)) for i, (s, y) in enumerate(zip(scores, labels)) if y is not None]
    if any(not math.isfinite(s) for s, _ in kept):
        raise ValueError("scores must be finite numbers")
    s = np.array([x for x, _ in kept], dtype=np.float64)
    y = np.array([c for _, c in kept], dtype=np.int64)
    n_pos, n_neg = int(y.sum()), int(len(y) - y.sum())
    if n_pos == 0 or n_neg == 0:
        present = "positive (1)" if n_pos else "negative (0)" if n_neg else "no"
        raise ValueError(
            f"AUROC needs both classes among the labels; only {present} labels are present "
            f"({len(y)} labelled of {len(labels)})"
        )
    _, inverse, counts = np.unique(s, return_inverse=True, return_counts=True)
    ends = np.cumsum(counts)  # 1-based rank of the last member of each tie group
    ranks = (ends - (counts - 1) / 2.0)[inverse]
    u = ranks[y == 1].sum() - n_pos * (n_pos + 1) / 2.0
    return float(u / (n_pos * n_neg))


def false_positive_rate(pred_labels: Sequence[float | None], true_labels: Sequence[float | bool | None]) -> float:
    """Share of truly wrong steps that the predicted labels call right.

    ``FPR = #{k : true_k = 0 and pred_k >= 0.5} / #{k : true_k = 0}``, over steps where both
    labels are given (a ``None`` on either side is no claim and is skipped). Predicted labels
    may be soft (thresholded at 0.5); true labels must be hard 0/1.

    Raises:
        ValueError: On different lengths, a true label other than 0/1/None, or when no truly
            wrong step is labelled on both sides.
    """
    _check_lengths(pred_labels, true_labels, "pred_labels and true_labels")
    wrong = passed = 0
    for i, (pred, true) in enumerate(zip(pred_labels, true_labels)):
        if pred is None or true is None or _hard(true, "true_labels", i) == 1:
            continue
        wrong += 1
        passed += int(pred >= 0.5)
    if wrong == 0:
        raise ValueError("false_positive_rate needs at least one truly wrong step (true label 0) with a prediction")
    return passed / wrong


# ----------------------------------------------------------------------------- solution scores

AGGREGATIONS: dict[str, Callable[[Sequence[float]], float]] = {
    "min": lambda s: float(min(s)),  # a solution is as good as its weakest step
    "product": lambda s: float(math.prod(s)),  # P(every step right) if steps were independent
    "last": lambda s: float(s[-1]),  # the score after the final step, a value of the whole prefix
    "mean": lambda s: float(sum(s) / len(s)),
}
"""Step-score aggregations by name: ``f(step_scores) -> solution score`` (Lightman et al., 2023 use
``product``, Wang et al., 2024 ``min``). ``product`` expects probabilities in [0, 1]."""


def aggregate_steps(name: str, step_scores: Sequence[float]) -> float:
    """Aggregate a solution's step scores into one score with ``AGGREGATIONS[name]``.

    Raises:
        ValueError: On an unknown name (listing the valid ones) or an empty ``step_scores`` (a
            solution without steps has no PRM score; the caller decides what it gets).
    """
    fn = lookup(AGGREGATIONS, "aggregation", name)
    if len(step_scores) == 0:
        raise ValueError(f"cannot aggregate ({name}) an empty list of step scores: the solution has no steps")
    return fn(step_scores)


# ----------------------------------------------------------------------------- best-of-N


def best_of_n(candidate_scores: Sequence[float]) -> int:
    """Index of the highest score; ties go to the first (the earliest sample).

    Raises:
        ValueError: With no candidates or a NaN score.
    """
    if len(candidate_scores) == 0:
        raise ValueError("best_of_n needs at least one candidate")
    if any(math.isnan(s) for s in candidate_scores):
        raise ValueError("best_of_n: a candidate score is NaN")
    return max(range(len(candidate_scores)), key=candidate_scores.__getitem__)


SameAnswer = Callable[[str, str], bool]
"""``same(a, b)``: whether two extracted answers are the same answer (e.g. math-verify equivalence;
:func:`creditrl.tasks.base.same_answer` bound to a task)."""


def answer_groups(answers: Sequence[str | None], same: SameAnswer | None = None) -> list[list[int]]:
    """The candidates grouped by answer: lists of indices, in order of each group's first member.

    Answers are taken in order; each non-None answer joins the first group whose first answer
    ``rep`` it equals (``rep == answer``, always tried first) or agrees with (``same(rep,
    answer)``), else it opens a new group. With ``same=None`` only equal strings agree. For an
    equivalence relation the groups are its classes; for a ``same`` that is not transitive, a
    group is what agrees with its first member. None answers belong to no group.
    """
    groups: list[list[int]] = []
    for i, answer in enumerate(answers):
        if answer is None:
            continue
        for members in groups:
            rep = answers[members[0]]
            if rep == answer or (same is not None and same(rep, answer)):
                members.append(i)
                break
        else:
            groups.append([i])
    return groups


def majority_vote(answers: Sequence[str | None], same: SameAnswer | None = None) -> int:
    """Index of the first candidate of the largest group of agreeing non-None answers
    (:func:`answer_groups`; ``same=None``: equal strings only).

    Ties between groups go to the group whose first member came first. When no candidate has an
    answer there is nothing to vote on and the first candidate (0) is returned, as
    :func:`best_of_n` does when all scores tie.

    Raises:
        ValueError: With no candidates.
    """
    if len(answers) == 0:
        raise ValueError("majority_vote needs at least one candidate")
    groups = answer_groups(answers, same)
    if not groups:
        return 0
    return max(groups, key=lambda members: (len(members), -members[0]))[0]


@dataclass(frozen=True)
class Candidate:
    """One sampled solution of a problem, with what every selection method may look at.

    Attributes:
        correct: Whether the solution's final answer is right (the ground truth).
        step_scores: The PRM's score of each step (for the ``prm_*`` methods).
        orm_score: An outcome reward model's score of the whole solution (for ``orm``).
        answer: The extracted final answer, None when there is none (for ``majority``).
    """

    correct: bool
    step_scores: tuple[float, ...] = ()
    orm_score: float | None = None
    answer: str | None = None


Selector = Callable[[Sequence[Candidate], SameAnswer | None], int]


def _orm(candidates: Sequence[Candidate], same: SameAnswer | None) -> int:
    missing = [i for i, c in enumerate(candidates) if c.orm_score is None]
    if missing:
        raise ValueError(f"method 'orm' needs orm_score on every candidate; candidate {missing[0]} has none")
    return best_of_n([c.orm_score for c in candidates])  # type: ignore[misc]


def _majority(candidates: Sequence[Candidate], same: SameAnswer | None) -> int:
    return majority_vote([c.answer for c in candidates], same)


def _prm(aggregation: str) -> Selector:
    def pick(candidates: Sequence[Candidate], same: SameAnswer | None) -> int:
        scores = []
        for i, c in enumerate(candidates):
            if not c.step_scores:
                raise ValueError(f"method 'prm_{aggregation}': candidate {i} has no step scores")
            scores.append(aggregate_steps(aggregation, c.step_scores))
        return best_of_n(scores)

    return pick


SELECTORS: dict[str, Selector] = {
    "orm": _orm,
    "majority": _majority,
    **{f"prm_{name}": _prm(name) for name in AGGREGATIONS},
}
"""Best-of-N selection methods by name: ``f(candidates, same) -> index of the chosen one``.
``orm``: highest ``orm_score``; ``majority``: majority vote over ``answer``, answers grouped by
``same`` (:func:`majority_vote`); ``prm_<agg>``: highest PRM solution score under aggregation
``<agg>`` (min, product, last, mean). Only ``majority`` reads ``same``."""


def select(method: str, candidates: Sequence[Candidate], *, same: SameAnswer | None = None) -> int:
    """Index of the candidate that ``SELECTORS[method]`` picks (ties: the first); ``same`` is the
    answer equivalence of a majority vote (None: equal strings only).

    Raises:
        ValueError: On an unknown method, no candidates, or a candidate missing what the
            method needs (``orm_score``, ``step_scores``).
    """
    fn = lookup(SELECTORS, "best-of-N method", method)
    if not candidates:
        raise ValueError("select needs at least one candidate")
    return fn(candidates, same)


def best_of_n_accuracy(
    groups: Sequence[Sequence[Candidate]],
    method: str,
    ns: Iterable[int] = (1, 4, 16, 64),
    *,
    same: SameAnswer | None = None,
) -> dict[int, float]:
    """Best-of-N accuracy of ``method`` at each N in ``ns`` (``same``: as in :func:`select`).

    ``groups[g]`` are the candidates sampled for problem g, in sampling order. At each N the
    method sees the FIRST N candidates of every group (so the curves over N are nested, as if
    sampling had stopped at N), picks one, and the accuracy is the share of groups whose pick
    is correct::

        acc(N) = (1/G) sum_g correct(groups[g][select(method, groups[g][:N])])

    Returns:
        ``{N: accuracy}`` in the order of ``ns``.

    Raises:
        ValueError: With no groups, an N < 1, a group with fewer than N candidates (naming
            it), or what :func:`select` raises.
    """
    if not groups:
        raise ValueError("best_of_n_accuracy needs at least one group")
    lookup(SELECTORS, "best-of-N method", method)
    result: dict[int, float] = {}
    for n in ns:
        if n < 1:
            raise ValueError(f"every N must be >= 1, got {n}")
        hits = 0
        for g, group in enumerate(groups):
            if len(group) < n:
                raise ValueError(f"group {g} has {len(group)} candidates; best-of-{n} needs at least {n}")
            hits += int(group[select(method, group[:n], same=same)].correct)
        result[n] = hits / len(groups)
    return result


# ----------------------------------------------------------------------------- shortcut probe


def fit_predict(x_fit: np.ndarray, y_fit: np.ndarray, x_eval: np.ndarray) -> np.ndarray:
    """Least-squares linear regression with an intercept, fitted on one set, applied to another."""
    design = np.column_stack([x_fit, np.ones(len(x_fit))])  # (n, d + 1)
    coef, *_ = np.linalg.lstsq(design, y_fit, rcond=None)
    return np.column_stack([x_eval, np.ones(len(x_eval))]) @ coef


def linear_r2(
    features: Sequence[float] | Sequence[Sequence[float]] | np.ndarray, target: Sequence[float] | np.ndarray
) -> float:
    """R^2 of the least-squares fit ``target ~ features @ w + b`` (with intercept).

    ``features`` is (n,) for one feature or (n, d); ``target`` is (n,).
    ``R^2 = 1 - sum (y - y_hat)^2 / sum (y - mean y)^2``: the share of the target's variance
    a linear function of the features explains (1.0: all of it; 0.0: no more than a constant).
    In-sample, so it only grows with d; keep d small against n. A constant target gives 0.0.

    Raises:
        ValueError: On features that are not 1-D or 2-D, a row count different from the
            target's, fewer than 2 samples, or non-finite values.
    """
    x = np.asarray(features, dtype=np.float64)
    y = np.asarray(target, dtype=np.float64)
    if x.ndim == 1:
        x = x[:, None]
    if x.ndim != 2 or y.ndim != 1:
        raise ValueError(f"features must be (n,) or (n, d) and target (n,); got {x.shape} and {y.shape}")
    if x.shape[0] != y.shape[0]:
        raise ValueError(f"features have {x.shape[0]} rows but target has {y.shape[0]} values")
    if y.shape[0] < 2:
        raise ValueError(f"linear_r2 needs at least 2 samples, got {y.shape[0]}")
    if not (np.isfinite(x).all() and np.isfinite(y).all()):
        raise ValueError("features and target must be finite")
    if np.all(y == y[0]):
        return 0.0
    residual = y - fit_predict(x, y, x)
    centred = y - y.mean()
    return float(1.0 - (residual @ residual) / (centred @ centred))
