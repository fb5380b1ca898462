"""`benchmarks/performance.py` at quick sizes: every section is there, the never-sampled eos makes
every row decode max_new_tokens, the derived numbers (targets, bounds) follow from the raw ones, and
the page's only prose is its constant method paragraphs."""

import json
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from bench import update_model_flops
from creditrl.policy.engines import SamplingParams, StaticEngine
from creditrl.policy.model import load_policy
from creditrl.policy.tokenizer import encode_prompt
from creditrl.tasks import make_task
from hf_peer import hf_generate_throughput
from perf_options import ModelSize, PerformanceOptions, Targets, quick_options
from perf_points import decode_bytes, model_geometry, save_never_eos_model
from perf_profile import KINDS, profile_lines
from perf_study import baseline_label, baseline_source, compare_rows, summarise_run
from perf_targets import (
    attention_flops,
    decode_bounds,
    decode_ceiling,
    iteration_bounds,
    prompt_length,
    study_budget,
    target_rows,
    update_budget_rows,
)
from performance import load_saved, options_from_args, parser, render_saved, run_performance
from performance_report import METHOD, performance_report

SMALL = ModelSize("small", hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)
TARGETS = Targets(
    min_speedup=3.0, min_bandwidth_share=0.5, min_peak_share=0.5, min_baseline_speedup=2.0, max_rss_mb=4096
)


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("performance")
    # no baseline comparison (a checkout and two more `creditrl train` subprocesses, the first of them
    # compiling the old tree's numba kernels), to keep this well under a minute
    opts = replace(quick_options(PerformanceOptions()), out=out, results=out / "page.md", targets=TARGETS)
    return run_performance(opts), opts


def test_quick_options_are_quick_and_cover_every_section():
    q = quick_options(PerformanceOptions())
    assert q.policy == "tiny" and q.lengths == (8, 16) and q.repeats == 1 and q.iterations == 2 and q.rounds == 1
    assert set(q.study_iterations.values()) == {3} and q.baseline is None and q.rss and q.trl
    assert all(o.startswith(("train.", "rollout.", "task.")) for os_ in q.study_overrides.values() for o in os_)
    opts = options_from_args(parser().parse_args(["--quick", "--no-trl", "--out", "x", "--results", "p.md"]))
    assert opts.lengths == (8, 16) and not opts.trl
    assert opts.out == Path("x") and opts.results == Path("p.md")
    full = options_from_args(parser().parse_args([]))
    assert full.lengths == (64, 256, 512, 1000) and full.prompts * full.group == 16 and full.policy == "sft"
    assert [s.name for s in full.sizes] == ["tiny", "10M", "50M"] and full.size_length == 256
    assert full.targets == Targets() and full.baseline is None  # no target and no baseline unless given


def test_targets_and_the_baseline_are_arguments():
    args = ["--min-speedup", "2.5", "--min-peak-share", "0.4", "--max-rss-mb", "1000", "--baseline", "old/tree"]
    opts = options_from_args(parser().parse_args(args))
    assert opts.targets == Targets(min_speedup=2.5, min_peak_share=0.4, max_rss_mb=1000.0)
    assert opts.baseline == Path("old/tree") and baseline_label(opts) == "tree"
    assert baseline_label(replace(opts, baseline_name="d760505")) == "d760505"


