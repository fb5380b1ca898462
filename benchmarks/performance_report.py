"""``benchmarks/performance.py``'s page: the numeric tables of a ``performance.json``, the targets
given as arguments and the bounds of ``perf_targets.py``; each section's method is a paragraph written
once (:data:`METHOD`), every number is a table cell. The plots are ``perf_plots.py``'s."""

from __future__ import annotations

from typing import Any

from perf_profile import profile_lines
from perf_study import compare_rows
from perf_targets import (
    decode_bounds,
    iteration_bounds,
    point_label,
    study_budget,
    target_rows,
    update_budget_rows,
)

STAGES = ("rollout", "reference", "score", "value", "credit", "update")
_MEMORY_STAGES = ("rollout", "reference", "update")
LIBRARY = {"torch": "torch", "onednn": "oneDNN"}  # the products' libraries, as the page names them

METHOD = {
    "top": "Every ratio is peer / creditrl median seconds (creditrl's speed-up), measured in one run with the peers "
    "interleaved: creditrl and TRL alternate rounds of iterations (the first of each round dropped as warm-up), "
    "creditrl's StaticEngine and HF generate alternate decode calls. Both trainers run the same GRPO settings: "
    "outcome reward, token-mean PPO-clip loss, no KL (TRL beta=0), one optimizer step per iteration, every row "
    "trained. Iteration tokens/s = generated tokens / iteration seconds; update GFLOP/s = 6 x non-embedding "
    "parameters x the trained rows' real prompt and response tokens (padding not counted) / update seconds. A "
    "target is an argument of the command; the bounds say what would close a gap (an empty cell: not applicable).",
    "a": "The chain task at `n = steps_for_tokens(L)` steps (a band of chain lengths around it), with "
    "`rollout.max_new_tokens` = L + the length margin where the policy can stop.",
    "b": "Random-init Llamas (`build_tiny` with these shapes); each tokenizer's eos is an appended token outside the "
    "model's vocabulary, so every row of both peers decodes exactly the size length.",
    "bounds": "Zero-second rollout: TRL's iteration / creditrl's update alone. Rollout allowed: TRL's iteration / "
    "the speed-up target - creditrl's update (negative: out of reach by the rollout alone). Attention GFLOP: the "
    "update's causal score and value products, 3 x layers x 4 x rows x width x (T P + T (T + 1) / 2); 6 N GFLOP: "
    "6 x non-embedding parameters x rows x (T + P).",
    "decode_bounds": "Products alone: one decode step's matrix products (q|k|v, o, gate|up, down, head) for the "
    "batch's rows on the model's fp32 weights, by the faster of torch's `F.linear` and oneDNN's linear. Ceiling: "
    "1 / (1 / products tokens/s + the KV bytes read per token / copy bandwidth), which no engine passes. Target "
    "tokens/s: the speed-up target x HF generate's (a share of the ceiling over 100%: out of reach).",
    "c": "Each run is `python -m creditrl.cli train CONFIG --set train.iterations=N --set train.threads=THREADS "
    "--set train.progress=false` in a subprocess, timed from launch to exit; every other setting is the config's. "
    "Shares are of the wall time. Evaluation time comes from when each metrics row appeared (an evaluation row's "
    "gap beyond its `time/iter_s` and the other rows' median gap); start-up + first evaluation is the time until "
    "row 0; rest is checkpoints, inspector records, logging and exit. The baseline is a checkout of older code "
    "(`--baseline DIR`), run alternately with the current code on arith.yaml, same seed and interpreter.",
    "study_budget": "Model FLOPs of one arith.yaml iteration: 2 N per sampled and per reference token, 6 N per "
    "trained token. Allowed: the baseline's median iteration (or end-to-end) seconds / the baseline speed-up "
    "target; left: what remains after the model FLOPs at the peak (or, end to end, after this code's time outside "
    "the iterations, per iteration).",
    "d": "Copy: `dst.copy_(src)` of an fp32 buffer, bytes moved = 2 x size. Matmul: an fp32 n^3 product, the "
    "faster library. Bytes per generated token at the longest length (the last decode call): (steps x weight "
    "bytes + KV bytes per position x row-positions read) / generated tokens; above 100% of the copy bandwidth, "
    "identical rows sharing a decode slot and weights held in the CPU's caches read fewer bytes than counted.",
    "e": "One creditrl iteration on chain.yaml (KL on) from a random-init model whose eos no row can sample, in a "
    "subprocess: its own high-water mark (`VmHWM`) and the largest resident set sampled every 20 ms in each stage.",
    "forward": "The update's and the reference's response forward: the packed pass (each distinct prompt once, only "
    "the real response tokens) against the HF modules' pass (`policy.forward=hf`), on iteration 0's rollout batch "
    "of each config, timed interleaved (medians).",
    "kl_skip": "With a KL term, `optim.skip_zero_advantage_kl=true` leaves out rows whose advantages are all 0 (an "
    "approximation, off by default): the update taken exactly and approximately on copies of the policy, zero "
    "learning rate, on arith.yaml's own batches.",
    "budget": "The update seconds the peak-share target allows (the same FLOPs at that share of the peak) against "
    "section g's profiled products and attention; left: what remains for every other op and the Python around "
    "them (negative: the products and attention alone take longer).",
}


