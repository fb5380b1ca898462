"""benchmarks/credit_speed.py at a tiny size: every estimator, normaliser and step-resolution path is timed,
and with --results its numbers go to the JSON beside the page."""

from __future__ import annotations

import json

import torch

import credit_speed
from creditrl.credit import ESTIMATORS, NORMALISERS


def test_every_estimator_and_normaliser_is_timed_and_kept_beside_the_page(tmp_path):
    threads = torch.get_num_threads()
    page = tmp_path / "credit_speed.md"
    try:
        credit_speed.main(["--batch", "16", "--length", "32", "--threads", "1", "--runs", "3", "--warmup", "0",
                           "--results", str(page)])  # fmt: skip
    finally:
        torch.set_num_threads(threads)
    result = json.loads(page.with_suffix(".json").read_text())
    assert (result["batch"], result["length"], result["threads"], result["runs"]) == (16, 32, 1, 3)
    timed = {t["what"]: t for t in result["timings"]}
    expected = {f"estimator {e}" for e in ESTIMATORS} | {f"normaliser {n}" for n in NORMALISERS}
    assert set(timed) == expected | {"estimate_at(step) grpo", "estimate_at(step) gae"}
    assert all(0 < t["min_ms"] <= t["median_ms"] for t in timed.values())
    text = page.read_text()
    for what, t in timed.items():
        assert f"{what}" in text and f"{t['median_ms']:9.1f}" in text
