"""Section g of `benchmarks/performance.py`: every op's own time goes to the stage holding it and
to one kind of work, the kinds partition each stage, and the page's explanations quote the profile."""

from dataclasses import dataclass, field

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from creditrl.train.metrics import STAGE_LABEL, StageTimer
from perf_profile import KINDS, op_kind, per_iteration, profile_lines, tally
from perf_targets import study_budget, update_budget_rows


@dataclass
class Event:  # the fields of torch.autograd.profiler_util.FunctionEvent that tally reads
    name: str
    cpu_time_total: float  # microseconds, children included
    cpu_parent: "Event | None" = None
    children: list = field(default_factory=list)

    @property
    def self_cpu_time_total(self) -> float:
        return self.cpu_time_total - sum(c.cpu_time_total for c in self.children)


def _child(parent: Event, name: str, us: float) -> Event:
    e = Event(name, us, parent)
    parent.children.append(e)
    return e


def test_op_kinds():
    assert op_kind("aten::mm") == op_kind("aten::addmm") == op_kind("mkldnn::_linear_pointwise") == "products"
    assert op_kind("aten::_scaled_dot_product_flash_attention_for_cpu_backward") == "attention"
    assert op_kind("aten::mul") == op_kind("aten::cat") == "other ops"
    assert op_kind("autograd::engine::evaluate_function: MmBackward0") == "outside ops"
    assert op_kind("Optimizer.step#AdamW.step") == op_kind("_GatherBackward") == "outside ops"


def test_own_times_go_to_the_enclosing_stage_and_partition_it():
    update = Event(STAGE_LABEL + "update", 1000.0)
    linear = _child(update, "aten::linear", 600.0)
    _child(linear, "aten::mm", 500.0)  # linear's own 100 us are an other op
    _child(update, "aten::_scaled_dot_product_flash_attention_for_cpu", 150.0)
    step = _child(update, "Optimizer.step#AdamW.step", 200.0)
    _child(step, "aten::mul", 120.0)
    rollout = Event(STAGE_LABEL + "rollout", 400.0)
    _child(rollout, "aten::addmm", 100.0)
    stray = Event("aten::mm", 9999.0)  # outside every stage: not counted
    events = [update, *update.children, *linear.children, *step.children, rollout, *rollout.children, stray]
    out = per_iteration(tally(events), iterations=2)
    u = out["update"]
    assert u["wall_s"] == pytest.approx(500e-6)  # 1,000 us over 2 iterations
    assert u["products"] == pytest.approx(250e-6) and u["attention"] == pytest.approx(75e-6)
    assert u["other ops"] == pytest.approx((100 + 120) / 2 * 1e-6)
    assert u["outside ops"] == pytest.approx((1000 - 600 - 150 - 200 + 200 - 120) / 2 * 1e-6)
    assert sum(u[k] for k in KINDS) == pytest.approx(u["wall_s"])
    assert u["top_ops"][0] == ["aten::mm", pytest.approx(250e-6)]
    assert out["rollout"]["products"] == pytest.approx(50e-6) and out["rollout"]["outside ops"] == pytest.approx(150e-6)


def test_a_real_profile_of_stage_timer_ranges_partitions_each_stage():
    a, b = torch.randn(256, 256), torch.randn(256, 256)
    timer = StageTimer()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(2):
            with timer("update"):
                (a @ b).relu().sum()
                sum(range(20000))  # Python time: outside ops
    u = per_iteration(tally(prof.events()), iterations=2)["update"]
    assert sum(u[k] for k in KINDS) == pytest.approx(u["wall_s"], rel=1e-6)
    assert u["products"] > 0 and u["other ops"] > 0 and u["outside ops"] > 0 and u["attention"] == 0
    # the range runs inside the timer's clock readings (how much less depends on the machine's load)
    assert 0 < u["wall_s"] <= timer.times["update"] / 2 + 1e-5
    assert {name for name, _ in u["top_ops"]} >= {"aten::mm"}


