"""The numbers benchmarks/ray_overhead.py and benchmarks/compare_jobs.py print and keep (their runs train for
minutes, so the tests give them made-up timings)."""

from __future__ import annotations

import argparse
import importlib

import pytest


def test_ray_overhead_summary_is_each_setup_against_in_process_with_two_threads(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "2")  # the script sets it only where unset: keep this process's
    ray_overhead = importlib.import_module("ray_overhead")

    def rows(iters, sync=0.0, reward=0.5):
        return [
            {"time/iter_s": s, "time/rollout_s": s / 2, "time/value_s": s / 4, "time/update_s": s / 4,
             "time/sync_s": sync, "tokens/total": 100 * i, "reward/mean": reward}
            for i, s in enumerate(iters)
        ]  # fmt: skip

    results = {
        ray_overhead.BASE: (rows([1.0, 2.0, 3.0]), 0.5),
        "in-process, 1 thread": (rows([2.0, 3.0, 4.0]), 0.5),
        ray_overhead.RAY: (rows([1.0, 4.0, 5.0], sync=0.002), 3.0),
    }
    out = ray_overhead.summary(results)
    assert out[ray_overhead.BASE]["ratio"] == 1.0 and out["in-process, 1 thread"]["ratio"] == 1.5
    ray = out[ray_overhead.RAY]
    assert ray["ratio"] == 2.0 and ray["iter_s"] == {"min": 1.0, "median": 4.0, "max": 5.0, "n": 3}
    assert ray["stage_median_s"] == {"rollout": 2.0, "value": 1.0, "update": 1.0} and ray["setup_s"] == 3.0
    assert ray["broadcast_median_ms"] == pytest.approx(2.0) and ray["same_as_in_process"]
    results[ray_overhead.RAY] = (rows([1.0, 4.0, 5.0], sync=0.002, reward=0.25), 3.0)
    assert not ray_overhead.summary(results)[ray_overhead.RAY]["same_as_in_process"]


def test_compare_jobs_summary_is_the_throughput_ratio():
    compare_jobs = importlib.import_module("compare_jobs")
    args = argparse.Namespace(arms=2, seeds=3, samples=1024, jobs=2)
    out = compare_jobs.summary({1: 90.0, 2: 60.0}, args, threads=2)
    assert out == {
        "runs": 6,
        "samples": 1024,
        "jobs": 2,
        "threads": 2,
        "threads_per_job": 1,
        "one_at_a_time_s": 90.0,
        "jobs_at_a_time_s": 60.0,
        "ratio": 1.5,
    }
    assert (
        compare_jobs.summary({1: 90.0, 4: 30.0}, argparse.Namespace(**{**vars(args), "jobs": 4}), 2)["threads_per_job"]
        == 1
    )  # never fewer than one thread