def _f(v: Any, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.0f}%"


def _m(d: dict[str, float], fmt: str = ",.0f") -> str:
    return format(d["median"], fmt)


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head), *("| " + " | ".join(r) + " |" for r in rows)]


def settings_lines(res: dict[str, Any]) -> list[str]:
    o = res["options"]
    rows = [
        ["batch (prompts x samples)", f"{o['prompts']} x {o['group']}"],
        ["temperature", f"{o['temperature']}"],
        ["threads", f"{res['threads']}"],
        ["torch", res["torch"]],
        [
            "iteration rounds x iterations (timed per trainer)",
            f"{o['rounds']} x {o['iterations']} ({o['rounds'] * (o['iterations'] - 1)})",
        ],
        ["decode calls per engine and point", f"{o['repeats']}"],
        ["`optim.skip_zero_advantage`", str(o["skip_zero_advantage"]).lower()],
        ["length policy", f"`{o['policy']}`"],
        ["length margin (tokens)", f"{o['length_margin']}"],
        ["size length (tokens)", f"{o['size_length']:,}"],
        ["peak RSS of the bench process (MB)", f"{res['peak_rss_mb']:,.0f}"],
    ]
    return _table(["setting", "value"], rows)


def targets_lines(res: dict[str, Any], targets: dict[str, float | None]) -> list[str]:
    rows = target_rows(res, targets)
    if not rows:
        return ["No targets given."]
    return _table(
        ["target", "threshold", "point", "this run", "met"],
        [
            [r["target"], f"{r['threshold']:,.4g}", r["point"], f"{r['value']:,.4g}", "yes" if r["met"] else "**no**"]
            for r in rows
        ],
    )


