"""Why a saved group carries no credit: its reward spread, and the notes the inspector shows.

Group-relative estimators (``grpo``, ``rloo``, ``dr_grpo``, ...) compare the completions of a
group with each other, so a group whose completions all scored the same gets advantage 0 on
every token, and its credit precision is undefined. The page says so instead of a bare "n/a".

A completion's score is its sequence reward ``R``: the sum of its rewards over its unmasked
tokens (what the estimators sum, ``creditrl.credit.estimators.sequence_return``). Only kept
completions enter credit (the error policy or the hybrid filter dropped the others), so a group
has **reward spread** when two of its kept completions' ``R`` differ by more than
``SPREAD_TOL * max(1, max |R|)``. "No credit" is a property of one estimator's advantages on the
group: every one of them exactly 0. Its reason is, in this order: every completion dropped,
every kept token masked, no reward spread, else the estimator itself (the rewards differ).
"""

from __future__ import annotations

from typing import Any

SPREAD_TOL = 1e-6  # relative; float32 sums of the same rewards in another order differ by less

# Short reasons for an undefined credit precision (the precision table shows these).
DROPPED, MASKED, NO_SPREAD, ZERO = "all dropped", "all masked", "no reward spread", "all advantages 0"
NO_LABELS, NO_NEGATIVE = "no step labels", "no negative credit"


def num(x: float) -> str:
    """A score as the notes print it: ``1``, ``0.5``, ``-0.25``, ``0.3333``."""
    s = f"{x:.4g}"
    return "0" if s == "-0" else s


def sequence_reward(response: dict[str, Any]) -> float:
    """``R``: the response's rewards summed over its unmasked tokens."""
    masked = set(response["masked"])
    return sum(x for i, x in enumerate(response["rewards"]) if i not in masked)


def _kept_scores(group: dict[str, Any]) -> list[float]:
    return [sequence_reward(r) for r in group["responses"] if r["kept"]]


def has_spread(group: dict[str, Any]) -> bool:
    """Whether two kept completions of ``group`` scored differently (see the module docstring)."""
    scores = _kept_scores(group)
    if len(scores) < 2:
        return False
    return max(scores) - min(scores) > SPREAD_TOL * max(1.0, max(abs(s) for s in scores))


def spread_note(group: dict[str, Any]) -> str:
    """ "" for a group with reward spread, else what its completions scored, e.g.
    ``"no reward spread: all 4 completions scored 1"``."""
    if has_spread(group):
        return ""
    n, scores = len(group["responses"]), _kept_scores(group)
    k = len(scores)
    if k == 0:
        return f"no reward spread: all {n} completions were dropped"
    if k == 1:
        if n == 1:
            return f"no reward spread: the group's only completion scored {num(scores[0])}"
        return f"no reward spread: only 1 of {n} completions was kept (it scored {num(scores[0])})"
    dropped = f" ({n - k} dropped)" if k < n else ""
    kept = "" if k == n else " kept"
    return f"no reward spread: all {k}{kept} completions scored {num(scores[0])}{dropped}"


def _kept_advantages(group: dict[str, Any], adv: list[list[float]]) -> list[float]:
    """The advantages on the kept completions' unmasked tokens (the only ones credit sets)."""
    out = []
    for r, a in zip(group["responses"], adv):
        if r["kept"]:
            masked = set(r["masked"])
            out += [x for i, x in enumerate(a) if i not in masked]
    return out


def _zero_reason(group: dict[str, Any]) -> tuple[str, str]:
    """(short, long) reason why every advantage of ``group`` is 0."""
    n, responses = len(group["responses"]), group["responses"]
    if not any(r["kept"] for r in responses):
        return DROPPED, f"no credit: all {n} completions were dropped, so every advantage is 0"
    if all(len(r["masked"]) >= len(r["texts"]) for r in responses if r["kept"]):
        return MASKED, "no credit: every token of the kept completions is masked, so every advantage is 0"
    note = spread_note(group)
    if note:
        return NO_SPREAD, note + ", so every advantage is 0"
    scores = _kept_scores(group)
    return ZERO, (
        f"no credit: every advantage is 0 although the completions scored {num(min(scores))} to "
        f"{num(max(scores))} (this estimator found nothing to compare)"
    )


def credit_notes(group: dict[str, Any], adv: list[list[float]], precision: float | None) -> dict[str, str]:
    """What the page says about one estimator's credit ``adv`` (response, token) on ``group``:
    ``why`` (long) and ``short`` say why the credit precision is undefined ("" when it is
    defined); ``note`` flags credit that is the same on every kept token of a group without
    reward spread (batch whitening or a baseline-free estimator), which tells nothing apart."""
    out = {"why": "", "short": "", "note": ""}
    values = _kept_advantages(group, adv)
    if all(a == 0 for row in adv for a in row):
        out["short"], out["why"] = _zero_reason(group)
        return out
    note = spread_note(group)
    if note and len(set(values)) == 1:
        out["note"] = f"{note}; every advantage is {num(values[0])}, so the credit does not tell them apart"
    if precision is None:
        if all(r["labels"] is None for r in group["responses"]):
            out["short"], out["why"] = NO_LABELS, "no oracle step labels (the task has no step checker)"
        else:
            out["short"], out["why"] = NO_NEGATIVE, "no negative credit on a labelled step"
    return out


def spread_counts(groups: list[dict[str, Any]]) -> dict[str, Any]:
    """How many of ``groups`` have no reward spread: ``{"none", "groups", "text"}``, the text
    e.g. ``"1 of 3 saved groups has no reward spread"``."""
    none = sum(not has_spread(g) for g in groups)
    verb = "has" if none == 1 else "have"
    return {
        "none": none,
        "groups": len(groups),
        "text": f"{none} of {len(groups)} saved groups {verb} no reward spread",
    }