def test_report_has_every_section_and_the_page_its_header(quick):
    res, opts = quick
    saved = json.loads((opts.out / "performance.json").read_text())
    assert {"limits", "lengths", "sizes", "study", "rss", "forward", "kl_skip", "profile"} <= set(saved)
    assert saved["targets"] == {
        "min_speedup": 3.0,
        "min_bandwidth_share": 0.5,
        "min_peak_share": 0.5,
        "min_baseline_speedup": 2.0,
        "max_rss_mb": 4096,
    }
    page = opts.results.read_text()
    assert json.loads(opts.results.with_suffix(".json").read_text()) == saved  # the run beside its page
    assert page.startswith("# Performance") and "Written by `" in page and "machine:" in page
    for heading in ("## a. By generated length", "## b. By model size", "## c. Study settings"):
        assert heading in page
    for heading in ("## d. Bandwidth and peak", "## e. Peak RSS", "## f. The packed forward", "## Bounds of"):
        assert heading in page
    assert "## g. Where the time goes" in page and "| study arith |" in page
    # section g: the study's iteration and every point's, each stage split by kind
    assert set(res["profile"]) == {"study arith", "length 8", "length 16", "size 0.1M", "size 0.3M"}
    for r in res["profile"].values():
        assert r["iterations"] == 1 and {"rollout", "update"} <= set(r["stages"])
        for s in r["stages"].values():
            assert sum(s[k] for k in KINDS) == pytest.approx(s["wall_s"], rel=1e-6)
        assert r["stages"]["update"]["products"] > 0
    for fig in ("page_length.png", "page_size.png"):
        assert f"({fig})" in page and (opts.results.parent / fig).stat().st_size > 0
    assert [p["length"] for p in res["lengths"]] == [8, 16]
    assert [p["size"]["name"] for p in res["sizes"]] == ["0.1M", "0.3M"]
    assert res["sizes"][0]["parameters"] < res["sizes"][1]["parameters"]
    assert set(res["study"]["runs"]) == {"arith", "chain"} and "baseline" not in res["study"]
    run = res["study"]["runs"]["arith"][0]
    assert run["iterations"] == 3 and run["samples"] == 3 * 2 * 2 and run["evaluations"] == 2
    assert run["wall_s"] > run["iterations_s"] > 0 and run["samples_per_s"] == pytest.approx(12 / run["wall_s"])
    assert set(run["stages_s"]) >= {"rollout", "update"} and run["eval_source"] in ("row gaps", "time/eval_s")
    assert 0 < res["rss"]["peak_rss_mb"] < 4096 and res["rss"]["response_length"] == 32
    # one targets row per target and point: 4 iteration ratios, 4 decode ratios, the longest length's
    # bandwidth, 4 peak shares and the peak RSS (no baseline, so no baseline target)
    rows = target_rows(res, saved["targets"])
    assert len(rows) == 4 + 4 + 1 + 4 + 1
    for r in rows:
        met = "yes" if r["met"] else "**no**"
        assert f"| {r['target']} | {r['threshold']:,.4g} | {r['point']} | {r['value']:,.4g} | {met} |" in page


def test_never_eos_rows_decode_exactly_max_new_tokens(quick):
    res, opts = quick
    rows = opts.prompts * opts.group
    for p in res["lengths"] + res["sizes"]:
        assert not p["eos_reachable"] and p["max_new_tokens"] == p["length"]  # random init: no margin needed
        raw = p["raw"]
        assert all(lengths == [p["length"]] * rows for lengths in raw["decode"]["creditrl"]["lengths"])
        assert raw["decode"]["hf"]["tokens"] == [p["length"] * rows] * opts.repeats
        assert all(r["response/length"] == p["length"] for r in raw["iterations"]["creditrl"])
        assert all(r["tokens"] == p["length"] * rows for r in raw["iterations"]["trl"])


def test_never_eos_model_cannot_stop_in_either_engine(tmp_path):
    path = save_never_eos_model(SMALL, tmp_path / "m")
    model, tok = load_policy(str(path))
    model.eval()
    assert tok.eos_token_id == model.config.vocab_size == model.get_output_embeddings().weight.shape[0]
    assert tok.pad_token_id == 0 and tok.bos_token_id == 1  # the character tokenizer's ids are unchanged
    prompts = [
        encode_prompt(tok, p.prompt)
        for p in make_task("chain", min_steps=2, max_steps=2).sample(2, split="train", seed=0)
    ]
    g = StaticEngine(model, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id).generate(
        prompts, 3, SamplingParams(max_new_tokens=12), generator=torch.Generator().manual_seed(0)
    )
    assert [len(t) for t in g.tokens] == [12] * 6 and not any(g.finished)
    hf = hf_generate_throughput(model, prompts, 3, 12, temperature=1.0, pad_id=0, eos_id=tok.eos_token_id, seed=0)
    assert hf["new_tokens"] == 12 * 6


