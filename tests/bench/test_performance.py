"""`creditrl bench --performance` at quick sizes: every section is there, the never-sampled eos makes
every row decode max_new_tokens, and the derived numbers follow from the raw ones."""

import json
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from creditrl.bench.hf_peer import hf_generate_throughput
from creditrl.bench.perf_flags import flags
from creditrl.bench.perf_options import BASELINE, CREDITRL_SRC
from creditrl.bench.perf_points import model_geometry
from creditrl.bench.perf_profile import KINDS
from creditrl.bench.perf_study import baseline_worktree
from creditrl.bench.performance import (
    ModelSize,
    PerformanceOptions,
    compare_rows,
    decode_bytes,
    options_from_args,
    quick_options,
    run_performance,
    save_never_eos_model,
    summarise_run,
)
from creditrl.bench.run import update_model_flops
from creditrl.cli import build_parser
from creditrl.policy.engines import SamplingParams, StaticEngine
from creditrl.policy.model import load_policy
from creditrl.policy.tokenizer import encode_prompt
from creditrl.tasks import make_task

SMALL = ModelSize("small", hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("performance")
    # the d760505 comparison (a worktree and two more `creditrl train` subprocesses, the first of them
    # compiling the old tree's numba kernels) is left out to keep this well under a minute
    opts = replace(quick_options(PerformanceOptions()), out=out, results=out / "page.md", baseline=None)
    return run_performance(opts), opts


def test_quick_options_are_quick_and_cover_every_section():
    q = quick_options(PerformanceOptions())
    assert q.policy == "tiny" and q.lengths == (8, 16) and q.repeats == 1 and q.iterations == 2 and q.rounds == 1
    assert set(q.study_iterations.values()) == {3} and q.baseline == BASELINE and q.rss and q.trl
    assert all(o.startswith(("train.", "rollout.", "task.")) for os_ in q.study_overrides.values() for o in os_)
    args = build_parser().parse_args(
        ["bench", "--performance", "--quick", "--no-trl", "--out", "x", "--results", "p.md"]
    )
    opts = options_from_args(args)
    assert args.performance and opts.lengths == (8, 16) and not opts.trl
    assert opts.out == Path("x") and opts.results == Path("p.md")
    full = options_from_args(build_parser().parse_args(["bench", "--performance"]))
    assert full.lengths == (64, 256, 512, 1000) and full.prompts * full.group == 16 and full.policy == "sft"
    assert [s.name for s in full.sizes] == ["tiny", "10M", "50M"] and full.size_length == 256


def test_report_has_every_section_and_the_page_its_header(quick):
    res, opts = quick
    saved = json.loads((opts.out / "performance.json").read_text())
    assert {"limits", "lengths", "sizes", "study", "rss", "forward", "kl_skip", "profile", "flags"} <= set(saved)
    page = opts.results.read_text()
    assert json.loads(opts.results.with_suffix(".json").read_text()) == saved  # the run beside its page
    assert page.startswith("# Performance") and "Written by `" in page and "machine:" in page
    for heading in ("## a. By generated length", "## b. By model size", "## c. Study settings"):
        assert heading in page
    for heading in ("## d. Bandwidth and peak", "## e. Peak RSS", "## f. The packed forward", "## Flagged points"):
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
    assert 0 < res["rss"]["peak_rss_mb"] < res["rss"]["target_mb"] and res["rss"]["response_length"] == 32
    # every flag is printed, one per line
    assert all(f"- {f}" in page for f in res["flags"])


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
    assert res["flags"] == flags(res)


def test_update_model_flops_count_real_tokens_of_the_trained_rows():
    row = {"tokens/prompt": 40, "tokens/generated": 60, "tokens/padded": 160}
    assert update_model_flops(1_000, row) == 6 * 1_000 * 100
    assert update_model_flops(1_000, {**row, "update/skipped_rows": 0.25}) == 6 * 1_000 * 100 * 0.75


def test_flags_name_each_point_below_a_threshold(quick):
    res, _ = quick
    fast = json.loads(json.dumps(res))
    for p in fast["lengths"] + fast["sizes"]:
        p["iteration"].update(ratio_trl_vs_creditrl=5.0, update_peak_share=0.9)
        p["decode"].update(ratio_hf_vs_creditrl=5.0, bandwidth_share=0.9)
    assert flags(fast) == []
    p = fast["sizes"][1]
    p["iteration"]["ratio_trl_vs_creditrl"] = 2.5
    p["decode"]["bandwidth_share"] = 0.25
    assert [f.split(":")[0] for f in flags(fast)] == ["b. size 0.3M"] * 2
    assert "2.50x TRL" in flags(fast)[0] and "25% of the" in flags(fast)[1]


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


def test_baseline_worktree_is_the_old_commit_and_is_removed():
    with baseline_worktree(BASELINE) as tree:
        assert (tree / "src/creditrl/cli.py").exists()  # d760505's command line was one module
        assert (tree / "src/creditrl/configs/arith.yaml").exists()
        head = subprocess.run(["git", "-C", str(tree), "rev-parse", "HEAD"], capture_output=True, text=True).stdout
        assert head.startswith(BASELINE)
    assert not tree.exists()
    listed = subprocess.run(["git", "-C", str(CREDITRL_SRC), "worktree", "list"], capture_output=True, text=True)
    assert str(tree) not in listed.stdout


def test_a_policy_that_can_stop_gets_the_length_margin(tmp_path):
    """The SFT path of section a, with a stand-in: a plain random-init model (its eos is in the vocabulary)."""
    from creditrl.bench.perf_points import measure_point
    from creditrl.policy.model import build_tiny

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


def test_a_saved_run_re_renders_with_its_own_command_and_the_explanations(quick, tmp_path):
    from creditrl.bench.perf_flags import _attention_share, prompt_length
    from creditrl.bench.performance import render_saved

    res, opts = quick
    page = tmp_path / "again.md"
    render_saved(opts.out / "performance.json", page)
    text = page.read_text()
    assert f"Written by `{res['command']}`" in text  # the measuring command, not the re-render's
    assert "### What explains them" in text and "## f. The packed forward" in text
    assert (tmp_path / "again_length.png").exists() and (tmp_path / "again_size.png").exists()
    p = res["lengths"][0]
    rows = opts.prompts * opts.group
    att, lin = _attention_share(p, rows)
    t, n = p["iteration"]["creditrl_length"], prompt_length(p)
    # causal: response query i sees the n prompt keys and i + 1 response keys
    keys = sum(n + i + 1 for i in range(int(t))) if t == int(t) else t * n + t * (t + 1) / 2
    assert att == pytest.approx(3 * p["layers"] * 4 * rows * p["kv_heads"] * p["head_dim"] * keys)
    assert lin == pytest.approx(6 * p["non_embedding_parameters"] * rows * (t + n))


def test_the_prompt_length_follows_from_the_kv_positions_a_decode_read():
    from creditrl.bench.perf_flags import prompt_length
    from creditrl.bench.perf_points import decode_bytes

    geometry = {"non_embedding_parameters": 10, "layers": 2, "kv_heads": 2, "head_dim": 4}
    lengths = [5, 3, 7, 7]
    traffic = decode_bytes(geometry, [8, 8, 8, 8], lengths)
    p = {"decode": {"traffic": traffic}, "raw": {"decode": {"creditrl": {"lengths": [[1], lengths]}}}}
    assert prompt_length(p) == pytest.approx(8.0)
    traffic = decode_bytes(geometry, [4, 4, 10, 10], lengths)  # the generated-token-weighted mean
    p["decode"]["traffic"] = traffic
    assert prompt_length(p) == pytest.approx((5 * 4 + 3 * 4 + 7 * 10 + 7 * 10) / 22)


def test_the_iteration_explanation_says_what_rollout_would_close_each_point_or_that_none_would():
    from creditrl.bench.perf_flags import _iteration_explanation

    def point(length, trl, update, rollout):
        it = {
            "trl_iter_s": {"median": trl},
            "creditrl_update_s": {"median": update},
            "creditrl_rollout_s": {"median": rollout},
            "ratio_trl_vs_creditrl": trl / (update + rollout),
        }
        return {"length": length, "iteration": it}

    res = {"lengths": [point(64, 3.0, 0.5, 1.0), point(256, 3.0, 1.5, 0.5), point(512, 9.0, 1.0, 1.0)], "sizes": []}
    (text,) = _iteration_explanation(res)
    assert "close it at length 64 (a rollout of at most 0.500 s, now 1.000 s)." in text
    assert "At length 256 (2.00x) not even a rollout of zero seconds would" in text
    assert "length 512" not in text  # 4.5x: not flagged
    res["lengths"] = res["lengths"][2:]
    assert _iteration_explanation(res) == []


def test_a_re_render_keeps_the_date_of_the_measurement(quick, tmp_path):
    from creditrl.bench.performance import render_saved

    res, opts = quick
    saved = json.loads((opts.out / "performance.json").read_text())
    saved["date"] = "2001-02-03 04:05 UTC"
    (tmp_path / "performance.json").write_text(json.dumps(saved))
    for name in ("performance_length.png", "performance_size.png"):
        (tmp_path / name).write_bytes((opts.out / name).read_bytes())
    render_saved(tmp_path / "performance.json", tmp_path / "p.md")
    assert f"Written by `{res['command']}` on 2001-02-03 04:05 UTC;" in (tmp_path / "p.md").read_text()


def test_a_section_measured_again_goes_into_the_saved_run_and_is_named(quick, tmp_path):
    from creditrl.bench.performance import remeasure

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
    assert "\n- section e (peak RSS): by `" in page and "largest resident set within each stage" in page
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
    from creditrl.bench.perf_rss import RssSampler

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


def test_the_decode_products_ceiling_counts_every_product_and_explains_the_decode(quick):
    from creditrl.bench.perf_flags import _decode_explanation, decode_ceiling

    res, opts = quick
    rows = opts.prompts * opts.group
    for p in res["lengths"] + res["sizes"]:
        c = p["decode"]["products"]
        assert c["rows"] == rows and c["flops_per_step"] % (2 * rows) == 0
        assert c["tokens_per_s"] == pytest.approx(rows / c["step_s"]["median"])
        assert c["gflops"] == pytest.approx(c["flops_per_step"] / c["step_s"]["min"] / 1e9)
    fast = json.loads(json.dumps(res))
    p = fast["sizes"][0]
    for q in fast["lengths"] + fast["sizes"]:
        q["decode"]["ratio_hf_vs_creditrl"] = 5.0
    assert _decode_explanation(fast) == []
    ceiling = decode_ceiling(p["decode"], fast["limits"]["copy_gbs"])
    assert ceiling < p["decode"]["products"]["tokens_per_s"]  # the KV read adds to the products' time
    p["decode"].update(ratio_hf_vs_creditrl=1.5)
    p["decode"]["hf_generate_tokens_per_s"]["median"] = ceiling / 2  # 3x HF = 1.5x the ceiling
    p["decode"]["creditrl_tokens_per_s"]["median"] = ceiling * 0.75
    text = _decode_explanation(fast)[0]
    assert f"{1.5 * ceiling:,.0f} tokens/s, above it" in text and "75% of that, HF generate 50%" in text
    assert f"the ceiling is {ceiling:,.0f} tokens/s" in text and "out of reach" in text
    p["decode"]["hf_generate_tokens_per_s"]["median"] = ceiling / 4  # 3x HF = 0.75x the ceiling
    assert "below it" in _decode_explanation(fast)[0] and "within reach" in _decode_explanation(fast)[0]
    q = fast["sizes"][1]  # one point of each kind: each gets its own verdict
    q["decode"].update(ratio_hf_vs_creditrl=1.2)
    q["decode"]["hf_generate_tokens_per_s"]["median"] = q["decode"]["products"]["tokens_per_s"]
    both = _decode_explanation(fast)
    assert len(both) == 2 and "out of reach" in both[0] and "0.3M" in both[0] and "0.1M" in both[1]


def test_the_study_floor_is_the_model_flops_of_an_iteration_at_the_peak(quick):
    from creditrl.bench.perf_flags import _study_floor

    res, _ = quick
    n = res["lengths"][0]["non_embedding_parameters"]
    base = {"commit": "abc", "old": [{"samples": 1280, "iterations": 10, "samples_per_iteration_s": 128.0}] * 3}
    text = _study_floor(res, base, {"response_tokens": 5000})
    peak = res["limits"]["peak_gflops"]
    assert "means 0.50 s per iteration" in text  # half of 1 s: twice the samples/s
    assert f"{10 * n * 5000 / 1e9:.1f} GFLOP for 5,000 tokens" in text
    assert f"take {10 * n * 5000 / peak / 1e9:.2f} s" in text
    assert _study_floor(res, {"commit": "abc"}, {"response_tokens": 5000}) == ""


def test_decode_products_count_every_linear_weight_of_a_step():
    from creditrl.bench.perf_points import decode_products
    from creditrl.policy.model import build_tiny

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
    from creditrl.bench.perf_flags import decode_ceiling

    # 1,000 tokens/s of products = 1 ms per token; 10 positions x 1e6 bytes over 100 tokens at 1 GB/s = 0.1 ms
    d = {
        "products": {"tokens_per_s": 1000.0},
        "traffic": {"kv_bytes_per_position": 1e6, "kv_positions_read": 10, "tokens": 100},
    }
    assert decode_ceiling(d, 1.0) == pytest.approx(1 / (1e-3 + 1e-4))


def test_the_page_says_where_the_two_codes_samples_part():
    from creditrl.bench.performance_report import _samples_line

    rows = [{"iteration": i, "tokens/generated": 100, "loss/policy": 1e-3} for i in range(1, 6)]
    other = [dict(r) for r in rows]
    other[1]["loss/policy"] = 1e-3 + 2e-9
    other[3]["tokens/generated"] = 99
    study = {"baseline": {"commit": "abc", "old": [{"rows": rows}]}, "runs": {"arith": [{"rows": other}]}}
    line = _samples_line(study)
    assert "same tokens up to iteration 3, their policy losses within 2.0e-09 of each other" in line
    assert "(losses of order 1.0e-03)" in line and "At iteration 4 that rounding tipped" in line
    study["runs"]["arith"] = [{"rows": rows}]
    assert _samples_line(study).startswith(" Every iteration sampled the same tokens")
    study["runs"]["arith"] = [{"rows": [{"iteration": 1, "reward/mean": 0.5}]}]  # rows without token counts
    assert _samples_line(study) == ""


def test_a_decode_over_the_copy_bandwidth_says_why_and_the_rows_it_computed(quick):
    from creditrl.bench.performance_report import _over_bandwidth

    res, _ = quick
    for p in res["lengths"] + res["sizes"]:
        computed, decoded = p["decode"]["computed_row_steps"]
        assert 0 < computed <= decoded
    p = json.loads(json.dumps(res["lengths"][0]))
    p["decode"]["bandwidth_share"] = 0.99
    assert _over_bandwidth(p) == ""
    p["decode"].update(bandwidth_share=1.08, computed_row_steps=[300, 1200])
    text = _over_bandwidth(p)
    assert "Above 100%" in text and "it computed 25% of the row-steps it decoded" in text
    assert f"{p['decode']['traffic']['weights_bytes'] / 1e6:.2f} MB of weights" in text


def test_the_targets_table_splits_each_target_into_the_points_that_meet_it_and_those_that_miss(quick):
    import copy

    from creditrl.bench.perf_flags import targets

    res = copy.deepcopy(quick[0])
    a, b = res["lengths"]
    a["iteration"]["ratio_trl_vs_creditrl"], b["iteration"]["ratio_trl_vs_creditrl"] = 3.5, 2.0
    for p in res["sizes"]:
        p["iteration"]["ratio_trl_vs_creditrl"] = 3.0  # exactly the target: met
    b["decode"]["bandwidth_share"] = 0.25
    res["study"]["baseline"] = {"commit": "abc", "speedup": 1.04}
    rows = targets(res)
    assert rows[:2] == ["| target | this run |", "|---|---|"] and len(rows) == 2 + 6
    assert rows[2] == (
        "| GRPO iteration >= 3x TRL's, at every length and size | met at length 8 (3.50x), size 0.1M (3.00x), "
        "size 0.3M (3.00x); **missed** at length 16 (2.00x) |"
    )
    assert rows[4] == "| decode at the longest length >= 50% of the copy bandwidth | **missed** at length 16 (25%) |"
    assert rows[6] == "| study settings (arith.yaml) >= 2x `abc`'s samples/s end to end | **missed**: 1.04x |"
    assert rows[7].startswith("| peak RSS <= 4,096 MB, 4 samples x 32 tokens at 0.1M | **met**: ")
    b["decode"]["bandwidth_share"] = 0.6
    assert targets(res)[4].endswith("| **met**: length 16 (60%) |")
    assert "## Targets" in quick[1].results.read_text()
