"""``creditrl bench --performance``'s verdicts on a ``performance.json``: the points below a target
(:func:`flags`) and what explains them, from the run's own numbers (:func:`explanations`); the page
(:mod:`creditrl.bench.performance_report`) shows both."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

from creditrl.bench.perf_profile import KINDS, op_kind

# where a point is flagged in the page
MIN_SPEEDUP = 3.0  # creditrl's iteration vs TRL's, and its decode vs HF generate
MIN_BANDWIDTH_SHARE = 0.5  # decode bytes/s against the measured copy bandwidth
MIN_PEAK_SHARE = 0.5  # update model FLOP/s against the matmul peak
LIBRARY = {"torch": "torch", "onednn": "oneDNN"}  # the products' libraries, as the page names them


def point_label(section: str, p: dict[str, Any]) -> str:
    return f"length {p['length']:,}" if section == "a" else f"size {p['size']['name']}"


def flags(res: dict[str, Any]) -> list[str]:
    """One line per point of (a) and (b) where creditrl's iteration is < 3x TRL's, its decode < 3x
    HF generate's, the decode < 50% of the copy bandwidth or the update < 50% of the matmul peak."""
    out = []
    for section, points in (("a", res["lengths"]), ("b", res["sizes"])):
        for p in points:
            where, it, d = point_label(section, p), p["iteration"], p["decode"]
            if "ratio_trl_vs_creditrl" in it and it["ratio_trl_vs_creditrl"] < MIN_SPEEDUP:
                out.append(
                    f"{section}. {where}: creditrl's GRPO iteration is {it['ratio_trl_vs_creditrl']:.2f}x TRL's "
                    f"(< {MIN_SPEEDUP:.0f}x): {it['creditrl_iter_s']['median']:.3f} s vs "
                    f"{it['trl_iter_s']['median']:.3f} s"
                )
            if d["ratio_hf_vs_creditrl"] < MIN_SPEEDUP:
                out.append(
                    f"{section}. {where}: creditrl's decode is {d['ratio_hf_vs_creditrl']:.2f}x HF generate's "
                    f"(< {MIN_SPEEDUP:.0f}x): {d['creditrl_tokens_per_s']['median']:,.0f} vs "
                    f"{d['hf_generate_tokens_per_s']['median']:,.0f} tokens/s"
                )
            if d["bandwidth_share"] < MIN_BANDWIDTH_SHARE:
                out.append(
                    f"{section}. {where}: the decode moves {d['gb_per_s']['median']:.2f} GB/s = "
                    f"{100 * d['bandwidth_share']:.0f}% of the {res['limits']['copy_gbs']:.1f} GB/s copy bandwidth "
                    f"(< {100 * MIN_BANDWIDTH_SHARE:.0f}%; {d['bytes_per_token']:,.0f} bytes per token)"
                )
            if it["update_peak_share"] < MIN_PEAK_SHARE:
                out.append(
                    f"{section}. {where}: the update runs {it['update_gflops']['median']:.1f} GFLOP/s = "
                    f"{100 * it['update_peak_share']:.0f}% of the {res['limits']['peak_gflops']:.0f} GFLOP/s matmul "
                    f"peak (< {100 * MIN_PEAK_SHARE:.0f}%)"
                )
    return out