def test_decode_bytes_match_a_hand_computation(tmp_path):
    model, _ = load_policy(str(save_never_eos_model(SMALL, tmp_path / "m")))
    geo = model_geometry(model)
    # 2 layers of q, k, v, o (32 x 32), gate, up, down (32 x 64) and 2 norms (32); the final norm (32)
    n = 2 * (4 * 32 * 32 + 3 * 32 * 64 + 2 * 32) + 32
    assert geo == {
        "parameters": n + 99 * 32,  # + the tied embedding
        "non_embedding_parameters": n,
        "layers": 2,
        "kv_heads": 2,
        "head_dim": 16,
    }
    # two rows: prompt 3, 4 tokens generated; prompt 5, 2 generated -> 4 steps
    out = decode_bytes(geo, [3, 5], [4, 2])
    kv = 2 * 2 * 2 * 16 * 4  # layers x (k, v) x kv heads x head dim x fp32
    positions = (3 + 4 + 5 + 6) + (5 + 6)  # row 1 reads 3, 4, 5, 6 positions; row 2 reads 5, 6
    assert out["kv_bytes_per_position"] == kv and out["kv_positions_read"] == positions and out["steps"] == 4
    assert out["bytes_per_token"] == pytest.approx((4 * n * 4 + kv * positions) / 6)


def test_ratios_are_peer_over_creditrl_medians(quick):
    res, _ = quick
    for p in res["lengths"] + res["sizes"]:
        raw, it, d = p["raw"], p["iteration"], p["decode"]
        trl = statistics.median(r["time_s"] for r in raw["iterations"]["trl"])
        ours = statistics.median(r["time/iter_s"] for r in raw["iterations"]["creditrl"])
        assert it["ratio_trl_vs_creditrl"] == pytest.approx(trl / ours)
        hf = statistics.median(s / n for s, n in zip(raw["decode"]["hf"]["s"], raw["decode"]["hf"]["tokens"]))
        cr = raw["decode"]["creditrl"]
        assert d["ratio_hf_vs_creditrl"] == pytest.approx(
            hf / statistics.median(s / n for s, n in zip(cr["s"], cr["tokens"]))
        )
        gbs = statistics.median(t / s / 1e9 for t, s in zip([d["traffic"]["total_bytes"]] * len(cr["s"]), cr["s"]))
        assert d["bandwidth_share"] == pytest.approx(gbs / res["limits"]["copy_gbs"])
        assert it["update_peak_share"] == pytest.approx(it["update_gflops"]["median"] / res["limits"]["peak_gflops"])
        # 6 N x every row's real prompt and response tokens, padding not counted
        n, rows = p["non_embedding_parameters"], raw["iterations"]["creditrl"]
        assert all(0 < r["tokens/prompt"] + r["tokens/generated"] <= r["tokens/padded"] for r in rows)
        got = statistics.median(
            6 * n * (r["tokens/prompt"] + r["tokens/generated"]) / r["time/update_s"] / 1e9 for r in rows
        )
        assert it["update_gflops"]["median"] == pytest.approx(got)


def test_update_model_flops_count_real_tokens_of_the_trained_rows():
    row = {"tokens/prompt": 40, "tokens/generated": 60, "tokens/padded": 160}
    assert update_model_flops(1_000, row) == 6 * 1_000 * 100
    assert update_model_flops(1_000, {**row, "update/skipped_rows": 0.25}) == 6 * 1_000 * 100 * 0.75


def test_a_target_row_per_point_met_at_or_above_its_threshold(quick):
    res = json.loads(json.dumps(quick[0]))
    for p in res["lengths"] + res["sizes"]:
        p["iteration"].update(ratio_trl_vs_creditrl=5.0, update_peak_share=0.9)
        p["decode"].update(ratio_hf_vs_creditrl=5.0, bandwidth_share=0.9)
    assert all(r["met"] for r in target_rows(res, vars(TARGETS)))
    p = res["sizes"][1]
    p["iteration"]["ratio_trl_vs_creditrl"] = 2.5
    res["lengths"][1]["decode"]["bandwidth_share"] = 0.25
    res["sizes"][0]["iteration"]["ratio_trl_vs_creditrl"] = 3.0  # exactly the target: met
    missed = [(r["point"], r["value"]) for r in target_rows(res, vars(TARGETS)) if not r["met"]]
    assert missed == [("size 0.3M", 2.5), ("length 16", 0.25)]
    res["rss"]["peak_rss_mb"] = 5000.0  # an upper bound: over it is missed
    assert [r["point"] for r in target_rows(res, vars(TARGETS)) if not r["met"]][-1] == "0.1M"
    only = target_rows(res, {"min_peak_share": 0.95})  # a target not given has no rows
    assert len(only) == 4 and not any(r["met"] for r in only)
    assert target_rows(res, {}) == []
    res["study"]["baseline"] = {"commit": "abc", "speedup": 1.04}
    (base,) = [r for r in target_rows(res, {"min_baseline_speedup": 2.0})]
    assert (base["point"], base["value"], base["met"]) == ("study", 1.04, False) and "abc" in base["target"]