def _profile(products: float, other: float, wall: float, stage: str = "update", attention: float = 0.0) -> dict:
    rest = wall - products - other - attention
    split = {"wall_s": wall, "products": products, "attention": attention, "other ops": other, "outside ops": rest}
    split["top_ops"] = [["aten::mm", products], ["aten::mul", other / 2], ["aten::cat", other / 4]]
    return {"plain_iter_s": wall, "profiled_iter_s": wall, "stages": {stage: split}}


def _point(length: int, update_share: float, decode_ratio: float, update_s: float = 1.0, peak: float = 100) -> dict:
    return {
        "length": length,
        "iteration": {
            "update_peak_share": update_share,
            "creditrl_update_s": {"median": update_s},
            "update_gflops": {"median": update_share * peak},
        },
        "decode": {"ratio_hf_vs_creditrl": decode_ratio},
    }


def test_the_profile_table_splits_each_stage_by_kind():
    lines = profile_lines({"length 8": _profile(0.2, 0.6, 1.0)})
    assert lines[0] == "## g. Where the time goes"
    assert "| length 8 | 1.000 / 1.000 | update | 1.000 | 0.200 (20%) | 0.000 (0%) | 0.600 (60%) | 0.200 (20%) |" in (
        "\n".join(lines)
    )


def test_what_half_the_peak_asks_of_the_update_and_2x_of_the_study_end_to_end():
    # length 8: 30% of a 100 GFLOP/s peak in 1 s, so 50% means 0.6 s; products 0.4 s + attention 0.1 s fit
    # length 32: 20% in 2 s, so 0.8 s; products 0.6 s + attention 0.5 s already take longer
    res = {
        "lengths": [_point(8, 0.3, 4.0), _point(32, 0.2, 4.0, update_s=2.0)],
        "sizes": [],
        "limits": {"peak_gflops": 100},
        "profile": {
            "length 8": _profile(0.4, 0.3, 1.0, attention=0.1),
            "length 32": _profile(0.6, 0.4, 2.0, attention=0.5),
        },
    }
    fits, over = update_budget_rows(res, {"min_peak_share": 0.5})
    assert fits["point"] == "length 8" and fits["allowed_s"] == pytest.approx(0.6)
    assert fits["products_gflops"] == pytest.approx(75) and fits["products_peak_share"] == pytest.approx(0.75)
    assert fits["left_s"] == pytest.approx(0.1) and fits["other_now_s"] == pytest.approx(0.5)
    assert over["point"] == "length 32" and over["allowed_s"] == pytest.approx(0.8)
    assert over["products_gflops"] == pytest.approx(40 / 0.6) and over["left_s"] == pytest.approx(-0.3)
    res["lengths"][1]["iteration"]["update_peak_share"] = 0.5  # meets the target: no row
    assert [r["point"] for r in update_budget_rows(res, {"min_peak_share": 0.5})] == ["length 8"]
    assert update_budget_rows({**res, "profile": {}}, {"min_peak_share": 0.5}) == []
    # 2x of a median 44 s baseline is 22 s; 6 s outside 40 iterations leaves 0.4 s each
    study = {
        "baseline": {
            "commit": "abc1234",
            "old": [
                {"wall_s": w, "samples": 400, "iterations": 40, "samples_per_iteration_s": 10.0} for w in (40, 44, 48)
            ],
        },
        "runs": {"arith": [{"wall_s": 30, "outside_iterations_s": o, "iterations": 40} for o in (5, 7)]},
    }
    res = {**res, "study": study, "forward": {"arith": {"response_tokens": 1000}}}
    res["lengths"][0]["non_embedding_parameters"] = 1_000_000
    b = study_budget(res, {"min_baseline_speedup": 2.0})
    assert b["allowed_wall_s"] == pytest.approx(22.0) and b["outside_iterations_s"] == pytest.approx(6.0)
    assert b["left_per_iteration_s"] == pytest.approx(0.4)
    assert b["allowed_iteration_s"] == pytest.approx(0.5) and b["model_s_at_peak"] == pytest.approx(10 * 1e9 / 100e9)
