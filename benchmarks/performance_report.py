"""``benchmarks/performance.py``'s page: the numeric tables of a ``performance.json``, the targets
given as arguments and the bounds of ``perf_targets.py``; each section's method is a paragraph written
once (:data:`METHOD`), every number is a table cell. The plots are ``perf_plots.py``'s."""

from __future__ import annotations

from collections.abc import Callable
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


Column = tuple[str, Callable[[Any], str]]


def _columns(items: list[Any], columns: list[Column]) -> list[str]:
    """A table with one row per item and one column per (header, the item's cell)."""
    return _table([h for h, _ in columns], [[cell(x) for _, cell in columns] for x in items])


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


def _trl(it: dict[str, Any], key: str, fmt: str) -> str:
    return _m(it[key], fmt) if "trl_iter_s" in it else "-"


def _point_tables(section: str, points: list[dict[str, Any]], peak: float) -> list[str]:
    """The iteration table and the decode table of (a) or (b)."""
    label: Column = ("generated length" if section == "a" else "model", lambda p: point_label(section, p))
    it = lambda p: p["iteration"]  # noqa: E731
    iteration = _columns(
        points,
        [
            label,
            ("max new tokens", lambda p: f"{p['max_new_tokens']:,}"),
            ("mean length: creditrl rollout", lambda p: f"{it(p)['creditrl_length']:.0f}"),
            ("TRL", lambda p: f"{it(p)['trl_length']:.0f}" if "trl_iter_s" in it(p) else "-"),
            ("creditrl decode", lambda p: f"{p['decode']['creditrl_length']:.0f}"),
            ("HF generate", lambda p: f"{p['decode']['hf_generate_length']:.0f}"),
            ("creditrl iteration s", lambda p: _m(it(p)["creditrl_iter_s"], ".3f")),
            ("TRL iteration s", lambda p: _trl(it(p), "trl_iter_s", ".3f")),
            ("TRL / creditrl", lambda p: _f(it(p).get("ratio_trl_vs_creditrl"), ".2f")),
            ("creditrl iteration tokens/s", lambda p: _m(it(p)["creditrl_tokens_per_s"])),
            ("TRL tokens/s", lambda p: _trl(it(p), "trl_tokens_per_s", ",.0f")),
            ("update GFLOP/s", lambda p: _m(it(p)["update_gflops"], ".1f")),
            (f"share of the {peak:.0f} GFLOP/s peak", lambda p: _pct(it(p)["update_peak_share"])),
        ],
    )
    d = lambda p: p["decode"]  # noqa: E731
    c = lambda p, k, fmt: format(d(p)["products"][k], fmt) if d(p).get("products") else "-"  # noqa: E731
    steps = lambda p: d(p).get("computed_row_steps") or [0, 0]  # noqa: E731
    decode = _columns(
        points,
        [
            label,
            ("creditrl decode tokens/s", lambda p: _m(d(p)["creditrl_tokens_per_s"])),
            ("HF generate tokens/s", lambda p: _m(d(p)["hf_generate_tokens_per_s"])),
            ("HF / creditrl", lambda p: f"{d(p)['ratio_hf_vs_creditrl']:.2f}"),
            ("bytes per generated token", lambda p: f"{d(p)['bytes_per_token']:,.0f}"),
            ("decode GB/s", lambda p: _m(d(p)["gb_per_s"], ".2f")),
            ("share of copy bandwidth", lambda p: _pct(d(p)["bandwidth_share"])),
            ("row-steps computed", lambda p: _pct(steps(p)[0] / steps(p)[1]) if steps(p)[1] else "-"),
            ("products alone tokens/s", lambda p: c(p, "tokens_per_s", ",.0f")),
            ("products alone GFLOP/s", lambda p: c(p, "gflops", ".0f")),
        ],
    )
    return [*iteration, "", *decode]


def bounds_lines(res: dict[str, Any], targets: dict[str, float | None]) -> list[str]:
    lines = [
        METHOD["bounds"],
        "",
        *_columns(
            iteration_bounds(res, targets),
            [
                ("point", lambda r: r["point"]),
                ("rollout s", lambda r: f"{r['rollout_s']:.3f}"),
                ("update s", lambda r: f"{r['update_s']:.3f}"),
                ("update share", lambda r: _pct(r["update_share"])),
                ("TRL / creditrl at a zero-second rollout", lambda r: _f(r["zero_rollout_ratio"], ".2f")),
                ("rollout allowed s", lambda r: _f(r["rollout_allowed_s"], ".3f")),
                ("attention GFLOP", lambda r: f"{r['attention_gflop']:.1f}"),
                ("6 N GFLOP", lambda r: f"{r['linear_gflop']:.1f}"),
                ("update share of peak, attention counted", lambda r: _pct(r["peak_share_with_attention"])),
            ],
        ),
    ]
    dec = decode_bounds(res, targets)
    if dec:
        libs = lambda r: ", ".join(f"{LIBRARY.get(k, k)} {v:,.0f}" for k, v in r["by_library"].items()) or "-"  # noqa: E731
        lines += [
            "",
            METHOD["decode_bounds"],
            "",
            *_columns(
                dec,
                [
                    ("point", lambda r: r["point"]),
                    ("products alone tokens/s", lambda r: f"{r['products_tokens_per_s']:,.0f}"),
                    ("by library", libs),
                    ("ceiling tokens/s", lambda r: f"{r['ceiling_tokens_per_s']:,.0f}"),
                    ("creditrl / ceiling", lambda r: _pct(r["creditrl_share"])),
                    ("HF generate / ceiling", lambda r: _pct(r["hf_share"])),
                    ("target tokens/s", lambda r: _f(r["target_tokens_per_s"], ",.0f")),
                    ("target / ceiling", lambda r: _pct(r["target_share"])),
                ],
            ),
        ]
    return lines