def _point_tables(section: str, points: list[dict[str, Any]], peak: float) -> list[str]:
    """The iteration table and the decode table of (a) or (b)."""
    head = "generated length" if section == "a" else "model"
    rows = []
    for p in points:
        it, d = p["iteration"], p["decode"]
        trl = "trl_iter_s" in it
        rows.append(
            [
                point_label(section, p),
                f"{p['max_new_tokens']:,}",
                f"{it['creditrl_length']:.0f}",
                f"{it['trl_length']:.0f}" if trl else "-",
                f"{d['creditrl_length']:.0f}",
                f"{d['hf_generate_length']:.0f}",
                _m(it["creditrl_iter_s"], ".3f"),
                _m(it["trl_iter_s"], ".3f") if trl else "-",
                _f(it.get("ratio_trl_vs_creditrl"), ".2f"),
                _m(it["creditrl_tokens_per_s"]),
                _m(it["trl_tokens_per_s"]) if trl else "-",
                _m(it["update_gflops"], ".1f"),
                _pct(it["update_peak_share"]),
            ]
        )
    lines = _table(
        [
            head,
            "max new tokens",
            "mean length: creditrl rollout",
            "TRL",
            "creditrl decode",
            "HF generate",
            "creditrl iteration s",
            "TRL iteration s",
            "TRL / creditrl",
            "creditrl iteration tokens/s",
            "TRL tokens/s",
            "update GFLOP/s",
            f"share of the {peak:.0f} GFLOP/s peak",
        ],
        rows,
    )
    rows = []
    for p in points:
        d = p["decode"]
        c = d.get("products")
        computed = d.get("computed_row_steps")
        rows.append(
            [
                point_label(section, p),
                _m(d["creditrl_tokens_per_s"]),
                _m(d["hf_generate_tokens_per_s"]),
                f"{d['ratio_hf_vs_creditrl']:.2f}",
                f"{d['bytes_per_token']:,.0f}",
                _m(d["gb_per_s"], ".2f"),
                _pct(d["bandwidth_share"]),
                _pct(computed[0] / computed[1]) if computed and computed[1] else "-",
                f"{c['tokens_per_s']:,.0f}" if c else "-",
                f"{c['gflops']:.0f}" if c else "-",
            ]
        )
    return (
        lines
        + [""]
        + _table(
            [
                head,
                "creditrl decode tokens/s",
                "HF generate tokens/s",
                "HF / creditrl",
                "bytes per generated token",
                "decode GB/s",
                "share of copy bandwidth",
                "row-steps computed",
                "products alone tokens/s",
                "products alone GFLOP/s",
            ],
            rows,
        )
    )


def bounds_lines(res: dict[str, Any], targets: dict[str, float | None]) -> list[str]:
    it = [
        [
            r["point"],
            f"{r['rollout_s']:.3f}",
            f"{r['update_s']:.3f}",
            _pct(r["update_share"]),
            _f(r["zero_rollout_ratio"], ".2f"),
            _f(r["rollout_allowed_s"], ".3f"),
            f"{r['attention_gflop']:.1f}",
            f"{r['linear_gflop']:.1f}",
            _pct(r["peak_share_with_attention"]),
        ]
        for r in iteration_bounds(res, targets)
    ]
    lines = [
        METHOD["bounds"],
        "",
        *_table(
            [
                "point",
                "rollout s",
                "update s",
                "update share",
                "TRL / creditrl at a zero-second rollout",
                "rollout allowed s",
                "attention GFLOP",
                "6 N GFLOP",
                "update share of peak, attention counted",
            ],
            it,
        ),
    ]
    dec = decode_bounds(res, targets)
    if dec:
        rows = [
            [
                r["point"],
                f"{r['products_tokens_per_s']:,.0f}",
                ", ".join(f"{LIBRARY.get(k, k)} {v:,.0f}" for k, v in r["by_library"].items()) or "-",
                f"{r['ceiling_tokens_per_s']:,.0f}",
                _pct(r["creditrl_share"]),
                _pct(r["hf_share"]),
                _f(r["target_tokens_per_s"], ",.0f"),
                _pct(r["target_share"]),
            ]
            for r in dec
        ]
        lines += [
            "",
            METHOD["decode_bounds"],
            "",
            *_table(
                [
                    "point",
                    "products alone tokens/s",
                    "by library",
                    "ceiling tokens/s",
                    "creditrl / ceiling",
                    "HF generate / ceiling",
                    "target tokens/s",
                    "target / ceiling",
                ],
                rows,
            ),
        ]
    return lines