def test_summarise_run_splits_the_time_outside_iterations():
    times = {"time/rollout_s": 1.0, "time/update_s": 1.0, "time/iter_s": 2.0}
    rows = [
        {"iteration": 0, "samples/total": 0, "eval/accuracy": 0.5},
        {"iteration": 1, "samples/total": 4, **times, "reward/mean": 0.25},
        {"iteration": 2, "samples/total": 8, **times, "reward/mean": 0.5},
        {"iteration": 3, "samples/total": 12, **times, "reward/mean": 0.5, "eval/accuracy": 0.75},
    ]
    # row 0 at 5 s (start-up + first evaluation), then gaps of 2.1, 2.1 and 2.1 + 3 (an evaluation)
    out = summarise_run(rows, wall=16.0, stamps=[5.0, 7.1, 9.2, 14.3])
    assert out["samples_per_s"] == 12 / 16 and out["samples_per_iteration_s"] == 2.0
    assert out["stages_s"] == {"rollout": 3.0, "update": 3.0} and out["outside_iterations_s"] == 10.0
    assert out["until_first_row_s"] == 5.0 and out["later_evals_s"] == pytest.approx(3.0)
    assert out["evaluations"] == 2 and out["eval_source"] == "row gaps"
    other = [dict(r, **{"reward/mean": r.get("reward/mean", 0) + 0.125}) for r in rows]
    other[3]["eval/accuracy"] = 0.5
    agree = compare_rows(rows, other)
    assert agree["reward/mean"] == {"max_abs_diff": 0.125, "compared": 3}
    assert agree["eval/accuracy"] == {"max_abs_diff": 0.25, "compared": 2}
    # the same samples (token counts) while the loss differs by rounding, then a differing sample
    a = [{"iteration": i, "tokens/generated": 100, "loss/policy": 0.5} for i in range(1, 5)]
    b = [dict(r) for r in a]
    b[1]["loss/policy"] = 0.5 * (1 + 1e-7)
    b[2]["tokens/generated"] = 101
    assert compare_rows(a, b)["samples"] == {
        "first_differing_iteration": 3,
        "loss_abs_diff_before": pytest.approx(0.5e-7),
        "loss_scale_before": pytest.approx(0.5),
    }
    assert compare_rows(a, a)["samples"] == {
        "first_differing_iteration": None,
        "loss_abs_diff_before": 0.0,
        "loss_scale_before": 0.5,
    }
    assert compare_rows(rows, other)["samples"] is None  # no token counts in these rows: unknown, not "same"


def test_the_baseline_is_a_checkout_the_user_made(tmp_path):
    (tmp_path / "old/src/creditrl/configs").mkdir(parents=True)
    (tmp_path / "old/src/creditrl/configs/arith.yaml").write_text("{}")
    assert baseline_source(tmp_path / "old") == (tmp_path / "old/src").resolve()
    with pytest.raises(ValueError, match="not a creditrl checkout"):
        baseline_source(tmp_path)


def test_a_policy_that_can_stop_gets_the_length_margin(tmp_path):
    """The SFT path of section a, with a stand-in: a plain random-init model (its eos is in the vocabulary)."""
    from creditrl.policy.model import build_tiny
    from perf_points import measure_point

    model, tok = build_tiny(0, SMALL.preset())
    model.save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    opts = replace(quick_options(PerformanceOptions()), length_margin=4, trl=False)
    limits = {"copy_gbs": 10.0, "peak_gflops": 50.0}
    p = measure_point(str(tmp_path / "m"), 8, opts, limits, lambda _: None, "stand-in")
    assert p["eos_reachable"] and p["max_new_tokens"] == 12 and p["chain_steps"] == 1
    lengths = p["raw"]["decode"]["creditrl"]["lengths"][0]
    assert len(lengths) == 4 and all(1 <= n <= 12 for n in lengths)
    assert "trl_iter_s" not in p["iteration"] and p["iteration"]["creditrl_iter_s"]["n"] == 1


