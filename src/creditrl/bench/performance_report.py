"""``creditrl bench --performance``'s page: the markdown tables of a ``performance.json``
(:mod:`creditrl.bench.performance`), with the flagged points and their explanations of
:mod:`creditrl.bench.perf_flags`; the plots are :mod:`creditrl.bench.perf_plots`'s."""

from __future__ import annotations

from typing import Any

from creditrl.bench.perf_flags import LIBRARY, explanations, point_label, targets
from creditrl.bench.perf_profile import profile_lines
from creditrl.bench.perf_study import compare_rows

STAGES = ("rollout", "reference", "score", "value", "credit", "update")
_MEMORY_STAGES = ("rollout", "reference", "update")
REMEASURED_TITLES = {
    "study": "c (study settings)",
    "rss": "e (peak RSS)",
    "forward": "f (the packed forward)",
    "kl_skip": "f (zero-advantage rows under a KL term)",
    "profile": "g (where the time goes)",
}


def _samples_line(study: dict[str, Any]) -> str:
    """Where the two codes' first runs' samples part, and the rounding their updates differed by until
    then (from the rows each run kept)."""
    b, new = study["baseline"], study["runs"].get("arith", [])
    if not b.get("old") or not new:
        return ""
    same = compare_rows(b["old"][0]["rows"], new[0]["rows"])["samples"]
    if same is None:
        return ""
    first, diff, scale = same["first_differing_iteration"], same["loss_abs_diff_before"], same["loss_scale_before"]
    losses = f"their policy losses within {diff:.1e} of each other (losses of order {scale:.1e})"
    if first is None:
        return f" Every iteration sampled the same tokens, {losses}."
    return (
        f" Both sampled the same tokens up to iteration {first - 1}, {losses}: the float rounding of two "
        f"different forward passes over the same samples. At iteration {first} that rounding tipped a sampled "
        "token, and from there the two runs draw different samples of the same training, so their later "
        f"metrics differ by sampling noise, not by what `{b['commit']}` and this code compute."
    )


def _where(stage: str) -> str:
    return f"in the {stage} stage" if stage in STAGES else stage


def _m(d: dict[str, float], fmt: str = ",.0f") -> str:
    return format(d["median"], fmt)


