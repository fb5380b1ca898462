"""The verdict rows: which comparisons a claim setting makes, Holm over a claim's rows, fragility,
the list of changed verdicts, and the published intervals against the seed-level t recomputed
from the committed summaries."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from creditrl.experiments.claim_verdicts import (
    BASELINE,
    COSTS,
    NAMED,
    SEQUENCE,
    Comparison,
    changes_markdown,
    comparisons,
    family_changes,
    judge,
    sensitivity_markdown,
    verdicts_markdown,
)
from creditrl.experiments.compare_report import cost_rows
from creditrl.experiments.summaries import history
from creditrl.experiments.verdicts import holm, t_difference
from creditrl.train.metrics import pack_outcomes

ROOT = Path(__file__).resolve().parents[2]


def _runs(rates: list[float], start: float = 0.3, problems: int = 400) -> list[list[dict]]:
    """One run per seed whose last evaluation gets the first ``rate * problems`` problems right."""
    runs = []
    for rate in rates:
        right = int(round(rate * problems))
        last = [i < right for i in range(problems)]
        first = [i < int(start * problems) for i in range(problems)]
        runs.append(
            [
                {"eval/accuracy": start, "eval/correct": pack_outcomes(first), "time/total_s": 0.0},
                {"eval/accuracy": right / problems, "eval/correct": pack_outcomes(last), "time/total_s": 10.0},
            ]
        )
    return runs


FINDING = {
    "id": "C1-x",
    "claim_id": "C1",
    "regime": "about 500 tokens",
    "task": "chains",
    "sequence_level": "grpo",
    "expect": {"grpo": ("same", None), "token": ("better", None), "step": ("better", 0.05)},
}
RESULTS = {
    "gae": _runs([0.30, 0.31, 0.29]),
    "grpo": _runs([0.40, 0.42, 0.41]),
    "token": _runs([0.43, 0.44, 0.42]),
    "step": _runs([0.39, 0.45, 0.41]),
}


def test_each_arm_is_compared_with_the_baseline_and_the_best_sequence_level_arm() -> None:
    rows = comparisons(FINDING, RESULTS, "gae", [0, 1, 2])
    assert [(r.arm, r.reference, r.role) for r in rows] == [
        ("grpo", "gae", BASELINE),
        ("token", "gae", BASELINE),
        ("step", "gae", BASELINE),
        ("token", "grpo", SEQUENCE),
        ("step", "grpo", SEQUENCE),
    ]
    token = rows[3]
    assert token.per_seed == pytest.approx([0.03, 0.02, 0.01]) and token.expect == "better"
    assert rows[4].size == 0.05  # the arm's own prediction, claimed size included
    assert token.gain == pytest.approx(np.mean([0.43, 0.44, 0.42]) - 0.3)
    assert token.reference_gain == pytest.approx(np.mean([0.40, 0.42, 0.41]) - 0.3)
    assert rows[0].previous is not None and token.previous is None  # the previous protocol had no such row
    other = comparisons({**FINDING, "sequence_expect": ("any", None)}, RESULTS, "gae", [0, 1, 2])
    assert [r.expect for r in other if r.role == SEQUENCE] == ["any", "any"]
    alone = comparisons({**FINDING, "sequence_level": "gae"}, RESULTS, "gae", [0, 1, 2])
    assert [(r.role, r.best) for r in alone] == [(BASELINE, True)] * 3  # the baseline is the best sequence-level arm
    assert [r.best for r in rows] == [False, False, False, True, True]


def test_each_row_pairs_the_seeds_its_two_arms_share_while_seeds_are_running() -> None:
    """Arms with different seeds so far (the reference on 5, one arm on 4, one on 3, one sharing
    one seed with another): each row pairs seed s with seed s over the seeds both arms ran, its gains
    are over those seeds, and a pair sharing under two seeds gets no row."""
    results = {
        "gae": _runs([0.30, 0.31, 0.29, 0.35, 0.33]),
        "grpo": _runs([0.40, 0.42, 0.41, 0.45]),
        "token": [RESULTS["token"][i] for i in (1, 2)] + _runs([0.50]),  # seeds 1, 2, 4 in that order
        "step": _runs([0.39, 0.45]),  # seeds 3, 4: one shared with token, two with gae
    }
    seeds = {"gae": [0, 1, 2, 3, 4], "grpo": [0, 1, 2, 3], "token": [1, 2, 4], "step": [3, 4]}
    rows = comparisons(FINDING, results, "gae", seeds)
    pairs = {(r.arm, r.reference): r for r in rows}
    assert list(pairs) == [("grpo", "gae"), ("token", "gae"), ("step", "gae"), ("token", "grpo")]  # step, grpo: 1 seed
    assert pairs["grpo", "gae"].seeds == [0, 1, 2, 3]
    assert pairs["grpo", "gae"].per_seed == pytest.approx([0.10, 0.11, 0.12, 0.10])
    assert pairs["token", "gae"].seeds == [1, 2, 4]
    assert pairs["token", "gae"].per_seed == pytest.approx([0.44 - 0.31, 0.42 - 0.29, 0.50 - 0.33])
    assert pairs["token", "gae"].reference_gain == pytest.approx(np.mean([0.31, 0.29, 0.33]) - 0.3)
    assert pairs["token", "grpo"].seeds == [1, 2] and pairs["step", "gae"].seeds == [3, 4]
    assert pairs["step", "gae"].per_seed == pytest.approx([0.39 - 0.35, 0.45 - 0.33])
    same = comparisons(FINDING, RESULTS, "gae", dict.fromkeys(RESULTS, [0, 1, 2]))
    listed = comparisons(FINDING, RESULTS, "gae", [0, 1, 2])
    assert [r.per_seed.tolist() for r in same] == [r.per_seed.tolist() for r in listed]


def test_a_findings_also_rows_compare_the_pairs_it_names_in_the_claims_holm_family(tmp_path: Path) -> None:
    """``also``: each named pair is one more row, with its own expectation, after the baseline and
    best-sequence-level rows (a pair that is already one of those is not repeated), judged in the
    claim's one Holm family; a malformed entry is one line naming the file and the key."""
    from creditrl.config import ConfigError
    from creditrl.experiments.finding_files import load_finding

    also = [
        {"arm": "token", "against": "step", "expect": ("better", None)},
        {"arm": "token", "against": "grpo", "expect": ("no better", None)},  # already a best-sequence-level row
    ]
    rows = comparisons({**FINDING, "also": also}, RESULTS, "gae", [0, 1, 2])
    assert [(r.arm, r.reference, r.role) for r in rows][5:] == [("token", "step", NAMED)]
    assert rows[5].per_seed == pytest.approx([0.04, -0.01, 0.01]) and rows[5].expect == "better"
    judged = judge(rows)
    _, levels = holm([t_difference(r.per_seed).p for r in rows], alpha=0.05)  # one family: all six rows
    assert [r["difference"]["level"] for r in judged] == pytest.approx(list(levels))
    text = "id: C1-x\nclaim_id: C1\ntitle: t\ngrid: g.yaml\nquestion: q\nreading: r\n"
    (tmp_path / "f.yaml").write_text(text + "also: [{arm: a, against: b, expect: better by 3}]\n")
    assert load_finding(tmp_path / "f.yaml")["also"] == [{"arm": "a", "against": "b", "expect": ("better", 0.03)}]
    (tmp_path / "f.yaml").write_text(text + "also: [{arm: a, against: a, expect: better}]\n")
    with pytest.raises(ConfigError, match=r"f.yaml: key 'also' must be a list of \{arm, against, expect\}"):
        load_finding(tmp_path / "f.yaml")