def test_a_saved_run_re_renders_with_its_own_command_and_the_bounds(quick, tmp_path):
    res, opts = quick
    page = tmp_path / "again.md"
    render_saved(opts.out / "performance.json", page)
    text = page.read_text()
    assert f"Written by `{res['command']}`" in text  # the measuring command, not the re-render's
    assert "## Bounds of sections a and b" in text and "## f. The packed forward" in text
    assert (tmp_path / "again_length.png").exists() and (tmp_path / "again_size.png").exists()
    p = res["lengths"][0]
    rows = opts.prompts * opts.group
    att, lin = attention_flops(p, rows)
    t, n = p["iteration"]["creditrl_length"], prompt_length(p)
    # causal: response query i sees the n prompt keys and i + 1 response keys
    keys = sum(n + i + 1 for i in range(int(t))) if t == int(t) else t * n + t * (t + 1) / 2
    assert att == pytest.approx(3 * p["layers"] * 4 * rows * p["kv_heads"] * p["head_dim"] * keys)
    assert lin == pytest.approx(6 * p["non_embedding_parameters"] * rows * (t + n))
    (bound,) = [r for r in iteration_bounds(res, vars(TARGETS)) if r["point"] == "length 8"]
    assert bound["peak_share_with_attention"] == pytest.approx(p["iteration"]["update_peak_share"] * (att + lin) / lin)
    assert f"| length 8 | {bound['rollout_s']:.3f} | {bound['update_s']:.3f} |" in text
    # targets given at the re-render replace those the run kept, one by one
    again = load_saved(opts.out / "performance.json", {"min_speedup": 9.0, "max_rss_mb": None})
    assert again["targets"] == {**vars(TARGETS), "min_speedup": 9.0}


def test_the_prompt_length_follows_from_the_kv_positions_a_decode_read():

    from perf_points import decode_bytes

    geometry = {"non_embedding_parameters": 10, "layers": 2, "kv_heads": 2, "head_dim": 4}
    lengths = [5, 3, 7, 7]
    traffic = decode_bytes(geometry, [8, 8, 8, 8], lengths)
    p = {"decode": {"traffic": traffic}, "raw": {"decode": {"creditrl": {"lengths": [[1], lengths]}}}}
    assert prompt_length(p) == pytest.approx(8.0)
    traffic = decode_bytes(geometry, [4, 4, 10, 10], lengths)  # the generated-token-weighted mean
    p["decode"]["traffic"] = traffic
    assert prompt_length(p) == pytest.approx((5 * 4 + 3 * 4 + 7 * 10 + 7 * 10) / 22)


def test_the_iteration_bounds_give_the_rollout_a_target_allows_and_the_ratio_at_a_zero_second_rollout():
    def point(length, trl, update, rollout):
        it = {
            "trl_iter_s": {"median": trl},
            "creditrl_update_s": {"median": update},
            "creditrl_rollout_s": {"median": rollout},
            "creditrl_iter_s": {"median": update + rollout},
            "creditrl_length": 10.0,
            "update_peak_share": 0.25,
        }
        decode = {"traffic": {"kv_positions_read": 4 * 45 + 4 * 10 * 5}}  # 4 rows of 10 tokens after 5 prompt tokens
        raw = {"decode": {"creditrl": {"lengths": [[10] * 4]}}}
        geometry = {"layers": 2, "kv_heads": 2, "head_dim": 4, "non_embedding_parameters": 100}
        return {"length": length, "iteration": it, "decode": decode, "raw": raw, **geometry}

    res = {
        "options": {"prompts": 2, "group": 2},
        "lengths": [point(64, 3.0, 0.5, 1.0), point(256, 3.0, 1.5, 0.5)],
        "sizes": [],
    }
    fast, slow = iteration_bounds(res, {"min_speedup": 3.0})
    assert fast["rollout_allowed_s"] == pytest.approx(0.5) and fast["zero_rollout_ratio"] == pytest.approx(6.0)
    assert slow["rollout_allowed_s"] == pytest.approx(-0.5) and slow["zero_rollout_ratio"] == pytest.approx(2.0)
    assert fast["update_share"] == pytest.approx(0.5 / 1.5)
    assert iteration_bounds(res, {})[0]["rollout_allowed_s"] is None  # no target: nothing allowed to compute
    # T = 10, P = 5: attention 3 x 2 layers x 4 x 4 rows x 8 wide x (50 + 55); 6 N x 4 rows x 15 positions
    assert fast["attention_gflop"] * 1e9 == pytest.approx(3 * 2 * 4 * 4 * 8 * 105)
    assert fast["linear_gflop"] * 1e9 == pytest.approx(6 * 100 * 4 * 15)