def _study_lines(study: dict[str, Any]) -> list[str]:
    runs = [(name, "current", r) for name, rs in study["runs"].items() for r in rs]
    if "baseline" in study:
        runs += [("arith", study["baseline"]["commit"], r) for r in study["baseline"]["old"]]
    rows = []
    for name, code, r in runs:
        share = lambda s: f"{100 * s / r['wall_s']:.1f}%"  # noqa: E731
        stages = [share(r["stages_s"][k]) if k in r["stages_s"] else "-" for k in STAGES]
        if "until_first_row_s" in r:
            rest = r["outside_iterations_s"] - r["until_first_row_s"] - r["later_evals_s"]
            outside = [share(r["until_first_row_s"]), share(r["later_evals_s"]), share(rest)]
        elif "eval_s" in r:
            outside = ["-", share(r["eval_s"]), share(r["outside_iterations_s"] - r["eval_s"])]
        else:
            outside = ["-", "-", share(r["outside_iterations_s"])]
        rows.append(
            [
                name,
                code,
                f"{r['iterations']}",
                f"{r['samples']:,}",
                f"{r['wall_s']:.1f}",
                f"{r['samples_per_s']:.1f}",
                f"{r['samples_per_iteration_s']:.1f}",
                *stages,
                *outside,
            ]
        )
    lines = [
        METHOD["c"],
        "",
        *_table(
            [
                "config",
                "code",
                "iterations",
                "samples",
                "wall s",
                "samples/s end to end",
                "samples/s within iterations",
                *STAGES,
                "start-up + first evaluation",
                "later evaluations",
                "rest",
            ],
            rows,
        ),
    ]
    if "baseline" in study:
        lines += ["", *_baseline_table(study)]
    return lines


def _baseline_table(study: dict[str, Any]) -> list[str]:
    """The current code against the baseline: speed-ups, and how far their first runs' metrics rows agree."""
    b, new = study["baseline"], study["runs"].get("arith", [])
    agree, same = b["agreement"], b.get("same_code_agreement") or {}
    diff = lambda d, k: "-" if not d or d[k]["max_abs_diff"] is None else f"{d[k]['max_abs_diff']:.4g}"  # noqa: E731
    samples = compare_rows(b["old"][0]["rows"], new[0]["rows"])["samples"] if b.get("old") and new else None
    rows = [
        ["speed-up, samples/s end to end (median wall times)", f"{b['speedup']:.2f}"],
        ["speed-up within the iterations", f"{b['speedup_iterations']:.2f}"],
        ["untimed 1-iteration warm-up runs first", "yes" if b.get("warmup") else "no"],
        [
            f"max abs difference of eval/accuracy ({agree['eval/accuracy']['compared']} evaluations)",
            diff(agree, "eval/accuracy"),
        ],
        [
            f"max abs difference of reward/mean ({agree['reward/mean']['compared']} iterations)",
            diff(agree, "reward/mean"),
        ],
        ["the same, two runs of the current code: eval/accuracy", diff(same, "eval/accuracy")],
        ["the same, two runs of the current code: reward/mean", diff(same, "reward/mean")],
    ]
    if samples:
        first = samples["first_differing_iteration"]
        rows += [
            ["first iteration whose samples differ", "none" if first is None else f"{first}"],
            ["max abs difference of loss/policy before it", f"{samples['loss_abs_diff_before']:.1e}"],
            ["median abs loss/policy before it", f"{samples['loss_scale_before']:.1e}"],
        ]
    return _table(["arith.yaml: current code vs `" + b["commit"] + "`", "value"], rows)


def study_budget_lines(res: dict[str, Any], targets: dict[str, float | None]) -> list[str]:
    s = study_budget(res, targets)
    if s is None:
        return []
    labels = {
        "baseline_iteration_s": f"`{s['baseline']}`'s median iteration s",
        "non_embedding_parameters": "N (non-embedding parameters)",
        "response_tokens": "response tokens of one iteration",
        "model_gflop": "model GFLOP of one iteration",
        "model_s_at_peak": "their s at the matmul peak",
        "allowed_iteration_s": "iteration s the target allows",
        "left_iteration_s": "left for every other op, s",
        "profiled_products_s": "profiled: products s",
        "profiled_products_gflops": "profiled: products GFLOP/s",
        "profiled_attention_s": "profiled: attention s",
        "profiled_other_ops_s": "profiled: other PyTorch ops s",
        "profiled_outside_ops_s": "profiled: outside PyTorch ops s",
        "allowed_wall_s": "end to end: wall s the target allows",
        "outside_iterations_s": "end to end: this code's s outside the iterations",
        "left_per_iteration_s": "end to end: left per iteration, s",
    }
    rows = [
        [label, f"{s[k]:,.0f}" if isinstance(s[k], int) else f"{s[k]:,.3f}"] for k, label in labels.items() if k in s
    ]
    return ["", METHOD["study_budget"], "", *_table(["arith.yaml iteration", "value"], rows)]


