"""The verdict statistics: the two-level paired bootstrap against a slow reference, its coverage,
the minimum detectable effect, the verdict rule and the packed per-problem outcomes."""

from __future__ import annotations

import numpy as np
import pytest

from creditrl.experiments.verdicts import Difference, outcome_matrix, paired_difference, still_improving, verdict
from creditrl.train.metrics import pack_outcomes, unpack_outcomes


def test_outcomes_pack_and_unpack_exactly() -> None:
    rng = np.random.default_rng(0)
    for n in (1, 7, 8, 9, 1024, 1029):
        bits = list(rng.random(n) < 0.4)
        packed = pack_outcomes(bits)
        assert packed.startswith(f"{n}:") and len(packed.split(":")[1]) == 2 * ((n + 7) // 8)
        assert unpack_outcomes(packed) == bits
    assert pack_outcomes([True, False, True]) == "3:a0"
    with pytest.raises(ValueError, match="8 bits for 9 problems"):
        unpack_outcomes("9:ff")


def _slow_bootstrap(arm: np.ndarray, ref: np.ndarray, rounds: int, rng: np.random.Generator) -> np.ndarray:
    """The textbook loop: draw seeds, draw problems, average the paired differences."""
    d = arm.astype(float) - ref.astype(float)
    out = []
    for _ in range(rounds):
        seeds = rng.integers(0, d.shape[0], d.shape[0])
        problems = rng.integers(0, d.shape[1], d.shape[1])
        out.append(d[np.ix_(seeds, problems)].mean())
    return np.array(out)


def _outcomes(rng, seeds, problems, base, effect, seed_sd=0.02):
    """Synthetic (seeds, problems) outcomes: problem difficulty shared by both arms, a training
    effect per seed, the arm better by ``effect``."""
    difficulty = rng.normal(0, 1.0, problems)
    ref_p = 1 / (1 + np.exp(-(np.log(base / (1 - base)) + difficulty)))
    ref, arm = [], []
    for _ in range(seeds):
        shift = rng.normal(0, seed_sd)
        ref.append(rng.random(problems) < np.clip(ref_p + shift, 0, 1))
        arm.append(rng.random(problems) < np.clip(ref_p + shift + effect + rng.normal(0, seed_sd), 0, 1))
    return np.array(arm), np.array(ref)


def test_the_fast_bootstrap_matches_the_slow_loop() -> None:
    rng = np.random.default_rng(3)
    arm, ref = _outcomes(rng, 5, 400, 0.3, 0.04)
    fast = paired_difference(arm, ref, rounds=4000, seed=1)
    slow = _slow_bootstrap(arm, ref, 4000, np.random.default_rng(2))
    assert fast.mean == pytest.approx(float((arm.astype(float) - ref).mean()), abs=1e-12)
    assert fast.se == pytest.approx(float(slow.std(ddof=1)), rel=0.06)
    lo, hi = np.percentile(slow, [2.5, 97.5])
    assert fast.lo == pytest.approx(lo, abs=0.006) and fast.hi == pytest.approx(hi, abs=0.006)
    assert fast.mde == pytest.approx(2.8016 * fast.se, rel=1e-3) and (fast.seeds, fast.problems) == (5, 400)
    assert paired_difference(arm, ref, rounds=4000, seed=1) == fast  # seeded: a rebuild gives the same digits


def test_kept_draws_give_the_digits_of_drawing_anew(monkeypatch) -> None:
    """The draws depend only on the shape and the seed, so a report keeps them for its next pairing;
    the kept draws, draws made anew (a shape too large to keep) and the per-round gather of the
    plain formula give the same bootstrap to the bit."""
    from creditrl.experiments import verdicts

    rng = np.random.default_rng(5)
    arm, ref = _outcomes(rng, 3, 300, 0.4, 0.03)
    other_arm, _ = _outcomes(rng, 3, 300, 0.4, 0.0)

    def plain(a: np.ndarray, r: np.ndarray, rounds: int) -> np.ndarray:  # take_along_axis, round by round
        d = a.astype(np.float64) - r.astype(np.float64)
        g = np.random.default_rng(0)
        w = g.multinomial(3, np.full(3, 1 / 3), size=rounds) / 3
        out = [
            np.take_along_axis(w[s : s + 1000] @ d, g.integers(0, 300, size=(min(1000, rounds - s), 300)), axis=1)
            for s in range(0, rounds, 1000)
        ]
        return np.concatenate(out).mean(axis=1)

    verdicts._kept_rounds.cache_clear()
    kept = [paired_difference(arm, ref, rounds=2500), paired_difference(other_arm, ref, rounds=2500)]
    assert verdicts._kept_rounds.cache_info().hits == 1  # the second pairing drew nothing
    monkeypatch.setattr(verdicts, "_KEEP", 0)
    anew = [paired_difference(arm, ref, rounds=2500), paired_difference(other_arm, ref, rounds=2500)]
    assert kept == anew and verdicts._kept_rounds.cache_info().misses == 1
    for diff, a in zip(kept, (arm, other_arm), strict=True):
        boot = plain(a, ref, 2500)
        lo, hi = np.percentile(boot, [2.5, 97.5])
        assert (diff.lo, diff.hi, diff.se) == (float(lo), float(hi), float(boot.std(ddof=1)))


def test_the_interval_covers_the_true_difference() -> None:
    """Over 60 synthetic experiments with a true difference of 3 points, the 95% interval covers it
    at least as often as it should (the two-level bootstrap is conservative), and is never absurdly wide."""
    rng = np.random.default_rng(7)
    covered, widths = 0, []
    for _ in range(60):
        arm, ref = _outcomes(rng, 5, 1024, 0.3, 0.03)
        truth = 0.03  # the expected difference (clipping aside, negligible at p ~ 0.3)
        d = paired_difference(arm, ref, rounds=1000, seed=0)
        covered += d.lo <= truth <= d.hi
        widths.append(d.hi - d.lo)
    assert covered >= 54  # >= 90% of 60
    assert 0.02 < float(np.median(widths)) < 0.12


def test_identical_arms_differ_by_exactly_zero() -> None:
    rng = np.random.default_rng(0)
    ref = rng.random((5, 256)) < 0.5
    d = paired_difference(ref.copy(), ref, rounds=500)
    assert (d.mean, d.lo, d.hi, d.se) == (0.0, 0.0, 0.0, 0.0)
    with pytest.raises(ValueError, match=r"equal shapes, got \(5, 256\) and \(4, 256\)"):
        paired_difference(ref, ref[:4])


def _diff(lo: float, hi: float) -> Difference:
    return Difference((lo + hi) / 2, lo, hi, (hi - lo) / 3.92, 0.7 * (hi - lo), 5, 1024)


@pytest.mark.parametrize(
    ("lo", "hi", "expect", "size", "want"),
    [
        (0.01, 0.05, "better", None, "supported"),
        (-0.01, 0.05, "better", None, "inconclusive"),
        (-0.06, -0.01, "better", None, "contradicted"),
        (0.01, 0.04, "better", 0.10, "contradicted"),  # real, but wholly below the claimed 10 points
        (0.02, 0.12, "better", 0.10, "supported"),
        (-0.05, -0.01, "worse", None, "supported"),
        (0.01, 0.05, "worse", None, "contradicted"),
        (-0.015, 0.018, "same", None, "supported"),
        (-0.03, 0.01, "same", None, "inconclusive"),
        (0.005, 0.03, "same", None, "contradicted"),
        (-0.05, -0.02, "no better", None, "supported"),  # worse: the arm does not beat the reference
        (-0.01, 0.015, "no better", None, "supported"),
        (-0.01, 0.03, "no better", None, "inconclusive"),
        (0.01, 0.05, "no better", None, "contradicted"),
        (0.02, 0.05, "no worse", None, "supported"),
        (-0.05, -0.01, "no worse", None, "contradicted"),
    ],
)
def test_the_verdict_rule(lo, hi, expect, size, want) -> None:
    assert verdict(_diff(lo, hi), expect, size=size) == want


def test_matrices_and_the_late_change_read_the_runs_rows() -> None:
    early, late = [True, False, False, False], [True, True, True, False]
    runs = [
        [
            {"iteration": 0, "eval/accuracy": 0.25, "eval/correct": pack_outcomes(early)},
            {"iteration": 5, "eval/accuracy": 0.25, "eval/correct": pack_outcomes(early)},
            {"iteration": 9},
            {"iteration": 10, "eval/accuracy": 0.75, "eval/correct": pack_outcomes(late)},
        ]
    ] * 2
    assert outcome_matrix(runs).tolist() == [late, late] and outcome_matrix(runs, 0).tolist() == [early, early]
    change = still_improving(runs)
    assert change.mean == pytest.approx(0.5)
    with pytest.raises(ValueError, match="no per-problem outcomes"):
        outcome_matrix([[{"iteration": 0, "eval/accuracy": 0.5}]])