def _row(claim: str, per_seed: list[float], expect: str = "better", size: float | None = None) -> Comparison:
    return Comparison(
        claim=claim,
        finding=f"{claim}-x",
        arm="a",
        reference="b",
        role=BASELINE,
        expect=expect,
        size=size,
        per_seed=np.array(per_seed),
        seeds=list(range(len(per_seed))),
        problems=1024,
        gain=0.05,
        reference_gain=0.01,
        cost={"generated_tokens": 1.0, "trained_positions": None, "cpu_s": None, "prm_s": [None, None]},
    )


def _summary(
    rate: float, tokens: int, cost: dict | None = None, prm_s: float | None = None, prm: tuple | None = None
) -> dict:
    """A hand-made run summary: a start and a last evaluation over 400 problems, ``tokens``
    generated, ``cost`` as a summary records it (None: one summarised before the cost record);
    ``prm``: its PRM's labelling tokens, training positions and (a third item) CPU seconds, as the
    start row records them."""
    start, last = _runs([rate])[0]
    start = {**start, "iteration": 0, "tokens/total": 0, **({} if prm_s is None else {"time/prm_s": prm_s})}
    if prm is not None:
        start |= {"prm/generated_tokens": prm[0], "prm/trained_positions": prm[1]}
        start |= {"prm/cpu_s": prm[2]} if len(prm) > 2 else {}
    last = {**last, "iteration": 2, "tokens/total": tokens}
    summary = {"version": 1, "iter_s": [[1, 5.0], [2, 5.0]], "evals": [start, last]}
    return summary if cost is None else {**summary, "cost": cost}