def limits_lines(res: dict[str, Any]) -> list[str]:
    o, lim = res["options"], res["limits"]
    by = lim["matmul"].get("by_library", {})
    rows = [
        ["copy (GB/s)", f"{o['copy_mb']} MB", f"{lim['copy']['max']:.2f}", f"{lim['copy']['median']:.2f}", "-"],
        [
            "fp32 matmul (GFLOP/s)",
            f"n = {o['matmul_n']}",
            f"{lim['matmul']['max']:.1f}",
            f"{lim['matmul']['median']:.1f}",
            ", ".join(f"{LIBRARY.get(k, k)} {v:.0f}" for k, v in by.items()) or "-",
        ],
    ]
    lines = [METHOD["d"], "", *_table(["limit", "size", "best", "median", "best by library"], rows)]
    p = max(res["lengths"], key=lambda q: q["length"]) if res["lengths"] else None
    if p is not None:
        t = p["decode"]["traffic"]
        row = [
            f"{p['length']:,}",
            f"{p['non_embedding_parameters']:,}",
            f"{t['weights_bytes']:,}",
            f"{p['layers']}",
            f"{p['kv_heads']}",
            f"{p['head_dim']}",
            f"{t['kv_bytes_per_position']:,}",
            f"{t['steps']:,}",
            f"{len(p['raw']['decode']['creditrl']['lengths'][-1])}",
            f"{t['tokens']:,}",
            f"{t['kv_positions_read']:,}",
            f"{t['bytes_per_token']:,.0f}",
        ]
        lines += [
            "",
            *_table(
                [
                    "length",
                    "non-embedding parameters",
                    "weight bytes",
                    "layers",
                    "kv heads",
                    "head dim",
                    "KV bytes per position",
                    "steps",
                    "rows",
                    "generated tokens",
                    "row-positions read",
                    "bytes per token",
                ],
                [row],
            ),
        ]
    return lines


def rss_lines(r: dict[str, Any]) -> list[str]:
    spec, peaks = r["spec"], r.get("stage_peak_mb", {})
    row = [
        spec["size"]["name"],
        f"{spec['prompts']} x {spec['group']} x {spec['tokens']:,}",
        f"{r['response_length']:.0f}",
        f"{r['peak_rss_mb']:,.0f}",
        *(_f(peaks.get(k), ",.0f") for k in _MEMORY_STAGES),
        r.get("peak_stage", "-"),
        f"{r['iter_s']:.1f}",
        f"{r['rollout_s']:.1f}",
        f"{r['update_s']:.1f}",
    ]
    return [
        METHOD["e"],
        "",
        *_table(
            [
                "model",
                "prompts x samples x max tokens",
                "mean response length",
                "peak RSS MB",
                *(f"{k} MB" for k in _MEMORY_STAGES),
                "stage of the peak",
                "iteration s",
                "rollout s",
                "update s",
            ],
            [row],
        ),
    ]


def _exactness_lines(res: dict[str, Any]) -> list[str]:
    """Section f: the packed forward against the HF pass, and the KL row-skipping approximation."""
    lines = ["", "## f. The packed forward, and zero-advantage rows under a KL term", ""]
    if res.get("forward"):
        rows = []
        for name, r in res["forward"].items():
            m = r["median_s"]
            rows.append(
                [
                    name,
                    f"{r['rows']}",
                    f"{r['response_tokens']:,}",
                    f"{r['padded_positions']:,}",
                    f"{m['infer_hf']:.3f}",
                    f"{m['infer_packed']:.3f}",
                    f"{r['speedup_infer']:.2f}",
                    f"{m['train_hf']:.3f}",
                    f"{m['train_packed']:.3f}",
                    f"{r['speedup_train']:.2f}",
                    f"{r['max_abs_logprob_diff']:.1e}",
                    f"{r['grad_relative_distance']:.1e}",
                ]
            )
        lines += [
            METHOD["forward"],
            "",
            *_table(
                [
                    "config",
                    "rows",
                    "response tokens",
                    "padded positions",
                    "no gradient: HF s",
                    "packed s",
                    "HF / packed",
                    "forward + backward: HF s",
                    "packed s",
                    "HF / packed",
                    "max abs log-prob difference",
                    "gradient relative distance",
                ],
                rows,
            ),
        ]
    if res.get("kl_skip"):
        rows = [
            [
                f"{r['iteration']}",
                _pct(r["skipped_rows"]),
                f"{r['cosine']:.4f}",
                f"{r['relative_distance']:.3f}",
                f"{r['update_s_exact']:.3f}",
                f"{r['update_s_approx']:.3f}",
            ]
            for r in res["kl_skip"]["rows"]
        ]
        lines += [
            "",
            METHOD["kl_skip"],
            "",
            *_table(
                [
                    "iteration",
                    "rows left out",
                    "gradient cosine",
                    "relative distance",
                    "update s, exact",
                    "update s, approx.",
                ],
                rows,
            ),
        ]
    return lines


