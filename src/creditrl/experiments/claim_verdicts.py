"""The verdict rows of FINDINGS.md: which comparisons each claim setting makes, the claim's rows
judged as one family, their robustness, and the tables that show them.

A finding that tests a claim compares each arm its ``expect`` names with the grid's reference
(the claim's stated baseline) and, where its ``sequence_level`` arm (the setting's best
sequence-level arm: outcome GRPO where it ran) is another arm, with that arm too, under the same
prediction or under ``sequence_expect``. The statistics are those of
:mod:`creditrl.experiments.verdicts`: per-seed paired differences, the seed-level t, Holm's
step-down over the claim's rows.

**Fragile.** A verdict is fragile when it changes with any one seed left out (the interval
recomputed at the row's level from the other seeds) or with a tie margin of ±1 or ±3 points
instead of ±2. The sensitivity table shows those verdicts beside those of the unadjusted 95%
seed-level t and of the previous protocol (the two-level bootstrap, the earlier tie rule).

**Costs** (:func:`cost_ratios`) are the arm's against the reference's in units no machine's speed
or load changes: generated tokens, trained token positions and process-tree CPU seconds (the last
two only where every run of both arms recorded them), and the PRM's labelling and training in
wall seconds.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from creditrl.experiments.verdicts import (
    LEVEL,
    MARGIN,
    METHOD,
    Difference,
    bootstrap_difference,
    holm,
    outcome_matrix,
    previous_verdict,
    seed_differences,
    shared_runs,
    t_difference,
    verdict,
)

__all__ = [
    "MARGINS",
    "Comparison",
    "changes_markdown",
    "comparisons",
    "cost_ratios",
    "judge",
    "level_text",
    "sensitivity_markdown",
    "verdicts_markdown",
]

COSTS = (  # a cost row's key (creditrl.experiments.compare_report.cost_rows) and its column
    ("generated_tokens", "generated tokens"),
    ("trained_positions", "trained token-positions"),
    ("cpu_s", "CPU seconds"),
)
NOT_RECORDED = "not recorded"
MARGINS = (0.01, 0.03)  # the other tie margins a verdict must survive
BASELINE, SEQUENCE, NAMED = "stated baseline", "best sequence-level", "named pair"  # NAMED: a finding's 'also' rows


@dataclass
class Comparison:
    """One verdict row before it is judged: ``arm`` against ``reference`` in one claim setting."""

    claim: str
    finding: str
    arm: str
    reference: str
    role: str  # BASELINE or SEQUENCE
    expect: str
    size: float | None
    per_seed: np.ndarray
    seeds: list[int]
    problems: int
    gain: float  # the arm's held-out exact match at the end minus at its start, mean over seeds
    reference_gain: float
    cost: dict[str, Any]  # against the reference (cost_ratios)
    regime: str = ""
    task: str = ""
    previous: Difference | None = None  # the previous protocol's interval (rows it had: a prediction vs the baseline)
    best: bool = False  # the reference is the setting's best sequence-level arm


def _gain(histories: list[list[dict[str, Any]]]) -> float:
    ends = [[r["eval/accuracy"] for r in h if "eval/accuracy" in r] for h in histories]
    return float(np.mean([e[-1] - e[0] for e in ends]))


def _prm_s(histories: list[list[dict[str, Any]]]) -> float | None:
    """The mean over an arm's runs of their PRM's labelling and training (``time/prm_s`` of the start
    row, wall seconds); None where no run records one."""
    spent = [h[0]["time/prm_s"] for h in histories if h and h[0].get("time/prm_s") is not None]
    return float(np.mean(spent)) if spent else None


def _tokens(histories: list[list[dict[str, Any]]]) -> tuple[float] | None:
    ends = [h[-1].get("tokens/total") for h in histories]
    return (float(np.mean(ends)),) if ends and None not in ends else None


def cost_ratios(
    costs: list[dict[str, Any]], results: dict[str, list[list[dict[str, Any]]]], arm: str, reference: str
) -> dict[str, Any]:
    """For each of :data:`COSTS`, the ratio of ``arm``'s mean to ``reference``'s (``costs``:
    :func:`creditrl.experiments.compare_report.cost_rows`; None where either arm did not record it
    or the reference's is 0), and ``prm_s``: [arm's, reference's] :func:`_prm_s`."""
    by_arm = {c["arm"]: c for c in costs}
    out: dict[str, Any] = {}
    for key, _ in COSTS:
        a, b = by_arm.get(arm, {}).get(key), by_arm.get(reference, {}).get(key)
        out[key] = float(a[0] / b[0]) if a is not None and b is not None and b[0] > 0 else None
    out["prm_s"] = [_prm_s(results[arm]), _prm_s(results[reference])]
    return out


def comparisons(
    finding: dict[str, Any],
    results: dict[str, list[list[dict[str, Any]]]],
    reference: str,
    seeds: list[int] | dict[str, list[int]],
    costs: list[dict[str, Any]] | None = None,
) -> list[Comparison]:
    """The finding's verdict rows: each arm of ``expect`` against ``reference``, then against its
    ``sequence_level`` arm where that is another arm, then the pairs its ``also`` names, each with
    its own expectation; ``costs`` as in :func:`cost_ratios` (None: generated tokens only).
    ``seeds``: the seeds every arm ran, or each arm's own (in the order of its runs in
    ``results``): a row pairs the seeds its two arms share
    (:func:`~creditrl.experiments.verdicts.shared_runs`), its gains are over those seeds, and a
    pair that shares fewer than two seeds gets no row."""
    if not isinstance(seeds, dict):
        seeds = dict.fromkeys(results, list(seeds))
    if costs is None:
        costs = [{"arm": a, "generated_tokens": _tokens(hs)} for a, hs in results.items()]
    named = finding.get("sequence_level")
    best = named or reference
    pairs = [(arm, reference, BASELINE) for arm in finding.get("expect", {})]
    if best != reference:
        pairs += [(arm, best, SEQUENCE) for arm in finding.get("expect", {}) if arm != best]
    also = {(x["arm"], x["against"]): x["expect"] for x in finding.get("also", [])}
    done = {(arm, ref) for arm, ref, _ in pairs}
    pairs += [(arm, against, NAMED) for arm, against in also if (arm, against) not in done]
    rows = []
    for arm, ref, role in pairs:
        runs, against, both = shared_runs(results, seeds, arm, ref)
        if len(runs) < 2:  # a grid still running: two arms that share under two seeds have no interval yet
            continue
        x, y = outcome_matrix(runs), outcome_matrix(against)
        if role == NAMED:
            expect, size = also[(arm, ref)]
        elif role == SEQUENCE:
            expect, size = finding.get("sequence_expect", finding["expect"][arm])
        else:
            expect, size = finding["expect"][arm]
        rows.append(
            Comparison(
                claim=finding["claim_id"],
                finding=finding["id"],
                arm=arm,
                reference=ref,
                role=role,
                expect=expect,
                size=size,
                per_seed=seed_differences(x, y),
                seeds=both,
                problems=x.shape[1],
                gain=_gain(runs),
                reference_gain=_gain(against),
                cost=cost_ratios(costs, results, arm, ref),
                regime=finding.get("regime", ""),
                task=finding.get("task", ""),
                previous=bootstrap_difference(x, y) if role == BASELINE and expect != "any" else None,
                best=ref == named,
            )
        )
    return rows


def _judge_one(c: Comparison, level: float, p_adjusted: float) -> dict[str, Any]:
    diff = t_difference(c.per_seed, level=level, problems=c.problems)
    chosen = verdict(diff, c.expect, size=c.size)
    loso = {  # with two seeds, one left out leaves no spread: no leave-one-out verdicts
        s: verdict(t_difference(np.delete(c.per_seed, i), level=level), c.expect, size=c.size)
        for i, s in enumerate(c.seeds if len(c.seeds) > 2 else [])
    }
    margins = {m: verdict(diff, c.expect, size=c.size, margin=m) for m in MARGINS}
    fragile = [f"seed {s} left out" for s, v in loso.items() if v != chosen]
    fragile += [f"margin ±{100 * m:g}" for m, v in margins.items() if v != chosen]
    t95 = t_difference(c.per_seed, problems=c.problems)
    steps = None
    if c.previous is not None:  # the previous protocol, then one change at a time
        steps = [
            ("the previous protocol", previous_verdict(c.previous, c.expect, size=c.size)),
            (f"the {METHOD} interval", previous_verdict(t95, c.expect, size=c.size)),
            (f"the equivalence tie rule (±{100 * MARGIN:g})", verdict(t95, c.expect, size=c.size)),
            ("Holm's correction", chosen),
        ]
    return {
        "claim": c.claim,
        "finding": c.finding,
        "arm": c.arm,
        "reference": c.reference,
        "role": c.role,
        "best": c.best,
        "expect": c.expect + (f" by {100 * c.size:g} points" if c.size is not None else ""),
        "verdict": chosen,
        "difference": asdict(diff),
        "p_adjusted": p_adjusted,
        "gain": c.gain,
        "reference_gain": c.reference_gain,
        "cost": c.cost,
        "regime": c.regime,
        "task": c.task,
        "fragile": fragile,
        "loso": loso,
        "margins": margins,
        "unadjusted": verdict(t95, c.expect, size=c.size),
        "steps": steps,
    }


def judge(rows: list[Comparison]) -> list[dict[str, Any]]:
    """Every row's verdict, in the order given, each claim's rows one family under Holm."""
    out: list[dict[str, Any] | None] = [None] * len(rows)
    for claim in dict.fromkeys(c.claim for c in rows):
        family = [i for i, c in enumerate(rows) if c.claim == claim]
        p = [t_difference(rows[i].per_seed).p for i in family]
        adjusted, levels = holm(p, alpha=1 - LEVEL)
        for i, q, level in zip(family, adjusted, levels, strict=True):
            out[i] = _judge_one(rows[i], level, q)
    return [r for r in out if r is not None]


@dataclass(frozen=True)
class FamilyChange:
    """What some rows change in their claim's Holm family: the claims, the family's size with them,
    and each other row whose verdict differs without them, as ``(row, verdict without them)``."""

    claims: list[str]
    size: int
    others: int
    changed: list[tuple[dict[str, Any], str]]

    def text(self) -> str:
        """The reading's words for it: the rows that change and their verdicts, or that none does."""
        if not self.claims:
            return "no verdict rows of its own yet"
        named, others, size = " and ".join(self.claims), _rows(self.others), _rows(self.size)
        if not self.changed:
            return f"no verdict of {named}'s other {others} changes with them in its Holm family ({size})"
        items = "; ".join(f"{r['finding']} {_vs(r)} is {r['verdict']} (without them {was})" for r, was in self.changed)
        verb = "changes" if len(self.changed) == 1 else "change"
        return f"with them in {named}'s Holm family ({size}), {len(self.changed)} of its other {others} {verb} " + (
            f"verdict: {items}"
        )


def family_changes(
    rows: list[Comparison], judged: list[dict[str, Any]], finding: str, arms: Collection[str] | None = None
) -> FamilyChange:
    """What ``finding``'s rows (those whose arm is among ``arms``, if given) change in the rest of
    their claim's Holm family: each other row of the claim whose verdict (``judged``: every row's,
    in the order of ``rows``) differs when those rows are left out of the family."""
    new = {i for i, c in enumerate(rows) if c.finding == finding and (arms is None or c.arm in arms)}
    claims = list(dict.fromkeys(rows[i].claim for i in sorted(new)))
    family = [i for i, c in enumerate(rows) if c.claim in claims]
    kept = [i for i in family if i not in new]
    without = judge([rows[i] for i in kept])
    changed = [
        (judged[i], b["verdict"]) for i, b in zip(kept, without, strict=True) if judged[i]["verdict"] != b["verdict"]
    ]
    return FamilyChange(claims, len(family), len(kept), changed)


def _rows(n: int) -> str:
    return f"{n} row{'' if n == 1 else 's'}"


def _pts(x: float) -> str:
    return f"{100 * x:+.1f}"


def level_text(level: float) -> str:
    """An interval's level as a percentage with the digits that tell it from 100%: 95.0%, 99.78%."""
    return f"{100 * level:.{max(1, -int(np.floor(np.log10(1 - level))) - 1)}f}%"


def _vs(r: dict[str, Any]) -> str:
    return f"{r['arm']} vs {r['reference']}" + (f" ({SEQUENCE})" if r.get("best") else "")


def cost_cells(cost: dict[str, Any]) -> list[str]:
    """A row's cost cells: each of :data:`COSTS` as a ratio ("1.23x"), then the PRM's labelling and
    training, arm / reference ("178 s / –"); "not recorded" where there is nothing to show."""
    cells = [NOT_RECORDED if cost.get(k) is None else f"{cost[k]:.2f}x" for k, _ in COSTS]
    prm = cost.get("prm_s") or [None, None]
    s = lambda x: "–" if x is None else f"{x:,.0f} s"  # noqa: E731
    return [*cells, NOT_RECORDED if prm == [None, None] else f"{s(prm[0])} / {s(prm[1])}"]


def verdicts_markdown(rows: list[dict[str, Any]], waiting: list[str]) -> str:
    """FINDINGS.md's opening table of every verdict row, then the claims not measured yet (``waiting``)."""
    costs = " | ".join(f"{title}, arm / reference" for _, title in COSTS)
    lines = [
        "| claim | arm vs reference | predicted | verdict | difference, Holm-adjusted interval | method | "
        f"Holm-adjusted p | detectable | gain over the start, arm / reference | {costs} "
        "| PRM labelling + training (wall), arm / reference | regime | task |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        d = r["difference"]
        cost = " | ".join(cost_cells(r["cost"]))
        mark = ", fragile" if r["fragile"] else ""
        method = f"{d['method']}, {d['seeds']} seeds, {level_text(d['level'])}"
        lines.append(
            f"| [{r['claim']}](#{r['finding'].lower()}) | {_vs(r)} | {r['expect']} | **{r['verdict']}**{mark} "
            f"| {_pts(d['mean'])} points [{_pts(d['lo'])}, {_pts(d['hi'])}] | {method} | {r['p_adjusted']:.3f} "
            f"| {100 * d['mde']:.1f} points | {_pts(r['gain'])} / {_pts(r['reference_gain'])} points | {cost} "
            f"| {r['regime']} | {r['task']} |"
        )
    tail = f"Not measured yet: {'; '.join(waiting)}.\n" if waiting else ""
    return ("\n".join(lines) + "\n\n" if rows else "No verdict yet.\n\n") + tail


def _loso_text(r: dict[str, Any]) -> str:
    if not r["loso"]:
        return "n/a (two seeds)"
    changed = {}
    for s, v in r["loso"].items():
        if v != r["verdict"]:
            changed.setdefault(v, []).append(str(s))
    if not changed:
        return "unchanged"
    return "; ".join(f"{v} without seed {', '.join(s)}" for v, s in changed.items())


def _same(v: str, chosen: str) -> str:
    return "unchanged" if v == chosen else v


def sensitivity_markdown(rows: list[dict[str, Any]]) -> str:
    """One table per claim: each row's verdict under the module docstring's variations."""
    out = []
    for claim in dict.fromkeys(r["claim"] for r in rows):
        family = [r for r in rows if r["claim"] == claim]
        lines = [
            f"**{claim}** ({len(family)} rows, one Holm family):\n",
            "| setting | arm vs reference | verdict | one seed left out | margin ±1 | margin ±3 "
            "| unadjusted 95% t | previous protocol |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for r in family:
            v = r["verdict"]
            previous = "– (new row)" if r["steps"] is None else _same(r["steps"][0][1], v)
            lines.append(
                f"| {r['finding']} | {_vs(r)} | {v} | {_loso_text(r)} | {_same(r['margins'][0.01], v)} "
                f"| {_same(r['margins'][0.03], v)} | {_same(r['unadjusted'], v)} | {previous} |"
            )
        out.append("\n".join(lines) + "\n")
    return "\n".join(out)


def changes_markdown(rows: list[dict[str, Any]]) -> str:
    """Which verdicts differ from the previous protocol's, and which of its changes (the interval,
    the tie rule, Holm), applied one at a time, changed each."""
    old = [r for r in rows if r["steps"] is not None]
    changed = [r for r in old if r["steps"][0][1] != r["verdict"]]
    against_best = sum(r["role"] == SEQUENCE for r in rows)
    unpredicted = len(rows) - len(old) - against_best
    head = (
        f"{len(changed)} of the {len(old)} verdicts the previous protocol gave changed; {against_best} rows are new "
        f"against a setting's {SEQUENCE} arm"
        + (f" and {unpredicted} against a stated baseline where the claim predicts nothing" if unpredicted else "")
        + "."
    )
    if not changed:
        return head + "\n"
    lines = [
        head + " Each change applied alone, in order, and the verdict after it:\n",
        "| setting | arm vs reference | previous | now | what changed it |",
        "|---|---|---|---|---|",
    ]
    for r in changed:
        why = [f"{name} ({v})" for (name, v), (_, before) in zip(r["steps"][1:], r["steps"]) if v != before]
        lines.append(f"| {r['finding']} | {_vs(r)} | {r['steps'][0][1]} | {r['verdict']} | {'; '.join(why)} |")
    return "\n".join(lines) + "\n"