def _cost_cells(arm: dict[str, list[dict]], reference: dict[str, list[dict]]) -> list[str]:
    """The verdict table's cost cells of the row ``token`` vs ``gae``, each arm's summaries given."""
    found = {**arm, **reference}
    results = {a: [history(s) for s in runs] for a, runs in found.items()}
    spent = {a: [s.get("cost", {}) for s in runs] for a, runs in found.items()}
    finding = {"id": "C1-x", "claim_id": "C1", "expect": {"token": ("better", None)}}
    rows = judge(comparisons(finding, results, "gae", [0, 1, 2], cost_rows(results, spent)))
    cells = [c.strip() for c in verdicts_markdown(rows, []).splitlines()[2].split("|")]
    first = 10  # the blank before the first bar, then nine columns up to the gain over the start
    return cells[first : first + len(COSTS) + 1]


def test_the_verdict_tables_costs_are_ratios_of_what_the_summaries_record() -> None:
    recorded = lambda t, p, c: {"generated_tokens": t, "trained_positions": p, "cpu_s": c}  # noqa: E731
    # a PRM's labelling (300 tokens), training (1,000 positions) and both's 15 CPU seconds are charged to
    # each run that reads it
    token = {"token": [_summary(0.4, 1200, recorded(1200, 6000, 30.0), 178.4, (300, 1000, 15.0)) for _ in range(3)]}
    gae = {"gae": [_summary(0.3, 1000, recorded(1000, 2000, 20.0)) for _ in range(3)]}
    assert _cost_cells(token, gae) == ["1.50x", "3.50x", "2.25x", "178 s / –"]
    unrecorded = {"token": [_summary(0.4, 1200, recorded(1200, 6000, 30.0), prm_s=178.4) for _ in range(3)]}
    assert _cost_cells(unrecorded, gae) == ["not recorded", "not recorded", "not recorded", "178 s / –"]
    # a PRM recorded before its CPU seconds were: its builder's CPU may hold it, no reader's does
    no_cpu = {"token": [_summary(0.4, 1200, recorded(1200, 6000, 30.0), 178.4, (300, 1000)) for _ in range(3)]}
    assert _cost_cells(no_cpu, gae) == ["1.50x", "3.50x", "not recorded", "178 s / –"]
    old = {"gae": [_summary(0.3, 1000) for _ in range(3)]}  # summarised before the cost record: tokens only
    assert _cost_cells(token, old) == ["1.50x", "not recorded", "not recorded", "178 s / –"]
    one = {"gae": [_summary(0.3, 1000, recorded(1000, 2000, 20.0)) for _ in range(2)] + [_summary(0.3, 1000)]}
    assert _cost_cells(token, one)[1:3] == ["not recorded", "not recorded"]  # every run must record it
    plain = {"token": [_summary(0.4, 1500) for _ in range(3)]}
    assert _cost_cells(plain, old) == ["1.50x", "not recorded", "not recorded", "not recorded"]


def test_a_claims_rows_are_one_holm_family_and_claims_are_apart() -> None:
    c1 = [_row("C1", [0.05, 0.06, 0.04, 0.05, 0.07]), _row("C1", [0.01, -0.01, 0.03, 0.0, 0.02])]
    c2 = [_row("C2", [0.01, -0.01, 0.03, 0.0, 0.02])]
    judged = judge([*c1, *c2])
    p = [t_difference(r.per_seed).p for r in c1]
    adjusted, levels = holm(p)
    assert [r["p_adjusted"] for r in judged[:2]] == pytest.approx(adjusted)
    assert [r["difference"]["level"] for r in judged[:2]] == pytest.approx(levels)
    assert judged[2]["difference"]["level"] == 0.95  # alone in its family: not adjusted
    assert judged[1]["difference"]["level"] == 0.95 < judged[0]["difference"]["level"] == 1 - 0.05 / 2
    for r, c in zip(judged, [*c1, *c2], strict=True):  # never narrower than the unadjusted t
        ci = stats.ttest_1samp(c.per_seed, 0.0).confidence_interval(0.95)
        assert r["difference"]["lo"] <= ci.low + 1e-12 and r["difference"]["hi"] >= ci.high - 1e-12