def _point_tables(section: str, points: list[dict[str, Any]], peak: float) -> list[str]:
    """The iteration table and the decode table of (a) or (b)."""
    head = "generated length" if section == "a" else "model"
    lines = [
        f"| {head} | max new tokens | mean response length: creditrl rollout / TRL / creditrl decode / HF "
        "generate | creditrl iteration s | TRL iteration s | TRL / creditrl | creditrl iteration tokens/s | TRL "
        "tokens/s | creditrl update GFLOP/s (share of peak) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for p in points:
        it, d = p["iteration"], p["decode"]
        trl = "trl_iter_s" in it
        lens = f"{it['creditrl_length']:.0f} / {it['trl_length']:.0f}" if trl else f"{it['creditrl_length']:.0f} / -"
        lines.append(
            f"| {point_label(section, p)} | {p['max_new_tokens']:,} | {lens} / {d['creditrl_length']:.0f} / "
            f"{d['hf_generate_length']:.0f} | {_m(it['creditrl_iter_s'], '.3f')} | "
            f"{_m(it['trl_iter_s'], '.3f') if trl else '-'} | "
            f"{format(it['ratio_trl_vs_creditrl'], '.2f') + 'x' if trl else '-'} | "
            f"{_m(it['creditrl_tokens_per_s'])} | {_m(it['trl_tokens_per_s']) if trl else '-'} | "
            f"{_m(it['update_gflops'], '.1f')} ({100 * it['update_peak_share']:.0f}% of {peak:.0f}) |"
        )
    lines += [
        "",
        f"| {head} | creditrl decode tokens/s | HF generate tokens/s | HF / creditrl (seconds per token) | "
        "bytes per generated token | decode GB/s (share of copy bandwidth) | its products alone: tokens/s "
        "(GFLOP/s) |",
        "|---|---|---|---|---|---|---|",
    ]
    for p in points:
        d = p["decode"]
        ceiling = d.get("products")
        lines.append(
            f"| {point_label(section, p)} | {_m(d['creditrl_tokens_per_s'])} | {_m(d['hf_generate_tokens_per_s'])} | "
            f"{d['ratio_hf_vs_creditrl']:.2f}x | {d['bytes_per_token']:,.0f} | {_m(d['gb_per_s'], '.2f')} "
            f"({100 * d['bandwidth_share']:.0f}%) | "
            + (f"{ceiling['tokens_per_s']:,.0f} ({ceiling['gflops']:.0f}) |" if ceiling else "- |")
        )
    return lines


def _study_lines(study: dict[str, Any]) -> list[str]:
    lines = [
        f"Each run is `python -m creditrl.cli train CONFIG --set train.iterations=N --set train.threads="
        f"{study['threads']} --set train.progress=false` in a subprocess, timed from launch to exit; every "
        "other setting (evaluation every `train.eval_every` iterations, KL, checkpoints) is the config's. Shares "
        "are of the wall time. The metrics rows hold no evaluation time: it is measured from when each row "
        "appeared in metrics.jsonl (an evaluation row's gap beyond its `time/iter_s` and beyond the median gap of "
        "the other rows); *start-up + first evaluation* is the time until row 0 (iteration 0's evaluation) "
        "appeared; *rest* is checkpoints, inspector records, logging and exit.",
        "",
        "| config | code | iterations | samples | wall s | samples/s end to end | samples/s within iterations | "
        + " | ".join(STAGES)
        + " | start-up + first evaluation | later evaluations | rest |",
        "|---|---|---|---|---|---|---|" + "---|" * (len(STAGES) + 3),
    ]
    runs = [(name, "current", r) for name, rs in study["runs"].items() for r in rs]
    if "baseline" in study:
        runs += [("arith", study["baseline"]["commit"], r) for r in study["baseline"]["old"]]
    for name, code, r in runs:
        share = lambda s: f"{100 * s / r['wall_s']:.1f}%"  # noqa: E731
        stages = " | ".join(share(r["stages_s"][k]) if k in r["stages_s"] else "-" for k in STAGES)
        if "until_first_row_s" in r:
            rest = r["outside_iterations_s"] - r["until_first_row_s"] - r["later_evals_s"]
            outside = f"{share(r['until_first_row_s'])} | {share(r['later_evals_s'])} | {share(rest)}"
        elif "eval_s" in r:
            outside = f"- | {share(r['eval_s'])} (time/eval_s) | {share(r['outside_iterations_s'] - r['eval_s'])}"
        else:
            outside = f"- | - | {share(r['outside_iterations_s'])} (all outside the iterations)"
        lines.append(
            f"| {name} | {code} | {r['iterations']} | {r['samples']:,} | {r['wall_s']:.1f} | "
            f"{r['samples_per_s']:.1f} | {r['samples_per_iteration_s']:.1f} | {stages} | {outside} |"
        )
    if "baseline" in study:
        b = study["baseline"]
        agree = b["agreement"]
        fmt = lambda v: "n/a" if v is None else f"{v:.4g}"  # noqa: E731
        lines += [
            "",
            f"arith.yaml on `{b['commit']}` (a `git worktree` of it, the same venv) and on the current code, "
            f"run alternately ({b['commit']}, current, ...), the same seed: the current code runs "
            f"**{b['speedup']:.2f}x** the samples/s of `{b['commit']}` end to end (median wall times), "
            f"{b['speedup_iterations']:.2f}x within the iterations"
            + (
                " (each after one untimed 1-iteration warm-up run: a fresh worktree compiles its numba kernels and "
                "bytecode on first use)"
                if b.get("warmup")
                else " (no warm-up runs: the first run in the fresh worktree compiles its numba kernels)"
            )
            + f". `{b['commit']}`'s rows have no `time/reference_s`: its rollout column includes the reference "
            "model's forward. Metrics rows, first run of each: the largest "
            f"|difference| of eval/accuracy is {fmt(agree['eval/accuracy']['max_abs_diff'])} over "
            f"{agree['eval/accuracy']['compared']} evaluations, of reward/mean "
            f"{fmt(agree['reward/mean']['max_abs_diff'])} over {agree['reward/mean']['compared']} iterations."
            + _samples_line(study),
        ]
        same = b.get("same_code_agreement")
        if same:
            lines[-1] += (
                f" (Two runs of the current code: {fmt(same['eval/accuracy']['max_abs_diff'])} and "
                f"{fmt(same['reward/mean']['max_abs_diff'])}.)"
            )
    return lines


def _libraries(spread: dict[str, Any]) -> str:
    """ ", the faster of torch's (X) and oneDNN's (Y)" for a limit measured by both libraries."""
    by = spread.get("by_library")
    if not by or len(by) < 2:
        return ""
    return ", the faster of " + " and ".join(f"{LIBRARY.get(k, k)} ({v:.0f})" for k, v in by.items())


def _bytes_lines(res: dict[str, Any]) -> list[str]:
    p = max(res["lengths"], key=lambda q: q["length"]) if res["lengths"] else None
    if p is None:
        return []
    t, d = p["decode"]["traffic"], p["decode"]
    rows = len(p["raw"]["decode"]["creditrl"]["lengths"][-1])
    return [
        "",
        f"Bytes per generated token at length {p['length']:,} (section a, the last decode call): per decode step "
        f"the engine reads the weights once, {p['non_embedding_parameters']:,} non-embedding parameters x 4 bytes "
        f"= {t['weights_bytes'] / 1e6:.2f} MB, plus the KV cache of every live row, {p['layers']} layers x 2 x "
        f"{p['kv_heads']} kv heads x {p['head_dim']} x 4 bytes = {t['kv_bytes_per_position']:,} bytes per position "
        f"so far. Over {t['steps']:,} steps and {rows} rows ({t['tokens']:,} generated tokens, "
        f"{t['kv_positions_read']:,} row-positions read): ({t['steps']:,} x {t['weights_bytes']:,} + "
        f"{t['kv_bytes_per_position']:,} x {t['kv_positions_read']:,}) / {t['tokens']:,} = "
        f"**{t['bytes_per_token']:,.0f} bytes per token**. At creditrl's "
        f"{d['creditrl_tokens_per_s']['median']:,.0f} tokens/s that is {d['gb_per_s']['median']:.2f} GB/s, "
        f"{100 * d['bandwidth_share']:.0f}% of the measured copy bandwidth." + _over_bandwidth(p),
    ]


def _over_bandwidth(p: dict[str, Any]) -> str:
    """Why a decode can move more than the copy bandwidth by this count (nothing below 100%)."""
    d = p["decode"]
    if d["bandwidth_share"] <= 1:
        return ""
    computed = d.get("computed_row_steps")  # the engine's last call: (slot-steps computed, row-steps decoded)
    shared = (
        f" (in the last call it computed {100 * computed[0] / computed[1]:.0f}% of the row-steps it decoded)"
        if computed and computed[1]
        else ""
    )
    return (
        " Above 100% means not every byte this count charges came from memory: identical samples share one cache "
        f"slot and one decode step (`share_rows`){shared}, so fewer KV bytes are read than counted, and the "
        f"{d['traffic']['weights_bytes'] / 1e6:.2f} MB of weights can stay in the CPU's caches between steps."
    )


def _exactness_lines(res: dict[str, Any]) -> list[str]:
    """Section f: the packed forward against the HF pass, and the KL row-skipping approximation."""
    lines = ["", "## f. The packed forward, and zero-advantage rows under a KL term", ""]
    if res.get("forward"):
        lines += [
            "The update's and the reference's response forward (`policy.forward`): the packed pass (each distinct "
            "prompt once, only the real response tokens) against the HF modules' pass (`policy.forward=hf`), on "
            "iteration 0's rollout batch of each config, timed interleaved (medians):",
            "",
            "| config | rows | response tokens / padded positions | no gradient: HF / packed | forward + backward: "
            "HF / packed | max abs log-prob difference | gradient relative distance |",
            "|---|---|---|---|---|---|---|",
        ]
        for name, r in res["forward"].items():
            m = r["median_s"]
            lines.append(
                f"| {name} | {r['rows']} | {r['response_tokens']:,} / {r['padded_positions']:,} | "
                f"{m['infer_hf']:.3f} / {m['infer_packed']:.3f} s = **{r['speedup_infer']:.2f}x** | "
                f"{m['train_hf']:.3f} / {m['train_packed']:.3f} s = **{r['speedup_train']:.2f}x** | "
                f"{r['max_abs_logprob_diff']:.1e} | {r['grad_relative_distance']:.1e} |"
            )
    if res.get("kl_skip"):
        k = res["kl_skip"]
        lines += [
            "",
            "With a KL term a row whose advantages are all 0 still has the KL's gradient, so the exact update "
            "trains it (its forward and backward are the only way to that gradient; the packed pass makes them "
            "cost only its real tokens). `optim.skip_zero_advantage_kl=true` leaves such rows out anyway: an "
            "approximation, off by default. What it changes, on arith.yaml's own batches (the update taken twice "
            "on copies of the policy, zero learning rate, no clipping):",
            "",
            "| iteration | rows left out | gradient cosine | relative distance | update s, exact | update s, approx. |",
            "|---|---|---|---|---|---|",
        ]
        for r in k["rows"]:
            lines.append(
                f"| {r['iteration']} | {100 * r['skipped_rows']:.0f}% | {r['cosine']:.4f} | "
                f"{r['relative_distance']:.3f} | {r['update_s_exact']:.3f} | {r['update_s_approx']:.3f} |"
            )
    return lines


def performance_report(res: dict[str, Any]) -> str:
    o, lim = res["options"], res["limits"]
    timed = o["rounds"] * (o["iterations"] - 1)
    policy = {
        "sft": "the chain config's SFT policy (tiny preset, stops at eos)",
        "tiny": "the tiny preset, random init, with the never-sampled eos (every row decodes max new tokens)",
    }.get(o["policy"], f"`{o['policy']}`")
    again = [
        f"- section {REMEASURED_TITLES[k]}: by `{r['command']}` on {r['date']}"
        for k, r in res.get("remeasured", {}).items()
    ]
    lines = [
        *(
            ["Measured again into this run's saved results (the other sections are the run's):", "", *again, ""]
            if again
            else []
        ),
        f"Batch {o['prompts']} prompts x {o['group']} samples at temperature {o['temperature']}, {res['threads']} "
        f"threads, torch {res['torch']}. Every ratio is peer / creditrl median seconds (creditrl's speed-up), "
        "measured in this run with the peers interleaved: creditrl and TRL alternate rounds of "
        f"{o['iterations']} iterations (the first of each dropped as warm-up: {timed} timed iterations each), "
        f"creditrl's StaticEngine and HF generate alternate {o['repeats']} calls each. The GRPO settings are "
        "identical for both trainers: outcome reward, token-mean PPO-clip loss, no KL (TRL beta=0), one optimizer "
        "step per iteration, and creditrl trains every row (`optim.skip_zero_advantage="
        f"{str(o['skip_zero_advantage']).lower()}`) as TRL does. Iteration tokens/s = generated tokens / "
        "iteration seconds. Update GFLOP/s = 6 x non-embedding parameters x the trained positions (every "
        "row's real prompt and response tokens, `tokens/prompt` + `tokens/generated`: padding, which the packed "
        "pass does not compute, is not counted) / update seconds.",
        "",
        "## Targets",
        "",
        *targets(res),
        "",
        "Every missed target is explained, from this run's numbers, under [Flagged points](#flagged-points).",
        "",
        "## a. By generated length",
        "",
        f"The chain task (`creditrl/tasks/chain.py`) at `n = steps_for_tokens(L)` steps, from {policy}, with "
        f"`rollout.max_new_tokens` = L + {o['length_margin']} where the policy can stop.",
        "",
        *_point_tables("a", res["lengths"], lim["peak_gflops"]),
        "",
        "![tokens/s against generated length](performance_length.png)",
        "",
        "## b. By model size",
        "",
        f"Random-init Llamas (`build_tiny` with these shapes) at L = {o['size_length']:,}. Random-init models "
        "sample eos early, so every model's tokenizer is saved with an extra special token appended and set as "
        "its eos: its id is the vocabulary size, outside the model's vocabulary, so no model can ever sample it, "
        f"and both creditrl and the peers decode exactly max new tokens = {o['size_length']:,} on every row.",
        "",
        "| model | hidden x layers x heads, intermediate | parameters | non-embedding |",
        "|---|---|---|---|",
    ]
    for p in res["sizes"]:
        s = p["size"]
        lines.append(
            f"| {s['name']} | {s['hidden_size']} x {s['num_layers']} x {s['num_heads']}, {s['intermediate_size']} | "
            f"{p['parameters']:,} | {p['non_embedding_parameters']:,} |"
        )
    lines += [
        "",
        *_point_tables("b", res["sizes"], lim["peak_gflops"]),
        "",
        "![tokens/s against model size](performance_size.png)",
        "",
        "## c. Study settings",
        "",
        *_study_lines(res["study"]),
        "",
        "## d. Bandwidth and peak",
        "",
        "| limit (this process, before the sections) | best | median |",
        "|---|---|---|",
        f"| copy: `dst.copy_(src)` of {o['copy_mb']} MB fp32, bytes moved = 2 x size (GB/s) | "
        f"{lim['copy']['max']:.2f} | {lim['copy']['median']:.2f} |",
        f"| fp32 {o['matmul_n']}^3 matmul (GFLOP/s){_libraries(lim['matmul'])} | {lim['matmul']['max']:.1f} | "
        f"{lim['matmul']['median']:.1f} |",
        *_bytes_lines(res),
        "",
        "The decode and update columns of sections a and b are against these two (the best of their repeats). "
        "The decode tables' last column is a third limit, measured at each point on the point's own model: one "
        "decode step's matrix products alone (q|k|v, o, gate|up and down of every layer, and the head, for the "
        "batch's rows of one token each, on the model's fp32 weights, 50 steps, median of 5, by torch's `F.linear` "
        "and by oneDNN's linear on weights reordered once, the faster of the two), with no attention, norm, "
        "sampling or framework step. Every engine runs these products on every step, so no fp32 decode on this "
        "machine passes that rate at that row count.",
    ]
    if "rss" in res:
        r = res["rss"]
        spec = r["spec"]
        lines += [
            "",
            "## e. Peak RSS",
            "",
            f"One creditrl iteration on chain.yaml (KL on, so with its reference model) of {spec['prompts']} "
            f"prompts x {spec['group']} samples x {spec['tokens']:,} tokens from a random-init "
            f"{spec['size']['name']} model with the never-sampled eos ({r['response_length']:.0f} tokens per row), "
            f"in a subprocess: peak RSS **{r['peak_rss_mb']:,.0f} MB** (`VmHWM`, that process's own high-water mark), "
            f"{'within' if r['within_target'] else 'over'} the {r['target_mb']:,.0f} MB target; the iteration took "
            f"{r['iter_s']:.1f} s (rollout {r['rollout_s']:.1f} s, update {r['update_s']:.1f} s).",
        ]
        if r.get("stage_peak_mb"):
            peaks = ", ".join(f"{k} {v:,.0f} MB" for k, v in r["stage_peak_mb"].items() if k in _MEMORY_STAGES)
            lines += [
                "",
                f"The largest resident set within each stage (sampled every 20 ms): {peaks}"
                + (f"; the process's peak was reached {_where(r['peak_stage'])}" if "peak_stage" in r else "")
                + ". The rollout holds the "
                "KV cache of every row (prompt + max new tokens positions, in float32); the update holds the "
                "activations of one micro-batch (`optim.micro_batch_positions` padded positions, a group's rows "
                "split where the whole group is wider); the reference pass one chunk of "
                "`optim.inference_positions` positions, without gradients.",
            ]
    lines += _exactness_lines(res)
    if res.get("profile"):
        lines += ["", *profile_lines(res["profile"])]
    lines += ["", "## Flagged points", ""]
    lines += [f"- {f}" for f in res["flags"]] or ["None."]
    lines += explanations(res)
    lines += ["", f"Peak RSS of the bench process: {res['peak_rss_mb']:,.0f} MB."]
    return "\n".join(lines)