def prompt_length(p: dict[str, Any]) -> float:
    """A point's mean prompt length, from its last decode call: the KV positions it read are
    ``sum_r g_r p_r + g_r (g_r - 1) / 2`` over rows generating ``g_r`` tokens after ``p_r`` prompt
    tokens (:func:`~creditrl.bench.perf_points.decode_bytes`), so the ``g``-weighted mean of ``p_r``
    follows from the rows' lengths."""
    t = p["decode"]["traffic"]
    lengths = p["raw"]["decode"]["creditrl"]["lengths"][-1]
    return (t["kv_positions_read"] - sum(g * (g - 1) // 2 for g in lengths)) / sum(lengths)


def _attention_share(p: dict[str, Any], rows: int) -> tuple[float, float]:
    """(attention FLOPs, 6 N x positions) of one update at a point of mean response length T and
    prompt length P: the score and value products the causal attention needs -- response query i
    sees P + i + 1 keys, so ``4 x width x (T P + T (T + 1) / 2)`` per row and layer forward, 3x
    with the backward -- next to the projections' and the MLP's 6 N per position."""
    t, n = p["iteration"]["creditrl_length"], prompt_length(p)
    width = p["kv_heads"] * p["head_dim"]  # heads x head_dim: the query width (no grouped-query here)
    attention = 3 * p["layers"] * 4 * rows * width * (t * n + t * (t + 1) / 2)
    linear = 6 * p["non_embedding_parameters"] * rows * (t + n)
    return attention, linear


def _iteration_bound(it: dict[str, Any]) -> str:
    """The iteration ratio creditrl would reach with a rollout of zero seconds: TRL's iteration over
    creditrl's update alone."""
    if "trl_iter_s" not in it:
        return ""
    bound = it["trl_iter_s"]["median"] / it["creditrl_update_s"]["median"]
    return f"; with a rollout of zero seconds the iteration would be {bound:.2f}x TRL's"


def explanations(res: dict[str, Any]) -> list[str]:
    """What the flagged points show, from this run's own numbers, and what would close them."""
    o = res["options"]
    rows = o["prompts"] * o["group"]
    lines = ["", "### What explains them", ""]
    counted = []  # the update's share of the peak with its attention products counted, per point
    longest = (0.0, 0.0, 0)  # (attention, linear, length) of the longest length point
    for section, points in (("a", res["lengths"]), ("b", res["sizes"])):
        for p in points:
            it, d = p["iteration"], p["decode"]
            att, lin = _attention_share(p, rows)
            counted.append(it["update_peak_share"] * (att + lin) / lin)
            if section == "a" and p["length"] > longest[2]:
                longest = (att, lin, p["length"])
            share = it["creditrl_update_s"]["median"] / it["creditrl_iter_s"]["median"]
            lines.append(
                f"- {section}. {point_label(section, p)}: creditrl's iteration is rollout "
                f"{it['creditrl_rollout_s']['median']:.3f} s + update {it['creditrl_update_s']['median']:.3f} s "
                f"({100 * share:.0f}% update){_iteration_bound(it)}; decode {d['ratio_hf_vs_creditrl']:.2f}x HF "
                "generate; the update's causal "
                f"attention products are {att / 1e9:.1f} GFLOP next to 6 N x positions = {lin / 1e9:.1f} GFLOP, so "
                f"counted with them the update runs {100 * it['update_peak_share'] * (att + lin) / lin:.0f}% of the "
                "matmul peak."
            )
    lines += [
        "",
        *_iteration_explanation(res),
        "- **Update < 50% of the peak**: the 6 N formula counts the projections and the MLP only; the causal "
        "attention products grow as T^2"
        + (
            f" and, for the length points' model, are {100 * longest[0] / longest[1]:.0f}% of the projections' "
            f"FLOPs at {longest[2]:,} tokens (above)"
            if longest[1]
            else ""
        )
        + ". The packed "
        "pass runs them through PyTorch's CPU attention (masked for short responses, causal for long ones), one "
        "call per prompt length, at 32-wide heads (a low arithmetic intensity); counted with them the update "
        f"reaches {100 * min(counted, default=0):.0f}-{100 * max(counted, default=0):.0f}% of the peak. Short "
        "responses (64 tokens) lose instead to the fixed costs of a small batch (16 rows): one optimizer step and the "
        "kernel launches of a 4-layer model over about 1,000 positions." + _update_profile(res),
        *_decode_explanation(res),
        *_study_explanation(res),
    ]
    return lines


def _flagged(res: dict[str, Any], below: Callable[[dict[str, Any]], bool]) -> list[str]:
    """The labels of the points of (a) and (b) for which ``below(point)``."""
    return [point_label(s, p) for s, points in (("a", res["lengths"]), ("b", res["sizes"])) for p in points if below(p)]


def _update_profile(res: dict[str, Any]) -> str:
    """Section g's split of the update stage at the points whose update is below the peak target,
    as a sentence ("" without a profile of one)."""
    parts = []
    profiles = res.get("profile", {})
    for label in _flagged(res, lambda p: p["iteration"]["update_peak_share"] < MIN_PEAK_SHARE):
        u = profiles.get(label, {}).get("stages", {}).get("update")
        if not u:
            continue
        longest = ", ".join(name.split("::")[-1] for name, _ in u["top_ops"] if op_kind(name) == "other ops")
        parts.append(
            f"at {label}, {100 * u['products'] / u['wall_s']:.0f}% products, {100 * u['attention'] / u['wall_s']:.0f}% "
            f"attention, {100 * u['other ops'] / u['wall_s']:.0f}% other PyTorch ops (the longest: {longest}) and "
            f"{100 * u['outside ops'] / u['wall_s']:.0f}% outside them"
        )
    return f" Profiled (section g), the update's time is {'; '.join(parts)}.{_update_budget(res)}" if parts else ""


def _update_budget(res: dict[str, Any]) -> str:
    """What 50% of the peak asks of the update at each point below it: the update seconds it allows
    (the same FLOPs at half the peak) against section g's products and attention alone."""
    over, within = [], []
    peak = res["limits"]["peak_gflops"]
    for section, points in (("a", res["lengths"]), ("b", res["sizes"])):
        for p in points:
            it, label = p["iteration"], point_label(section, p)
            u = res.get("profile", {}).get(label, {}).get("stages", {}).get("update")
            if it["update_peak_share"] >= MIN_PEAK_SHARE or not u:
                continue
            seconds = it["creditrl_update_s"]["median"]
            allowed = seconds * it["update_peak_share"] / MIN_PEAK_SHARE
            rate = it["update_gflops"]["median"] * seconds / u["products"]  # the update's FLOPs over its products' time
            core = u["products"] + u["attention"]
            text = (
                f"at {label}, within {allowed:.3f} s (now {seconds:.3f} s): its products take {u['products']:.3f} s "
                f"({rate:.0f} GFLOP/s, {100 * rate / peak:.0f}% of the peak) and its attention {u['attention']:.3f} s"
            )
            if core <= allowed:
                text += (
                    f", which leaves {allowed - core:.3f} s for its other ops and the Python around them (now "
                    f"{u['wall_s'] - core:.3f} s)"
                )
            (over if core > allowed else within).append(text)
    if not over and not within:
        return ""
    out = " **What 50% of the peak asks** of the update (profiled seconds against plain ones):"
    if within:
        out += f" {'; '.join(within)}."
    if over:
        named = "; ".join(over)
        out += (
            f" {named[0].upper()}{named[1:]}: there the products and the attention alone, at the "
            "rates they reach, already take longer than that, before any other op, so no cut of the other ops or of "
            "the Python around them reaches 50% of the peak; only faster products and attention would."
        )
    return out


def _iteration_explanation(res: dict[str, Any]) -> list[str]:
    """Why the iteration is < 3x TRL's where it is: what the rollout would have to take for 3x, or
    that even a rollout of zero seconds would not reach it (TRL's iteration over the update alone)."""
    faster_rollout, faster_update = [], []
    for section, points in (("a", res["lengths"]), ("b", res["sizes"])):
        for p in points:
            it = p["iteration"]
            if it.get("ratio_trl_vs_creditrl", MIN_SPEEDUP) >= MIN_SPEEDUP:
                continue
            trl, update = it["trl_iter_s"]["median"], it["creditrl_update_s"]["median"]
            room = trl / MIN_SPEEDUP - update
            if room > 0:
                faster_rollout.append(
                    f"{point_label(section, p)} (a rollout of at most {room:.3f} s, now "
                    f"{it['creditrl_rollout_s']['median']:.3f} s)"
                )
            else:
                faster_update.append(f"{point_label(section, p)} ({trl / update:.2f}x)")
    if not faster_rollout and not faster_update:
        return []
    text = (
        "- **Iteration < 3x TRL**: TRL's GRPOTrainer does the same update (a forward and backward over the same "
        "positions, every row), so 3x means creditrl's update and rollout together within a third of TRL's "
        "iteration."
    )
    if faster_rollout:
        text += f" A faster rollout alone would close it at {'; '.join(faster_rollout)}."
    if faster_update:
        text += (
            f" At {' and '.join(faster_update)} not even a rollout of zero seconds would: the update alone is over a "
            "third of TRL's iteration, so closing it needs a faster update."
        )
    return [text]


def decode_ceiling(d: dict[str, Any], copy_gbs: float) -> float:
    """Tokens/s no engine passes at a decode point: per generated token, its share of a step's
    products alone (``d["products"]``, the faster library) plus its share of the KV cache read
    at the copy bandwidth (``d["traffic"]``); every engine runs both, one after the other."""
    t = d["traffic"]
    kv_s = t["kv_bytes_per_position"] * t["kv_positions_read"] / t["tokens"] / (copy_gbs * 1e9)
    return 1 / (1 / d["products"]["tokens_per_s"] + kv_s)


def _decode_explanation(res: dict[str, Any]) -> list[str]:
    """Why the decode is < 3x HF generate where it is: against the ceiling of its products and KV reads."""
    above, below = [], []
    copy_gbs = res["limits"]["copy_gbs"]
    for section, points in (("a", res["lengths"]), ("b", res["sizes"])):
        for p in points:
            d = p["decode"]
            if d["ratio_hf_vs_creditrl"] >= MIN_SPEEDUP or "products" not in d:
                continue
            c, need = d["products"], MIN_SPEEDUP * d["hf_generate_tokens_per_s"]["median"]
            ceiling = decode_ceiling(d, copy_gbs)
            libs = ", ".join(f"{LIBRARY.get(k, k)} {v:,.0f}" for k, v in c.get("by_library", {}).items())
            (above if need > ceiling else below).append(
                f"{section}. {point_label(section, p)}: the products alone run {c['tokens_per_s']:,.0f} tokens/s "
                f"({c['gflops']:.0f} GFLOP/s at {c['rows']} rows{'; ' + libs if libs else ''}), and with the KV "
                f"cache read at the copy bandwidth the ceiling is {ceiling:,.0f} tokens/s; creditrl's decode reaches "
                f"{100 * d['creditrl_tokens_per_s']['median'] / ceiling:.0f}% of that, HF generate "
                f"{100 * d['hf_generate_tokens_per_s']['median'] / ceiling:.0f}%, and 3x HF generate "
                f"would be {need:,.0f} tokens/s, {'above' if need > ceiling else 'below'} it"
            )
    lines = []
    if above:
        lines.append(
            f"- **Decode < 3x HF generate, out of reach**: {'; '.join(above)}. So 3x is beyond any fp32 decode "
            "that runs these products and reads this cache on this machine: at this row count a step's products "
            "are skinny (rows x hidden) x (hidden x out) matrices that stream every weight for a few rows, well "
            "below the square-matmul peak. HF generate pays the same products (through torch's F.linear); the "
            "static engine removes its per-step framework cost and runs the products through the faster library, "
            "but cannot go below their time. More rows per step (larger groups or batches) or fewer bytes per "
            "weight (bf16 or int8 weights) would raise the ceiling itself."
        )
    if below:
        lines.append(
            f"- **Decode < 3x HF generate, within reach**: {'; '.join(below)}. The ceiling leaves room there: the "
            "gap is the engine's own per-step cost (attention's arithmetic over the cache, norms, sampling, "
            "launches) beyond the products and the cache's bytes, which only fewer, larger kernels per step "
            "(a fused or compiled decode step) would cut."
        )
    if lines:
        lines[-1] += _rollout_profile(res)
    return lines


def _rollout_profile(res: dict[str, Any]) -> str:
    """Section g's split of the rollout stage at the points whose decode is below 3x, as a sentence."""
    parts = []
    profiles = res.get("profile", {})
    for label in _flagged(res, lambda p: p["decode"]["ratio_hf_vs_creditrl"] < MIN_SPEEDUP):
        r = profiles.get(label, {}).get("stages", {}).get("rollout")
        if r:
            parts.append(
                f"at {label}, {100 * r['products'] / r['wall_s']:.0f}% products, "
                f"{100 * r['other ops'] / r['wall_s']:.0f}% other PyTorch ops and "
                f"{100 * r['outside ops'] / r['wall_s']:.0f}% outside them"
            )
    if not parts:
        return ""
    return (
        f" Profiled (section g), the training rollout's time is {'; '.join(parts)}: outside PyTorch's ops are the "
        "compiled (numba) attention, norms and sampling, and the Python of each step."
    )


def _study_floor(res: dict[str, Any], base: dict[str, Any], fwd: dict[str, Any]) -> str:
    """The 2x target's iteration time against the model FLOPs of one arith iteration at the peak."""
    points = res.get("lengths") or res.get("sizes")
    old = [r["samples"] / r["iterations"] / r["samples_per_iteration_s"] for r in base.get("old", [])]
    if not points or not old:
        return ""
    n, tokens = points[0]["non_embedding_parameters"], fwd["response_tokens"]
    flops = (2 + 2 + 6) * n * tokens  # rollout and reference forwards, the update's forward + backward
    target = statistics.median(old) / 2
    peak = res["limits"]["peak_gflops"]
    return (
        f" Twice `{base['commit']}`'s samples/s within the iterations means {target:.2f} s per iteration; the "
        f"model FLOPs of one (2 N per token sampled and per reference token, 6 N per trained token: "
        f"{flops / 1e9:.1f} GFLOP for {tokens:,} tokens at N = {n:,}) take {flops / peak / 1e9:.2f} s at the "
        f"{peak:.0f} GFLOP/s square-matmul peak, which leaves {target - flops / peak / 1e9:.2f} s for every "
        "attention, norm, sampling step, optimizer step, score and kernel launch of the iteration."
        + _study_profile(res, target, flops)
    )


def _study_profile(res: dict[str, Any], target: float, flops: float) -> str:
    """What section g's profile of the arith iteration says about the 2x target's ``target`` seconds
    (``flops``: the iteration's model FLOPs)."""
    prof = res.get("profile", {}).get("study arith")
    if not prof:
        return ""
    kinds = {k: sum(s[k] for s in prof["stages"].values()) for k in KINDS}
    return (
        f" Profiled (section g), one iteration spends {kinds['products']:.2f} s in matrix products "
        f"(the model FLOPs at {flops / 1e9 / kinds['products']:.0f} GFLOP/s), {kinds['attention']:.2f} s in "
        f"attention, {kinds['other ops']:.2f} s in other PyTorch ops and {kinds['outside ops']:.2f} s outside them: "
        f"the products alone, at the rates they reach, are {100 * kinds['products'] / target:.0f}% of the "
        f"{target:.2f} s that 2x allows.{_study_wall(res, kinds['products'] + kinds['attention'])}"
    )


def _study_wall(res: dict[str, Any], core: float) -> str:
    """The 2x target end to end: the wall time it allows, less what the current runs spend outside
    their iterations, per iteration, against ``core`` (the profiled products and attention of one)."""
    study = res.get("study", {})
    base, runs = study.get("baseline", {}), study.get("runs", {}).get("arith", [])
    if not base.get("old") or not runs:
        return ""
    wall = statistics.median(r["wall_s"] for r in base["old"]) / 2
    outside = statistics.median(r["outside_iterations_s"] for r in runs)
    iterations = runs[0]["iterations"]
    left = (wall - outside) / iterations
    verdict = "less than" if left < core else "more than"
    return (
        f" End to end, 2x means {wall:.1f} s for the {iterations}-iteration run (`{base['commit']}`: "
        f"{2 * wall:.1f} s, median); this code spends {outside:.1f} s outside the iterations (start-up, "
        f"evaluations, checkpoints, exit), which leaves {left:.2f} s per iteration: {verdict} the products and the "
        f"attention alone take ({core:.2f} s)."
    )


def _study_explanation(res: dict[str, Any]) -> list[str]:
    """Why the study settings are not faster than the baseline, and the RSS point, from this run."""
    out = []
    fwd, kl = res.get("forward", {}).get("arith"), res.get("kl_skip")
    base = res.get("study", {}).get("baseline")
    if base and fwd:
        out.append(
            f"- **Study settings at {base['speedup']:.2f}x `{base['commit']}`**: arith.yaml's iteration is rollout, "
            "reference and update in about equal parts of the same size as before: the packed pass drops the padding "
            f"({fwd['padded_positions']:,} padded positions to {fwd['response_tokens']:,} response tokens) and its "
            f"forward + backward is {fwd['speedup_train']:.2f}x the HF pass and the reference "
            f"{fwd['speedup_infer']:.2f}x (section f), but the padded positions' products were a small part of each "
            "pass next to its fixed costs. With the KL on, no zero-advantage row can be left out exactly."
            + _study_floor(res, base, fwd)
        )
    if kl:
        m = kl["median"]
        out.append(
            f"- **What would close it**: `optim.skip_zero_advantage_kl` cuts the update from "
            f"{m['update_s_exact']:.3f} s to {m['update_s_approx']:.3f} s ({100 * m['skipped_rows']:.0f}% of the rows "
            f"left out) at a gradient cosine of {m['cosine']:.4f} to the exact one (section f); it is an "
            "approximation, and the 5-seed finding KLSKIP-arith (FINDINGS.md) did not show that it trains the same, "
            "so it stays off by default."
        )
    if "rss" in res and not res["rss"]["within_target"]:
        r = res["rss"]
        worst = max(r.get("stage_peak_mb", {}).items(), key=lambda kv: kv[1], default=None)
        where = f" (the largest stage: {worst[0]}, {worst[1]:,.0f} MB; section e)" if worst else ""
        out.append(
            f"- **Peak RSS {r['peak_rss_mb']:,.0f} MB**{where}: smaller `optim.micro_batch_positions` (the "
            "update) or `optim.inference_positions` (the reference) lower those stages; the rollout's KV cache "
            "is rows x (prompt + max new tokens) x layers x 2 x the KV width in float32."
        )
    return out


def _split(points: list[tuple[str, float, bool]], fmt: str) -> str:
    met = [f"{label} ({fmt.format(v)})" for label, v, ok in points if ok]
    missed = [f"{label} ({fmt.format(v)})" for label, v, ok in points if not ok]
    if not missed:
        return f"**met**{' at every point' if len(met) > 1 else ''}: {', '.join(met)}"
    return f"{'met at ' + ', '.join(met) + '; ' if met else ''}**missed** at {', '.join(missed)}"


def targets(res: dict[str, Any]) -> list[str]:
    """The benchmark's targets as a table: each one, and where this run meets it and where not."""
    every = [(section, p) for section, points in (("a", res["lengths"]), ("b", res["sizes"])) for p in points]
    iteration, decode, update = [], [], []
    for s, p in every:
        it, label = p["iteration"], point_label(s, p)
        if "ratio_trl_vs_creditrl" in it:
            iteration.append((label, it["ratio_trl_vs_creditrl"], it["ratio_trl_vs_creditrl"] >= MIN_SPEEDUP))
        ratio = p["decode"]["ratio_hf_vs_creditrl"]
        decode.append((label, ratio, ratio >= MIN_SPEEDUP))
        update.append((label, 100 * it["update_peak_share"], it["update_peak_share"] >= MIN_PEAK_SHARE))
    x = f"{MIN_SPEEDUP:.0f}x"
    rows = ["| target | this run |", "|---|---|"]
    if iteration:
        rows.append(f"| GRPO iteration >= {x} TRL's, at every length and size | {_split(iteration, '{:.2f}x')} |")
    rows.append(f"| decode >= {x} HF generate's, at every length and size | {_split(decode, '{:.2f}x')} |")
    if res["lengths"]:
        p = max(res["lengths"], key=lambda p: p["length"])
        share = p["decode"]["bandwidth_share"]
        rows.append(
            f"| decode at the longest length >= {100 * MIN_BANDWIDTH_SHARE:.0f}% of the copy bandwidth | "
            f"{_split([(point_label('a', p), 100 * share, share >= MIN_BANDWIDTH_SHARE)], '{:.0f}%')} |"
        )
    rows.append(
        f"| update >= {100 * MIN_PEAK_SHARE:.0f}% of the matmul peak ({res['limits']['peak_gflops']:.0f} GFLOP/s), at "
        f"every length and size | {_split(update, '{:.0f}%')} |"
    )
    base = res.get("study", {}).get("baseline")
    if base:
        rows.append(
            f"| study settings (arith.yaml) >= 2x `{base['commit']}`'s samples/s end to end | "
            f"{'**met**' if base['speedup'] >= 2 else '**missed**'}: {base['speedup']:.2f}x |"
        )
    if "rss" in res:
        r = res["rss"]
        rows.append(
            f"| peak RSS <= {r['target_mb']:,.0f} MB, {r['samples']} samples x {r['response_length']:,.0f} tokens at "
            f"{r['spec']['size']['name']} | {'**met**' if r['within_target'] else '**missed**'}: "
            f"{r['peak_rss_mb']:,.0f} MB |"
        )
    return rows