def test_a_findings_rows_say_which_verdicts_of_the_claims_other_settings_they_change() -> None:
    """``family_changes``: a row significant at 95% alone (p between 0.025 and 0.05) is supported
    while it is its claim's only row and inconclusive once another setting's weaker row joins the
    Holm family (then it is tested at 97.5%); the joining finding names that change."""
    z = np.array([-2.0, -1.0, 0.0, 1.0, 2.0]) / np.std([-2, -1, 0, 1, 2], ddof=1)
    earlier = _row("C1", list(0.03 + z * 0.03 * np.sqrt(5) / 3.0))  # t = 3 on 4 degrees of freedom
    assert 0.025 < t_difference(earlier.per_seed).p < 0.05
    earlier = dataclasses.replace(earlier, finding="C1-long", arm="token", reference="sequence + GAE")
    joining = dataclasses.replace(_row("C1", [0.01, -0.01, 0.03, 0.0, 0.02]), finding="C1-sparse")
    other = dataclasses.replace(_row("C2", [0.05, 0.06, 0.04, 0.05, 0.07]), finding="C2-long")
    assert judge([earlier])[0]["verdict"] == "supported"
    rows = [earlier, joining, other]
    judged = judge(rows)
    assert judged[0]["verdict"] == "inconclusive"
    change = family_changes(rows, judged, "C1-sparse")
    assert (change.claims, change.size, change.others) == (["C1"], 2, 1)
    assert [(r["finding"], r["arm"], r["verdict"], was) for r, was in change.changed] == [
        ("C1-long", "token", "inconclusive", "supported")
    ]
    change = family_changes(rows, judged, "C2-long")  # alone in its claim: nothing to change
    assert (change.claims, change.size, change.others, change.changed) == (["C2"], 1, 0, [])
    stronger = dataclasses.replace(joining, per_seed=np.array([0.05, 0.06, 0.04, 0.05, 0.07]))
    rows = [earlier, stronger]  # a smaller p joins: the earlier row keeps the 95% level and its verdict
    change = family_changes(rows, judge(rows), "C1-sparse")
    assert (change.size, change.others, change.changed) == (2, 1, [])
    assert family_changes(rows, judge(rows), "C3-arith").claims == []  # no rows of its own
    # one arm's rows: a new arm beside a finding's earlier ones
    rows = [earlier, dataclasses.replace(joining, finding="C1-long", arm="step")]
    change = family_changes(rows, judge(rows), "C1-long", ["step"])
    assert [(r["arm"], r["verdict"], was) for r, was in change.changed] == [("token", "inconclusive", "supported")]
    assert family_changes(rows, judge(rows), "C1-long", ["segment"]).claims == []


def test_a_verdict_that_one_seed_or_another_margin_flips_is_fragile() -> None:
    one_seed = judge([_row("C5", [0.02, 0.021, 0.019, 0.02, -0.03])])[0]  # seed 4 alone went the other way
    assert one_seed["verdict"] == "inconclusive" and one_seed["fragile"] == ["seed 4 left out"]
    assert one_seed["loso"] == {**dict.fromkeys(range(4), "inconclusive"), 4: "supported"}
    tie = judge([_row("C1", [0.012, 0.014, 0.013, 0.015, 0.011], expect="same")])[0]  # a real 1.3-point difference
    assert tie["verdict"] == "supported" and tie["margins"] == {0.01: "contradicted", 0.03: "supported"}
    assert tie["fragile"] == ["margin ±1"]
    steady = judge([_row("C2", [-0.25, -0.26, -0.25, -0.24, -0.25], expect="better", size=0.15)])[0]
    assert steady["verdict"] == "contradicted" and steady["fragile"] == []
    two = judge([_row("C3", [0.05, 0.06])])[0]
    assert two["loso"] == {}  # one seed left has no spread
    table = verdicts_markdown([one_seed, tie, steady], [])
    assert table.count(", fragile |") == 2 and "| **contradicted** |" in table
    assert "| seed-level paired t, 5 seeds, 95.0% |" in table
    assert "| C5-x | a vs b | inconclusive | supported without seed 4 | unchanged |" in sensitivity_markdown([one_seed])