REMEASURED_TITLES = {
    "study": "c (study settings)",
    "rss": "e (peak RSS)",
    "forward": "f (the packed forward)",
    "kl_skip": "f (zero-advantage rows under a KL term)",
    "profile": "g (where the time goes)",
}


def performance_report(res: dict[str, Any], targets: dict[str, float | None]) -> str:
    """The page of a run (``res``: a ``performance.json``) held to ``targets`` (``perf_options.Targets``
    as a dict; None: not a target)."""
    lim = res["limits"]
    again = [[REMEASURED_TITLES[k], f"`{r['command']}`", r["date"]] for k, r in res.get("remeasured", {}).items()]
    lines = [
        METHOD["top"],
        "",
        *settings_lines(res),
        *(["", *_table(["section measured again into this run", "command", "date"], again)] if again else []),
        "",
        "## Targets",
        "",
        *targets_lines(res, targets),
        "",
        "## a. By generated length",
        "",
        METHOD["a"],
        "",
        *_point_tables("a", res["lengths"], lim["peak_gflops"]),
        "",
        "![tokens/s against generated length](performance_length.png)",
        "",
        "## b. By model size",
        "",
        METHOD["b"],
        "",
        *_table(
            ["model", "hidden", "layers", "heads", "intermediate", "parameters", "non-embedding"],
            [
                [
                    p["size"]["name"],
                    f"{p['size']['hidden_size']}",
                    f"{p['size']['num_layers']}",
                    f"{p['size']['num_heads']}",
                    f"{p['size']['intermediate_size']}",
                    f"{p['parameters']:,}",
                    f"{p['non_embedding_parameters']:,}",
                ]
                for p in res["sizes"]
            ],
        ),
        "",
        *_point_tables("b", res["sizes"], lim["peak_gflops"]),
        "",
        "![tokens/s against model size](performance_size.png)",
        "",
        "## Bounds of sections a and b",
        "",
        *bounds_lines(res, targets),
        "",
        "## c. Study settings",
        "",
        *_study_lines(res["study"]),
        *study_budget_lines(res, targets),
        "",
        "## d. Bandwidth and peak",
        "",
        *limits_lines(res),
    ]
    if "rss" in res:
        lines += ["", "## e. Peak RSS", "", *rss_lines(res["rss"])]
    lines += _exactness_lines(res)
    if res.get("profile"):
        lines += ["", *profile_lines(res["profile"])]
        budget = update_budget_rows(res, targets)
        if budget:
            rows = [
                [
                    r["point"],
                    f"{r['update_s']:.3f}",
                    f"{r['allowed_s']:.3f}",
                    f"{r['products_s']:.3f}",
                    f"{r['products_gflops']:.0f}",
                    _pct(r["products_peak_share"]),
                    f"{r['attention_s']:.3f}",
                    f"{r['left_s']:.3f}",
                    f"{r['other_now_s']:.3f}",
                ]
                for r in budget
            ]
            lines += [
                "",
                METHOD["budget"],
                "",
                *_table(
                    [
                        "point",
                        "update s",
                        "allowed s",
                        "products s",
                        "products GFLOP/s",
                        "products share of peak",
                        "attention s",
                        "left s",
                        "other ops and Python now s",
                    ],
                    rows,
                ),
            ]
    return "\n".join(lines)
