"""`benchmarks/bench.py` end to end at quick sizes: the report's numbers are consistent with each other."""

import json

import pytest

from bench import BenchOptions, main, run_bench
from bench_report import markdown_report
from common import matmul_peak, median_ratio, spread


def test_spread_and_peak():
    assert spread([3.0, 1.0, 2.0]) == {"min": 1.0, "median": 2.0, "max": 3.0, "n": 3}
    assert median_ratio([4.0, 6.0, 100.0], [1.0, 2.0, 3.0]) == 3.0  # peer / creditrl medians
    peak = matmul_peak(64, repeats=3)
    assert 0 < peak["min"] <= peak["median"] <= peak["max"] and peak["n"] == 3
    # the faster library's spread: its best is the best of every library measured
    assert peak["max"] == max(peak["by_library"].values()) == peak["by_library"][peak["library"]]
    assert "torch" in peak["by_library"]


@pytest.fixture(scope="module")
def quick_result(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    opts = BenchOptions(
        policy="tiny",
        prompts=2,
        group=3,
        max_new_tokens=6,
        repeats=2,
        iterations=3,
        rounds=2,
        curve=3,
        scaling=True,
        groups=(2,),
        lengths=(4,),
        matmul_n=128,
        out=out,
    )
    return run_bench(opts), out


def test_bench_sections_agree(quick_result):
    res, out = quick_result
    assert json.loads((out / "bench.json").read_text())["options"]["group"] == 3
    fixed = res["decode"]["fixed"]
    # eos disabled: every engine generates prompts * group * max_new_tokens tokens
    for name in (
        "hf_generate",
        "creditrl_hf_engine",
        "creditrl_static",
        "creditrl_static_every_row",
        "creditrl_static_torch",
    ):
        assert fixed[name]["new_tokens"] == 2 * 3 * 6
        assert fixed[name]["tokens_per_s"]["n"] == 2
    ratio = fixed["creditrl_static"]["tokens_per_s"]["median"] / fixed["hf_generate"]["tokens_per_s"]["median"]
    assert fixed["ratio_static_vs_hf_generate"] == pytest.approx(ratio)
    ratio = (
        fixed["creditrl_static"]["tokens_per_s"]["median"] / fixed["creditrl_static_torch"]["tokens_per_s"]["median"]
    )
    assert fixed["ratio_kernels_vs_tensor_ops"] == pytest.approx(ratio)
    ratio = (
        fixed["creditrl_static"]["tokens_per_s"]["median"]
        / fixed["creditrl_static_every_row"]["tokens_per_s"]["median"]
    )
    assert fixed["ratio_shared_vs_every_row"] == pytest.approx(ratio)
    assert 0 < fixed["computed_share"]["min"] <= fixed["computed_share"]["max"] <= 1
    it = res["iteration"]
    assert it["creditrl"]["iter_s"]["n"] == 4  # 2 rounds of 3, the first of each dropped as warm-up
    assert it["trl"]["iter_s"]["n"] == 4
    assert it["creditrl"]["rollout_s"]["median"] < it["creditrl"]["iter_s"]["median"]
    assert it["ratio_trl_vs_creditrl"] == pytest.approx(
        it["trl"]["iter_s"]["median"] / it["creditrl"]["iter_s"]["median"]
    )
    assert it["creditrl_every_row"]["iter_s"]["n"] == 4  # the same iterations with optim.skip_zero_advantage=false
    assert it["ratio_trl_vs_creditrl_every_row"] == pytest.approx(
        it["trl"]["iter_s"]["median"] / it["creditrl_every_row"]["iter_s"]["median"]
    )
    assert 0.0 <= it["creditrl"]["skipped_rows"]["min"] <= it["creditrl"]["skipped_rows"]["max"] <= 1.0
    assert it["creditrl"]["update_share_of_peak"] == pytest.approx(
        it["creditrl"]["update_gflops"]["median"] / res["peak_gflops"]["max"]
    )
    assert len(res["curve"]["creditrl"]) == 3 and len(res["curve"]["trl"]) == 3
    assert all(0.0 <= r <= 1.0 for r in res["curve"]["creditrl"] + res["curve"]["trl"])
    assert (out / "reward_curve.png").stat().st_size > 10_000
    assert [(e["axis"], e["value"]) for e in res["scaling"]] == [("group", 2), ("max_new_tokens", 4)]
    assert res["scaling"][0]["samples"] == 2 * 2
    assert res["peak_rss_mb"] > 100
    report = markdown_report(res)
    assert f"{fixed['ratio_static_vs_hf_generate']:.2f}x" in report
    assert "TRL / creditrl" in report and "| group | 2 |" in report
    assert "every row trained (`optim.skip_zero_advantage=false`)" in report


def test_bench_script_quick_without_trl_and_its_page_re_rendered(tmp_path, capsys):
    page = tmp_path / "page.md"
    assert main(["--quick", "--no-trl", "--policy", "tiny", "--out", str(tmp_path), "--results", str(page)]) == 0
    res = json.loads((tmp_path / "bench.json").read_text())
    assert "trl" not in res["iteration"] and res["options"]["max_new_tokens"] == 8
    assert "| creditrl full iteration |" in capsys.readouterr().out
    assert json.loads(page.with_suffix(".json").read_text()) == res  # the run beside its page
    first = page.read_text()
    assert f"| 2 x 2 | 8 | {res['threads']} | 2 | 1 x 2 |" in first
    again = tmp_path / "again.md"
    assert main(["--render", str(page.with_suffix(".json")), "--out", str(tmp_path), "--results", str(again)]) == 0
    assert again.read_text() == first  # the same command and date: the page follows from its JSON alone


def test_curve_summary_numbers(monkeypatch):
    import bench as run

    ours, theirs = [0.1, 0.2, 0.3, 0.4], [0.2, 0.2, 0.4, 0.6]
    monkeypatch.setattr(run, "creditrl_iterations", lambda policy, opts, n: [{"reward/mean": r} for r in ours[:n]])
    monkeypatch.setattr(run, "trl_iterations", lambda policy, opts, n: [{"reward": r} for r in theirs[:n]])
    out = run.bench_curve("unused", BenchOptions(curve=4), lambda msg: None)
    assert out["creditrl_summary"]["mean"] == pytest.approx(0.25)
    assert out["creditrl_summary"]["first_half"] == pytest.approx(0.15)
    assert out["trl_summary"]["second_half"] == pytest.approx(0.5)
    assert out["creditrl_summary"]["se"] == pytest.approx(0.12909944 / 2, rel=1e-6)  # stdev / sqrt(4)
    assert out["correlation"] == pytest.approx(0.07 / (0.05 * 0.11) ** 0.5, rel=1e-6)  # by hand