def test_a_re_render_keeps_the_date_of_the_measurement(quick, tmp_path):
    from performance import render_saved

    res, opts = quick
    saved = json.loads((opts.out / "performance.json").read_text())
    saved["date"] = "2001-02-03 04:05 UTC"
    (tmp_path / "performance.json").write_text(json.dumps(saved))
    for name in ("performance_length.png", "performance_size.png"):
        (tmp_path / name).write_bytes((opts.out / name).read_bytes())
    render_saved(tmp_path / "performance.json", tmp_path / "p.md")
    assert f"Written by `{res['command']}` on 2001-02-03 04:05 UTC;" in (tmp_path / "p.md").read_text()


def test_a_section_measured_again_goes_into_the_saved_run_and_is_named(quick, tmp_path):
    from performance import remeasure

    res, opts = quick
    saved = tmp_path / "performance.json"
    saved.write_text((opts.out / "performance.json").read_text())
    before = json.loads(saved.read_text())
    again = remeasure(saved, ["rss"], replace(opts, out=tmp_path, results=tmp_path / "p.md"))
    after = json.loads(saved.read_text())
    assert after["lengths"] == before["lengths"] and after["date"] == before["date"]  # the rest stays the run's
    assert after["rss"] == again["rss"] and set(after["remeasured"]) == {"rss"}
    assert set(after["rss"]["stage_peak_mb"]) >= {"rollout", "update"}
    assert all(0 < mb <= after["rss"]["peak_rss_mb"] + 1 for mb in after["rss"]["stage_peak_mb"].values())
    page = (tmp_path / "p.md").read_text()
    assert f"Written by `{res['command']}`" in page
    assert "| e (peak RSS) | `" in page
    r = after["rss"]
    row = f"| {r['peak_rss_mb']:,.0f} | {r['stage_peak_mb']['rollout']:,.0f} | {r['stage_peak_mb']['reference']:,.0f} |"
    assert row in page
    with pytest.raises(ValueError, match="--sections: unknown lengths; valid: study, rss, forward, kl_skip, profile"):
        remeasure(saved, ["lengths"], opts)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(threads + 1)
        with pytest.raises(ValueError, match=f"that run used {threads} threads and this one {threads + 1}"):
            remeasure(saved, ["rss"], opts)
    finally:
        torch.set_num_threads(threads)