def _outside(r: dict[str, Any]) -> list[float | None]:
    """A study run's seconds outside the iterations: start-up + first evaluation, later evaluations, rest."""
    if "until_first_row_s" in r:
        rest = r["outside_iterations_s"] - r["until_first_row_s"] - r["later_evals_s"]
        return [r["until_first_row_s"], r["later_evals_s"], rest]
    if "eval_s" in r:
        return [None, r["eval_s"], r["outside_iterations_s"] - r["eval_s"]]
    return [None, None, r["outside_iterations_s"]]


def _study_lines(study: dict[str, Any]) -> list[str]:
    runs = [(name, "current", r) for name, rs in study["runs"].items() for r in rs]
    if "baseline" in study:
        runs += [("arith", study["baseline"]["commit"], r) for r in study["baseline"]["old"]]
    share = lambda s, r: "-" if s is None else f"{100 * s / r['wall_s']:.1f}%"  # noqa: E731
    stage = lambda k: (k, lambda x: share(x[2]["stages_s"].get(k), x[2]))  # noqa: E731
    outside = lambda i, h: (h, lambda x: share(_outside(x[2])[i], x[2]))  # noqa: E731
    lines = [
        METHOD["c"],
        "",
        *_columns(
            runs,
            [
                ("config", lambda x: x[0]),
                ("code", lambda x: x[1]),
                ("iterations", lambda x: f"{x[2]['iterations']}"),
                ("samples", lambda x: f"{x[2]['samples']:,}"),
                ("wall s", lambda x: f"{x[2]['wall_s']:.1f}"),
                ("samples/s end to end", lambda x: f"{x[2]['samples_per_s']:.1f}"),
                ("samples/s within iterations", lambda x: f"{x[2]['samples_per_iteration_s']:.1f}"),
                *(stage(k) for k in STAGES),
                *(outside(i, h) for i, h in enumerate(("start-up + first evaluation", "later evaluations", "rest"))),
            ],
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
    by = ", ".join(f"{LIBRARY.get(k, k)} {v:.0f}" for k, v in lim["matmul"].get("by_library", {}).items()) or "-"
    rows = [
        ["copy (GB/s)", f"{o['copy_mb']} MB", f"{lim['copy']['max']:.2f}", f"{lim['copy']['median']:.2f}", "-"],
        [
            "fp32 matmul (GFLOP/s)",
            f"n = {o['matmul_n']}",
            f"{lim['matmul']['max']:.1f}",
            f"{lim['matmul']['median']:.1f}",
            by,
        ],
    ]
    lines = [METHOD["d"], "", *_table(["limit", "size", "best", "median", "best by library"], rows)]
    if res["lengths"]:
        p = max(res["lengths"], key=lambda q: q["length"])
        t = {**p["decode"]["traffic"], "rows": len(p["raw"]["decode"]["creditrl"]["lengths"][-1])}
        lines += [
            "",
            *_columns(
                [p],
                [
                    ("length", lambda p: f"{p['length']:,}"),
                    ("non-embedding parameters", lambda p: f"{p['non_embedding_parameters']:,}"),
                    ("weight bytes", lambda _: f"{t['weights_bytes']:,}"),
                    ("layers", lambda p: f"{p['layers']}"),
                    ("kv heads", lambda p: f"{p['kv_heads']}"),
                    ("head dim", lambda p: f"{p['head_dim']}"),
                    ("KV bytes per position", lambda _: f"{t['kv_bytes_per_position']:,}"),
                    ("steps", lambda _: f"{t['steps']:,}"),
                    ("rows", lambda _: f"{t['rows']}"),
                    ("generated tokens", lambda _: f"{t['tokens']:,}"),
                    ("row-positions read", lambda _: f"{t['kv_positions_read']:,}"),
                    ("bytes per token", lambda _: f"{t['bytes_per_token']:,.0f}"),
                ],
            ),
        ]
    return lines


def rss_lines(r: dict[str, Any]) -> list[str]:
    spec, peaks = r["spec"], r.get("stage_peak_mb", {})
    stage = lambda k: (f"{k} MB", lambda _: _f(peaks.get(k), ",.0f"))  # noqa: E731
    columns: list[Column] = [
        ("model", lambda _: spec["size"]["name"]),
        ("prompts x samples x max tokens", lambda _: f"{spec['prompts']} x {spec['group']} x {spec['tokens']:,}"),
        ("mean response length", lambda r: f"{r['response_length']:.0f}"),
        ("peak RSS MB", lambda r: f"{r['peak_rss_mb']:,.0f}"),
        *(stage(k) for k in _MEMORY_STAGES),
        ("stage of the peak", lambda r: r.get("peak_stage", "-")),
        ("iteration s", lambda r: f"{r['iter_s']:.1f}"),
        ("rollout s", lambda r: f"{r['rollout_s']:.1f}"),
        ("update s", lambda r: f"{r['update_s']:.1f}"),
    ]
    return [METHOD["e"], "", *_columns([r], columns)]


def _exactness_lines(res: dict[str, Any]) -> list[str]:
    """Section f: the packed forward against the HF pass, and the KL row-skipping approximation."""
    lines = ["", "## f. The packed forward, and zero-advantage rows under a KL term", ""]
    if res.get("forward"):
        m = lambda x, k: f"{x[1]['median_s'][k]:.3f}"  # noqa: E731
        columns: list[Column] = [
            ("config", lambda x: x[0]),
            ("rows", lambda x: f"{x[1]['rows']}"),
            ("response tokens", lambda x: f"{x[1]['response_tokens']:,}"),
            ("padded positions", lambda x: f"{x[1]['padded_positions']:,}"),
            ("no gradient: HF s", lambda x: m(x, "infer_hf")),
            ("packed s", lambda x: m(x, "infer_packed")),
            ("HF / packed", lambda x: f"{x[1]['speedup_infer']:.2f}"),
            ("forward + backward: HF s", lambda x: m(x, "train_hf")),
            ("packed s", lambda x: m(x, "train_packed")),
            ("HF / packed", lambda x: f"{x[1]['speedup_train']:.2f}"),
            ("max abs log-prob difference", lambda x: f"{x[1]['max_abs_logprob_diff']:.1e}"),
            ("gradient relative distance", lambda x: f"{x[1]['grad_relative_distance']:.1e}"),
        ]
        lines += [METHOD["forward"], "", *_columns(list(res["forward"].items()), columns)]
    if res.get("kl_skip"):
        columns = [
            ("iteration", lambda r: f"{r['iteration']}"),
            ("rows left out", lambda r: _pct(r["skipped_rows"])),
            ("gradient cosine", lambda r: f"{r['cosine']:.4f}"),
            ("relative distance", lambda r: f"{r['relative_distance']:.3f}"),
            ("update s, exact", lambda r: f"{r['update_s_exact']:.3f}"),
            ("update s, approx.", lambda r: f"{r['update_s_approx']:.3f}"),
        ]
        lines += ["", METHOD["kl_skip"], "", *_columns(res["kl_skip"]["rows"], columns)]
    return lines


def _size_table(points: list[dict[str, Any]]) -> list[str]:
    size = lambda k: lambda p: f"{p['size'][k]}"  # noqa: E731
    columns: list[Column] = [
        ("model", size("name")),
        ("hidden", size("hidden_size")),
        ("layers", size("num_layers")),
        ("heads", size("num_heads")),
        ("intermediate", size("intermediate_size")),
        ("parameters", lambda p: f"{p['parameters']:,}"),
        ("non-embedding", lambda p: f"{p['non_embedding_parameters']:,}"),
    ]
    return _columns(points, columns)


def _budget_lines(budget: list[dict[str, Any]]) -> list[str]:
    """Section g's verdict on the update's peak-share target (:func:`perf_targets.update_budget_rows`)."""
    if not budget:
        return []
    s = lambda k: lambda r: f"{r[k]:.3f}"  # noqa: E731
    columns: list[Column] = [
        ("point", lambda r: r["point"]),
        ("update s", s("update_s")),
        ("allowed s", s("allowed_s")),
        ("products s", s("products_s")),
        ("products GFLOP/s", lambda r: f"{r['products_gflops']:.0f}"),
        ("products share of peak", lambda r: _pct(r["products_peak_share"])),
        ("attention s", s("attention_s")),
        ("left s", s("left_s")),
        ("other ops and Python now s", s("other_now_s")),
    ]
    return ["", METHOD["budget"], "", *_columns(budget, columns)]


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
        *_size_table(res["sizes"]),
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
        lines += _budget_lines(update_budget_rows(res, targets))
    return "\n".join(lines)