def test_the_changes_are_computed_step_by_step() -> None:
    from creditrl.experiments.verdicts import Difference

    tie = _row("C1", [0.012, 0.014, 0.013, 0.015, 0.011], expect="same")
    tie.previous = Difference(0.013, 0.01, 0.016, 0.001, 0.003, 5, 1024)  # excluded 0: contradicted then
    wide = _row("C1", [0.05, 0.01, 0.09], expect="better")
    wide.previous = Difference(0.05, 0.02, 0.08, 0.015, 0.04, 3, 1024)
    new = _row("C1", [0.05, 0.06, 0.04])
    new.role, new.previous = SEQUENCE, None
    judged = judge([tie, wide, new])
    assert [r["verdict"] for r in judged] == ["supported", "inconclusive", "supported"]
    text = changes_markdown(judged)
    assert text.startswith("2 of the 2 verdicts the previous protocol gave changed; 1 rows are new against a setting's")
    assert "| contradicted | supported | the equivalence tie rule (±2) (supported) |" in text
    assert "| supported | inconclusive | the seed-level paired t interval (inconclusive) |" in text


def _published_rows() -> list[tuple[str, str, str, float, float, float, int]]:
    """FINDINGS.md's verdict rows: finding, arm, reference, the difference and interval in points, and seeds."""
    text = (ROOT / "FINDINGS.md").read_text()
    pattern = re.compile(
        r"^\| \[C\d\]\(#([a-z0-9-]+)\) \| (.+?) vs (.+?)(?: \(best sequence-level\))? \| [^|]+ \| [^|]+ "
        r"\| ([-+][\d.]+) points \[([-+][\d.]+), ([-+][\d.]+)\] \| seed-level paired t, (\d+) seeds,",
        re.M,
    )
    return [(f, a, r, float(m), float(lo), float(hi), int(n)) for f, a, r, m, lo, hi, n in pattern.findall(text)]


def test_no_published_interval_is_narrower_than_the_seed_level_t_of_its_comparison() -> None:
    """Recomputed from the committed summaries with scipy's paired t: every verdict row of
    FINDINGS.md holds the 95% seed-level t-interval of its comparison (to the printed digit)."""
    from creditrl.experiments.finding_files import load_finding
    from creditrl.experiments.grid import load_grid
    from creditrl.experiments.plan import summary_files
    from creditrl.experiments.summaries import history, read_summary
    from creditrl.experiments.verdicts import outcome_matrix

    grids = {}
    for f in sorted((ROOT / "findings").glob("*.yaml")):
        finding = load_finding(f)
        if "grid" in finding:
            grids[finding["id"].lower()] = load_grid(ROOT / finding["grid"])
    rows = _published_rows()
    assert len(rows) >= 60 and {r[0] for r in rows} >= {"c1-short", "c1-mid", "c1-long", "c1-longest", "c1-paths"}
    for finding, arm, ref, mean, lo, hi, seeds in rows:
        grid = dataclasses.replace(grids[finding], seeds=grids[finding].seeds[:seeds])  # a growing grid: its first
        where = ROOT / "findings" / "runs" / grid.name
        arms = {a: grid.arms[a] for a in (arm, ref)}
        files = summary_files(dataclasses.replace(grid, arms=arms), where)
        n = len(grid.seeds)
        x, y = (outcome_matrix([history(read_summary(p)) for p in files[i * n : (i + 1) * n]]) for i in (0, 1))
        ci = stats.ttest_rel(x.mean(axis=1), y.mean(axis=1)).confidence_interval(0.95)
        assert mean == pytest.approx(100 * (x.mean() - y.mean()), abs=0.051), (finding, arm, ref)
        assert lo <= 100 * ci.low + 0.051 and hi >= 100 * ci.high - 0.051, (finding, arm, ref, lo, hi, ci)