def test_the_peak_is_the_process_own_not_the_parent_carried_over_the_exec():
    from creditrl.experiments.report import peak_rss_mb as own_peak_mb

    assert own_peak_mb() >= peak_rss_now_mb() * 0.99 > 0  # this process: at least its resident set now
    # a child started by a process holding 2 GB more: ru_maxrss reports the parent's, VmHWM the child's own
    blob = bytearray(b"x" * (2048 * 2**20))
    code = (
        "import resource; from creditrl.experiments.report import peak_rss_mb as own_peak_mb; "
        "print(own_peak_mb(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    own, carried = float(out[0]), float(out[1])
    assert own < 1500 and carried > 2048
    del blob


def peak_rss_now_mb() -> float:
    import os

    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def test_the_rss_sampler_splits_its_samples_by_stage():
    from perf_rss import RssSampler

    sampler = RssSampler()
    sampler.start = 100.0
    sampler.samples = [(100.5, 10.0), (101.2, 30.0), (101.9, 20.0), (103.5, 5.0), (104.0, 40.0)]
    row = {"time/rollout_s": 1.0, "time/reference_s": 1.0, "time/score_s": 0.5, "time/update_s": 2.0}
    # score (102.0-102.5 s) holds no sample: it gets the next one, at 103.5 s
    assert sampler.stage_peaks(row) == {"rollout": 10.0, "reference": 30.0, "score": 5.0, "update": 40.0}
    # the peak so far rose to its final value before the sample at 101.9 s: within the reference stage
    sampler.highs = [(100.5, 10.0), (101.2, 30.0), (101.9, 55.0), (103.5, 55.0), (104.0, 55.0)]
    assert sampler.peak_stage(row) == "reference"
    sampler.highs = [(100.5, 10.0), (101.2, 30.0), (101.9, 30.0), (103.5, 30.0), (104.6, 70.0)]
    assert sampler.peak_stage(row) == "after the stages"
    with RssSampler(every=0.005) as live:
        time.sleep(0.03)
        blob = bytearray(b"x" * (64 * 2**20))  # 64 MB written, so resident
        time.sleep(0.05)
    seen = [mb for _, mb in live.samples]
    assert len(seen) >= 3 and max(seen) - seen[0] > 60
    del blob


def test_the_decode_bounds_set_the_target_against_the_ceiling(quick):
    res, opts = quick
    rows = opts.prompts * opts.group
    for p in res["lengths"] + res["sizes"]:
        c = p["decode"]["products"]
        assert c["rows"] == rows and c["flops_per_step"] % (2 * rows) == 0
        assert c["tokens_per_s"] == pytest.approx(rows / c["step_s"]["median"])
        assert c["gflops"] == pytest.approx(c["flops_per_step"] / c["step_s"]["min"] / 1e9)
    fast = json.loads(json.dumps(res))
    p = fast["sizes"][0]
    ceiling = decode_ceiling(p["decode"], fast["limits"]["copy_gbs"])
    assert ceiling < p["decode"]["products"]["tokens_per_s"]  # the KV read adds to the products' time
    p["decode"]["hf_generate_tokens_per_s"]["median"] = ceiling / 2  # 3x HF = 1.5x the ceiling
    p["decode"]["creditrl_tokens_per_s"]["median"] = ceiling * 0.75
    bound = decode_bounds(fast, {"min_speedup": 3.0})[2]
    assert bound["point"] == "size 0.1M" and bound["ceiling_tokens_per_s"] == pytest.approx(ceiling)
    assert bound["creditrl_share"] == pytest.approx(0.75) and bound["hf_share"] == pytest.approx(0.5)
    assert bound["target_tokens_per_s"] == pytest.approx(1.5 * ceiling) and bound["target_share"] == pytest.approx(1.5)
    assert decode_bounds(fast, {})[2]["target_share"] is None


def test_the_study_budget_is_the_model_flops_of_an_iteration_against_the_time_a_speedup_allows(quick):
    res = json.loads(json.dumps(quick[0]))
    n, peak = res["lengths"][0]["non_embedding_parameters"], res["limits"]["peak_gflops"]
    res["study"]["baseline"] = {
        "commit": "abc",
        "old": [{"samples": 1280, "iterations": 10, "samples_per_iteration_s": 128.0, "wall_s": 30.0}] * 3,
    }
    res["forward"]["arith"]["response_tokens"] = 5000
    b = study_budget(res, {"min_baseline_speedup": 2.0})
    assert b["baseline_iteration_s"] == pytest.approx(1.0) and b["allowed_iteration_s"] == pytest.approx(0.5)
    assert b["model_gflop"] == pytest.approx(10 * n * 5000 / 1e9)
    assert b["model_s_at_peak"] == pytest.approx(10 * n * 5000 / peak / 1e9)
    assert b["left_iteration_s"] == pytest.approx(0.5 - b["model_s_at_peak"])
    run = res["study"]["runs"]["arith"][0]
    assert b["allowed_wall_s"] == pytest.approx(15.0)
    assert b["left_per_iteration_s"] == pytest.approx((15.0 - run["outside_iterations_s"]) / run["iterations"])
    kinds = {k: sum(s[k] for s in res["profile"]["study arith"]["stages"].values()) for k in KINDS}
    assert b["profiled_products_s"] == pytest.approx(kinds["products"])
    assert "allowed_iteration_s" not in study_budget(res, {})  # no target: no allowance
    res["study"].pop("baseline")
    assert study_budget(res, {"min_baseline_speedup": 2.0}) is None


def test_the_update_budget_is_the_time_a_peak_share_allows_against_the_profiled_products(quick):
    res = json.loads(json.dumps(quick[0]))
    for p in res["lengths"] + res["sizes"]:
        p["iteration"]["update_peak_share"] = 0.9
    p = res["lengths"][0]
    p["iteration"]["update_peak_share"] = 0.25
    rows = update_budget_rows(res, {"min_peak_share": 0.5})
    assert [r["point"] for r in rows] == ["length 8"]
    u, seconds = res["profile"]["length 8"]["stages"]["update"], p["iteration"]["creditrl_update_s"]["median"]
    assert rows[0]["allowed_s"] == pytest.approx(seconds / 2)  # the same FLOPs at twice the share
    assert rows[0]["left_s"] == pytest.approx(seconds / 2 - u["products"] - u["attention"])
    assert update_budget_rows(res, {}) == []


def test_decode_products_count_every_linear_weight_of_a_step():
    from creditrl.policy.model import build_tiny
    from perf_points import decode_products

    model = build_tiny(0)[0]
    linears = sum(m.weight.numel() for m in model.model.layers.modules() if isinstance(m, torch.nn.Linear))
    head = model.get_output_embeddings().weight.numel()
    out = decode_products(model, rows=3, steps=2, repeats=2)
    assert out["flops_per_step"] == 2 * 3 * (linears + head)
    assert out["step_s"]["n"] == 2 and out["tokens_per_s"] == pytest.approx(3 / out["step_s"]["median"])
    # the ceiling is the faster library's
    assert out["tokens_per_s"] == pytest.approx(max(out["by_library"].values()))
    assert out["by_library"][out["library"]] == pytest.approx(out["tokens_per_s"])


def test_the_decode_ceiling_adds_the_kv_read_at_the_copy_bandwidth_to_the_products():

    # 1,000 tokens/s of products = 1 ms per token; 10 positions x 1e6 bytes over 100 tokens at 1 GB/s = 0.1 ms
    d = {
        "products": {"tokens_per_s": 1000.0},
        "traffic": {"kv_bytes_per_position": 1e6, "kv_positions_read": 10, "tokens": 100},
    }
    assert decode_ceiling(d, 1.0) == pytest.approx(1 / (1e-3 + 1e-4))


def test_the_baseline_table_gives_where_the_two_codes_samples_part(quick):
    from performance_report import _baseline_table

    rows = [{"iteration": i, "tokens/generated": 100, "loss/policy": 1e-3} for i in range(1, 6)]
    other = [dict(r) for r in rows]
    other[1]["loss/policy"] = 1e-3 + 2e-9
    other[3]["tokens/generated"] = 99
    agree = compare_rows(rows, other)
    base = {"commit": "abc", "old": [{"rows": rows}], "speedup": 1.5, "speedup_iterations": 1.25, "agreement": agree}
    table = _baseline_table({"baseline": base, "runs": {"arith": [{"rows": other}]}})
    assert "| first iteration whose samples differ | 4 |" in table
    assert "| max abs difference of loss/policy before it | 2.0e-09 |" in table
    assert "| median abs loss/policy before it | 1.0e-03 |" in table
    assert "| speed-up, samples/s end to end (median wall times) | 1.50 |" in table
    same = _baseline_table({"baseline": base, "runs": {"arith": [{"rows": rows}]}})
    assert "| first iteration whose samples differ | none |" in same


def test_the_decode_table_gives_the_share_of_row_steps_computed(quick):
    from performance_report import _point_tables

    res, _ = quick
    for p in res["lengths"] + res["sizes"]:
        computed, decoded = p["decode"]["computed_row_steps"]
        assert 0 < computed <= decoded
    p = json.loads(json.dumps(res["lengths"][0]))
    p["decode"].update(bandwidth_share=1.08, computed_row_steps=[300, 1200])
    (row,) = [line for line in _point_tables("a", [p], 100.0) if line.startswith("| length 8 | ") and "GB" not in line][
        1:
    ]
    assert "| 108% | 25% |" in row


def test_the_page_prose_is_its_constant_method_paragraphs(quick):
    """Every line of the page that is not a table row, a heading or a figure is a paragraph written once:
    a run with other numbers has exactly the same prose."""
    res, opts = quick
    other = json.loads(json.dumps(res))
    for p in other["lengths"] + other["sizes"]:
        p["iteration"]["ratio_trl_vs_creditrl"] *= 7
        p["decode"]["ratio_hf_vs_creditrl"] /= 3
    other["options"]["prompts"] = 5

    def prose(r):
        lines = performance_report(r, vars(TARGETS)).splitlines()
        return [line for line in lines if line and not line.startswith(("|", "#", "!["))]

    constant = {*METHOD.values(), *profile_lines({})[2:3], "No targets given."}
    assert set(prose(res)) <= constant and prose(res) == prose(other)
