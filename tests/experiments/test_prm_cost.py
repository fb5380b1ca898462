"""A PRM's CPU seconds are charged to every run that reads it, and to no run twice: the run that built
it in its process leaves the build out of its own ``cost.json``, and the cost table adds the PRM's
recorded ``prm/cpu_s`` to each reader's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from creditrl import usage
from creditrl.config import load_config
from creditrl.experiments import launch
from creditrl.experiments.compare_report import cost_rows
from creditrl.experiments.demo import demo_config_path
from creditrl.prm import cache as prm_cache
from creditrl.train.rl import RLTrainer


@pytest.fixture
def clock(monkeypatch, tmp_path: Path) -> list[float]:
    """A fake CPU clock for the run and the PRM build, and a PRM build that takes 40 CPU seconds."""
    now = [100.0]
    monkeypatch.setattr(usage, "process_cpu_s", lambda: now[0])
    monkeypatch.setattr(prm_cache, "process_cpu_s", lambda: now[0])
    monkeypatch.setenv("CREDITRL_CACHE", str(tmp_path / "cache"))

    def build(cfg, init_path, path: Path, progress) -> None:
        now[0] += 40.0
        path.mkdir(parents=True)
        (path / "prm_info.json").write_text(json.dumps({"prm/cpu_s": 40.0}))

    monkeypatch.setattr(prm_cache, "_train_prm", build)
    return now


def _trainer(now: list[float], seconds: float, prm: bool):
    class Trainer:  # what _run_one drives: a run that reads (and, first, builds) a PRM, then trains
        @classmethod
        def from_config(cls, cfg, where, init_path=None):
            if prm:
                prm_cache.cached_prm(cfg, "start")
            return cls()

        @classmethod
        def resume(cls, where):  # as a checkpoint records it: 25 s before it, or None (written before the record)
            trainer = cls()
            trainer.cpu_carried = json.loads((where / "state.json").read_text())["cpu_s"]
            return trainer

        def __init__(self) -> None:
            self.cpu_base, self.cpu_carried = usage.run_cpu_s(), 0.0

        cpu_s = RLTrainer.cpu_s

        def run(self) -> None:
            now[0] += seconds

    return Trainer


def test_the_run_that_builds_a_prm_leaves_it_out_of_its_own_cpu_seconds(clock, monkeypatch, tmp_path: Path) -> None:
    before = usage.charged_elsewhere_s()
    cost = {}
    for name, seconds in (("builder", 7.0), ("reader", 9.0)):  # the second finds the PRM cached
        monkeypatch.setattr(launch, "RLTrainer", _trainer(clock, seconds, prm=True))
        (tmp_path / name).mkdir()
        launch._run_one(demo_config_path(True), [], tmp_path / name, None, threads=1, jobs=1)
        cost[name] = json.loads((tmp_path / name / "cost.json").read_text())
    assert cost == {"builder": {"cpu_s": 7.0}, "reader": {"cpu_s": 9.0}}
    assert usage.charged_elsewhere_s() - before == 40.0  # built once
    (info,) = (tmp_path / "cache" / "prm").glob("*/prm_info.json")
    assert json.loads(info.read_text())["prm/cpu_s"] == 40.0
    cfg = load_config(demo_config_path(True), ["reward.source=prm", f"reward.prm={info.parent}"])
    assert prm_cache.prm_record(cfg) == {"prm/cpu_s": 40.0}  # what each reader's start row records

    # the cost table charges the PRM whole to each run that reads it, the builder no more than the reader
    start = {"iteration": 0, "tokens/total": 0, "time/prm_s": 50.0, "prm/cpu_s": 40.0}
    results = {"prm": [[start, {"iteration": 2, "tokens/total": 10}]] * 2}
    rows = cost_rows(results, {"prm": [cost["builder"], cost["reader"]]})
    assert rows[0]["cpu_s"][0] == pytest.approx(48.0)  # (7 + 40 + 9 + 40) / 2


def test_a_failed_build_still_counts_as_built_in_this_process(clock, monkeypatch, tmp_path: Path) -> None:
    def broken(cfg, init_path, path, progress) -> None:
        clock[0] += 5.0
        raise RuntimeError("labelling failed")

    monkeypatch.setattr(prm_cache, "_train_prm", broken)
    before = usage.charged_elsewhere_s()
    with pytest.raises(RuntimeError, match="labelling failed"):
        prm_cache.cached_prm(load_config(demo_config_path(True)), "start")
    assert usage.charged_elsewhere_s() - before == 5.0


@pytest.mark.parametrize("carried", [25.0, None])
def test_a_resumed_run_is_charged_its_earlier_processes_share_or_nothing(
    clock, monkeypatch, tmp_path: Path, carried: float | None
) -> None:
    (tmp_path / "state.json").write_text(json.dumps({"cpu_s": carried}))
    monkeypatch.setattr(launch, "RLTrainer", _trainer(clock, 6.0, prm=False))
    launch._run_one(demo_config_path(True), [], tmp_path, None, threads=1, jobs=1, resume=3)
    cost = json.loads((tmp_path / "cost.json").read_text())
    assert cost == ({"cpu_s": 31.0} if carried else {})  # not the 6 s since the resume alone
    h = [{"iteration": 0, "tokens/total": 0}, {"iteration": 2, "tokens/total": 10}]
    assert (cost_rows({"a": [h]}, {"a": [cost]})[0]["cpu_s"] is None) == (carried is None)
