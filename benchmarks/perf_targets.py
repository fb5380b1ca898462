"""The numbers ``benchmarks/performance.py``'s page derives from a ``performance.json``: each point
against the targets (:func:`target_rows`; the targets are the command's arguments) and the bounds that
say what would close a gap -- the iteration ratio a zero-second rollout would reach, the rollout time a
target allows, the update's share of the peak with its attention products counted, the decode's ceiling
(:func:`decode_ceiling`), the update time a peak share allows (:func:`update_budget_rows`) and the
iteration time a speed-up over the baseline allows (:func:`study_budget`)."""

from __future__ import annotations

import statistics
from typing import Any

from perf_profile import KINDS

TARGET_KEYS = ("min_speedup", "min_bandwidth_share", "min_peak_share", "min_baseline_speedup", "max_rss_mb")


def point_label(section: str, p: dict[str, Any]) -> str:
    return f"length {p['length']:,}" if section == "a" else f"size {p['size']['name']}"


def all_points(res: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(section, point) of every point of (a) and (b), in the page's order."""
    return [("a", p) for p in res["lengths"]] + [("b", p) for p in res["sizes"]]


def prompt_length(p: dict[str, Any]) -> float:
    """A point's mean prompt length, from its last decode call: the KV positions it read are
    ``sum_r g_r p_r + g_r (g_r - 1) / 2`` over rows generating ``g_r`` tokens after ``p_r`` prompt
    tokens (:func:`perf_points.decode_bytes`), so the ``g``-weighted mean of ``p_r`` follows from the
    rows' lengths."""
    t = p["decode"]["traffic"]
    lengths = p["raw"]["decode"]["creditrl"]["lengths"][-1]
    return (t["kv_positions_read"] - sum(g * (g - 1) // 2 for g in lengths)) / sum(lengths)


def attention_flops(p: dict[str, Any], rows: int) -> tuple[float, float]:
    """(attention FLOPs, 6 N x positions) of one update at a point of mean response length T and
    prompt length P: the score and value products the causal attention needs -- response query i
    sees P + i + 1 keys, so ``4 x width x (T P + T (T + 1) / 2)`` per row and layer forward, 3x
    with the backward -- next to the projections' and the MLP's 6 N per position."""
    t, n = p["iteration"]["creditrl_length"], prompt_length(p)
    width = p["kv_heads"] * p["head_dim"]  # heads x head_dim: the query width (no grouped-query here)
    attention = 3 * p["layers"] * 4 * rows * width * (t * n + t * (t + 1) / 2)
    linear = 6 * p["non_embedding_parameters"] * rows * (t + n)
    return attention, linear


def decode_ceiling(d: dict[str, Any], copy_gbs: float) -> float:
    """Tokens/s no engine passes at a decode point: per generated token, its share of a step's
    products alone (``d["products"]``, the faster library) plus its share of the KV cache read
    at the copy bandwidth (``d["traffic"]``); every engine runs both, one after the other."""
    t = d["traffic"]
    kv_s = t["kv_bytes_per_position"] * t["kv_positions_read"] / t["tokens"] / (copy_gbs * 1e9)
    return 1 / (1 / d["products"]["tokens_per_s"] + kv_s)


def target_rows(res: dict[str, Any], targets: dict[str, float | None]) -> list[dict[str, Any]]:
    """One row per target given and point it applies to: ``target``, ``threshold``, ``point``, ``value``
    (in the threshold's unit) and ``met``."""
    rows: list[dict[str, Any]] = []

    def add(target: str, key: str, point: str, value: float, at_most: bool = False) -> None:
        threshold = targets.get(key)
        if threshold is not None:
            met = value <= threshold if at_most else value >= threshold
            rows.append({"target": target, "threshold": threshold, "point": point, "value": value, "met": met})

    for section, p in all_points(res):
        it, label = p["iteration"], point_label(section, p)
        if "ratio_trl_vs_creditrl" in it:
            add("iteration TRL / creditrl (x)", "min_speedup", label, it["ratio_trl_vs_creditrl"])
    for section, p in all_points(res):
        add(
            "decode HF generate / creditrl (x)",
            "min_speedup",
            point_label(section, p),
            p["decode"]["ratio_hf_vs_creditrl"],
        )
    if res["lengths"]:
        p = max(res["lengths"], key=lambda q: q["length"])
        share = p["decode"]["bandwidth_share"]
        add("decode share of copy bandwidth, longest length", "min_bandwidth_share", point_label("a", p), share)
    for section, p in all_points(res):
        add(
            "update share of matmul peak",
            "min_peak_share",
            point_label(section, p),
            p["iteration"]["update_peak_share"],
        )
    base = res.get("study", {}).get("baseline")
    if base:
        add(
            f"arith.yaml samples/s end to end / {base['commit']}'s (x)",
            "min_baseline_speedup",
            "study",
            base["speedup"],
        )
    if "rss" in res:
        add("peak RSS (MB)", "max_rss_mb", res["rss"]["spec"]["size"]["name"], res["rss"]["peak_rss_mb"], at_most=True)
    return rows


def iteration_bounds(res: dict[str, Any], targets: dict[str, float | None]) -> list[dict[str, Any]]:
    """Per point: creditrl's rollout and update seconds, the update's share of the iteration, the ratio
    to TRL a rollout of zero seconds would give (TRL's iteration over creditrl's update alone), the
    rollout seconds ``min_speedup`` allows (negative: not even a zero-second rollout reaches it), and
    the update's attention and 6 N FLOPs with its share of the peak once the attention is counted."""
    o = res["options"]
    rows = o["prompts"] * o["group"]
    out = []
    for section, p in all_points(res):
        it = p["iteration"]
        rollout, update = it["creditrl_rollout_s"]["median"], it["creditrl_update_s"]["median"]
        attention, linear = attention_flops(p, rows)
        r: dict[str, Any] = {
            "point": point_label(section, p),
            "rollout_s": rollout,
            "update_s": update,
            "update_share": update / it["creditrl_iter_s"]["median"],
            "zero_rollout_ratio": None,
            "rollout_allowed_s": None,
            "attention_gflop": attention / 1e9,
            "linear_gflop": linear / 1e9,
            "peak_share_with_attention": it["update_peak_share"] * (attention + linear) / linear,
        }
        if "trl_iter_s" in it:
            trl = it["trl_iter_s"]["median"]
            r["zero_rollout_ratio"] = trl / update
            if targets.get("min_speedup"):
                r["rollout_allowed_s"] = trl / targets["min_speedup"] - update
        out.append(r)
    return out


def decode_bounds(res: dict[str, Any], targets: dict[str, float | None]) -> list[dict[str, Any]]:
    """Per point with a products measurement: the products-alone rate, the ceiling with the KV cache
    read at the copy bandwidth (:func:`decode_ceiling`), creditrl's and HF generate's shares of it, and
    the rate ``min_speedup`` x HF generate asks for, as a share of the ceiling (over 1: out of reach)."""
    copy_gbs = res["limits"]["copy_gbs"]
    out = []
    for section, p in all_points(res):
        d = p["decode"]
        if "products" not in d:
            continue
        ceiling = decode_ceiling(d, copy_gbs)
        hf = d["hf_generate_tokens_per_s"]["median"]
        need = targets["min_speedup"] * hf if targets.get("min_speedup") else None
        out.append(
            {
                "point": point_label(section, p),
                "products_tokens_per_s": d["products"]["tokens_per_s"],
                "products_gflops": d["products"]["gflops"],
                "by_library": d["products"].get("by_library", {}),
                "ceiling_tokens_per_s": ceiling,
                "creditrl_share": d["creditrl_tokens_per_s"]["median"] / ceiling,
                "hf_share": hf / ceiling,
                "target_tokens_per_s": need,
                "target_share": need / ceiling if need else None,
            }
        )
    return out


def update_budget_rows(res: dict[str, Any], targets: dict[str, float | None]) -> list[dict[str, Any]]:
    """Per profiled point whose update is below ``min_peak_share``: the update seconds that share allows
    (the same FLOPs at that share of the peak), the profiled products' seconds and rate, the attention's
    seconds, and what the allowance leaves for every other op and the Python around them (negative: the
    products and attention alone take longer) against what they take now."""
    share = targets.get("min_peak_share")
    if not share:
        return []
    peak, out = res["limits"]["peak_gflops"], []
    for section, p in all_points(res):
        it, label = p["iteration"], point_label(section, p)
        u = res.get("profile", {}).get(label, {}).get("stages", {}).get("update")
        if it["update_peak_share"] >= share or not u:
            continue
        seconds = it["creditrl_update_s"]["median"]
        rate = it["update_gflops"]["median"] * seconds / u["products"]  # the update's FLOPs over its products' time
        allowed, core = seconds * it["update_peak_share"] / share, u["products"] + u["attention"]
        out.append(
            {
                "point": label,
                "update_s": seconds,
                "allowed_s": allowed,
                "products_s": u["products"],
                "products_gflops": rate,
                "products_peak_share": rate / peak,
                "attention_s": u["attention"],
                "left_s": allowed - core,
                "other_now_s": u["wall_s"] - core,
            }
        )
    return out


def study_budget(res: dict[str, Any], targets: dict[str, float | None]) -> dict[str, Any] | None:
    """The iteration of arith.yaml against the baseline: its model FLOPs (2 N per sampled and per
    reference token, 6 N per trained token) and their time at the matmul peak; with
    ``min_baseline_speedup``, the iteration seconds and the end-to-end seconds that speed-up allows and
    what is left once the model FLOPs (per iteration) and this code's time outside the iterations are
    taken; with section g's profile, one iteration's seconds by kind of work. None without a baseline."""
    points = res.get("lengths") or res.get("sizes")
    base, fwd = res.get("study", {}).get("baseline"), res.get("forward", {}).get("arith")
    old = [r["samples"] / r["iterations"] / r["samples_per_iteration_s"] for r in (base or {}).get("old", [])]
    if not points or not old or not fwd:
        return None
    n, tokens, peak = points[0]["non_embedding_parameters"], fwd["response_tokens"], res["limits"]["peak_gflops"]
    flops = (2 + 2 + 6) * n * tokens  # rollout and reference forwards, the update's forward + backward
    out: dict[str, Any] = {
        "baseline": base["commit"],
        "baseline_iteration_s": statistics.median(old),
        "non_embedding_parameters": n,
        "response_tokens": tokens,
        "model_gflop": flops / 1e9,
        "model_s_at_peak": flops / peak / 1e9,
    }
    speedup = targets.get("min_baseline_speedup")
    if speedup:
        out["allowed_iteration_s"] = statistics.median(old) / speedup
        out["left_iteration_s"] = out["allowed_iteration_s"] - out["model_s_at_peak"]
    prof = res.get("profile", {}).get("study arith")
    if prof:
        kinds = {k: sum(s[k] for s in prof["stages"].values()) for k in KINDS}
        out.update({f"profiled_{k.replace(' ', '_')}_s": v for k, v in kinds.items()})
        out["profiled_products_gflops"] = flops / 1e9 / kinds["products"]
    runs = res.get("study", {}).get("runs", {}).get("arith", [])
    if speedup and runs:
        wall = statistics.median(r["wall_s"] for r in base["old"]) / speedup
        outside = statistics.median(r["outside_iterations_s"] for r in runs)
        out["allowed_wall_s"] = wall
        out["outside_iterations_s"] = outside
        out["left_per_iteration_s"] = (wall - outside) / runs[0]["iterations"]
    return out
