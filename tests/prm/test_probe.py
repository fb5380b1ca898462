"""The shortcut probe on hand-made records whose answers are known."""

import random

import numpy as np
import pytest

from creditrl.policy.tokenizer import build_char_tokenizer
from creditrl.prm.probe import SURFACE_CHARS, StepRecord, shortcut_probe, surface_features


def random_step(rng: random.Random) -> str:
    a, b = rng.randint(0, 999), rng.randint(0, 99)
    op = rng.choice("+-*")
    return f"{a}{op}{b}={a + b if op == '+' else a - b if op == '-' else a * b};"


def test_surface_features_count_the_step_alphabet():
    f = surface_features("12-30=-18;")
    assert f.shape == (16,) and len(SURFACE_CHARS) == 16
    assert dict(zip(SURFACE_CHARS, f.tolist())) == {
        **{c: 0.0 for c in SURFACE_CHARS},
        "1": 2.0,
        "2": 1.0,
        "3": 1.0,
        "0": 1.0,
        "8": 1.0,
        "-": 2.0,
        "=": 1.0,
        ";": 1.0,
    }


def test_a_score_that_is_a_linear_function_of_length_is_fully_explained():
    rng = random.Random(0)
    texts = [random_step(rng) for _ in range(200)]
    records = [StepRecord(t, 0.01 * len(t) + 0.2, float(i % 2)) for i, t in enumerate(texts)]
    report = shortcut_probe(records)
    assert report.r2_length == pytest.approx(1.0, abs=1e-9)
    assert report.r2_surface == pytest.approx(1.0, abs=1e-9)  # length is the sum of the counts
    assert report.n == 200


def test_length_auroc_reports_the_better_direction():
    rng = random.Random(1)
    texts = [random_step(rng) for _ in range(300)]
    cut = sorted(len(t) for t in texts)[150]
    records = [(t, rng.random(), float(len(t) < cut)) for t in texts]  # short = correct
    report = shortcut_probe(records)
    assert report.auroc_length < 0.05
    assert report.auroc_length_best == pytest.approx(1.0 - report.auroc_length)
    assert report.length_direction == "shorter is correct"
    assert 0.35 < report.auroc_prm < 0.65  # a random score
    assert report.r2_length < 0.05 and report.r2_surface < 0.15  # ... is not explained by the surface
    flipped = shortcut_probe([(t, s, 1.0 - y) for t, s, y in records])
    assert flipped.length_direction == "longer is correct"
    assert flipped.auroc_length == pytest.approx(report.auroc_length_best)


def test_auroc_prm_and_a_keyword_label_found_by_the_surface_regression():
    rng = random.Random(2)
    texts = [random_step(rng) for _ in range(400)]
    labels = [float("7" not in t) for t in texts]  # a keyword rule
    records = [(t, 0.9 * y + 0.05 * rng.random(), y) for t, y in zip(texts, labels)]
    report = shortcut_probe(records, seed=3)
    assert report.auroc_prm == 1.0
    assert report.auroc_surface > 0.9  # the count of '7' alone predicts the label
    noise = shortcut_probe([(t, s, float(rng.random() < 0.5)) for t, s, _ in records], seed=3)
    assert 0.35 < noise.auroc_surface < 0.65


def test_token_lengths_with_the_char_tokenizer_equal_character_lengths():
    rng = random.Random(4)
    records = [(random_step(rng), rng.random(), float(i % 3 == 0)) for i in range(60)]
    assert shortcut_probe(records, tokenizer=build_char_tokenizer()) == shortcut_probe(records)


def test_markdown_lists_every_number():
    rng = random.Random(5)
    records = [(random_step(rng), rng.random(), float(i % 2)) for i in range(40)]
    report = shortcut_probe(records)
    table = report.markdown()
    lines = table.splitlines()
    assert lines[0].startswith("| metric (n = 40)") and len(lines) == 2 + 6
    for name in ("auroc_prm", "auroc_length", "auroc_length_best", "r2_length", "r2_surface", "auroc_surface"):
        value = getattr(report, name)
        assert f"| {name} | {value:.3f} |" in table
    assert report.length_direction in table


def test_bad_records_are_rejected():
    ok = [("1+1=2;", 0.5, 1.0), ("1+2=3;", 0.4, 1.0), ("1+1=3;", 0.3, 0.0), ("2+2=5;", 0.1, 0.0)]
    shortcut_probe(ok)
    with pytest.raises(ValueError, match="hard"):
        shortcut_probe(ok[:3] + [("2+2=5;", 0.1, 0.5)])
    with pytest.raises(ValueError, match="2 records of each label"):
        shortcut_probe(ok[:3] + [("2+2=4;", 0.1, 1.0)])
    with pytest.raises(ValueError, match="finite"):
        shortcut_probe(ok[:3] + [("2+2=5;", float("nan"), 0.0)])
    assert np.isfinite(shortcut_probe(ok).auroc_surface)
