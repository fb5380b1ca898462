"""Sections a and b of `benchmarks/performance.py`: the machine's limits, and one point (a
generated length or a model size) of decode and GRPO iteration against HF generate and TRL."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from bench import BenchOptions, creditrl_iterations, trl_iterations, update_model_flops
from common import median_ratio, spread
from creditrl.config import load_config
from creditrl.config.loader import packaged_config
from creditrl.policy.engines import SamplingParams, StaticEngine
from creditrl.policy.model import build_tiny, count_parameters, load_policy
from creditrl.policy.tokenizer import encode_prompt
from creditrl.tasks import Task, make_task
from creditrl.tasks.chain import band, sft_longest, steps_for_tokens
from perf_options import NEVER_EOS, TINY, ModelSize, PerformanceOptions

# -- models and the machine's limits -----------------------------------------------------------------------


def save_never_eos_model(size: ModelSize, out: Path, seed: int = 0) -> Path:
    """A random-init Llama of ``size`` and the character tokenizer, saved to ``out`` (model and
    tokenizer) with one extra special token appended and made eos: its id is the model's
    vocabulary size, so no model can sample it and every row decodes ``max_new_tokens``, in
    creditrl's engine, HF ``generate`` and TRL alike."""
    model, tok = build_tiny(seed, size.preset())
    return save_with_unreachable_eos(model, tok, out)


def save_with_unreachable_eos(model: Any, tok: Any, out: Path) -> Path:
    """Save ``model`` and ``tok`` to ``out`` with one special token appended to ``tok`` and made eos:
    its id is the model's vocabulary size, so no row can sample it."""
    tok.add_special_tokens({"eos_token": NEVER_EOS})
    if tok.eos_token_id != model.config.vocab_size:
        raise RuntimeError(f"the appended eos got id {tok.eos_token_id}, not {model.config.vocab_size}")
    model.config.eos_token_id = None  # (transformers flags a config eos outside the vocabulary)
    model.generation_config.eos_token_id = tok.eos_token_id
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def can_stop(model: Any, tok: Any) -> bool:
    """Whether ``model`` can sample ``tok``'s eos (False for :func:`save_never_eos_model`'s)."""
    return tok.eos_token_id is not None and tok.eos_token_id < model.get_output_embeddings().weight.shape[0]


def model_geometry(model: Any) -> dict[str, int]:
    """Non-embedding parameters and the KV cache's shape of a Llama-family model."""
    c = model.config
    heads = c.num_attention_heads
    return {
        "parameters": count_parameters(model),
        "non_embedding_parameters": count_parameters(model) - model.get_input_embeddings().weight.numel(),
        "layers": c.num_hidden_layers,
        "kv_heads": getattr(c, "num_key_value_heads", None) or heads,
        "head_dim": getattr(c, "head_dim", None) or c.hidden_size // heads,
    }


def decode_bytes(
    geometry: dict[str, int], prompt_lengths: list[int], generated: list[int], dtype_bytes: int = 4
) -> dict[str, float]:
    """The decode's memory traffic: per decode step the engine reads the weights once (non-embedding
    parameters x ``dtype_bytes``) plus the KV cache of every live row (``layers x 2 x kv_heads x
    head_dim x dtype_bytes`` per position so far). Row ``r`` (prompt ``p_r`` tokens, ``g_r``
    generated) is live for ``g_r`` steps and its ``t``-th token (t = 0 ..) reads ``p_r + t``
    positions; the steps are ``max g_r``. Bytes per generated token = that total / Σ g_r, i.e.
    (weights + Σ_live rows KV) / live rows, averaged over the steps."""
    weights = geometry["non_embedding_parameters"] * dtype_bytes
    kv_position = geometry["layers"] * 2 * geometry["kv_heads"] * geometry["head_dim"] * dtype_bytes
    positions = sum(g * p + g * (g - 1) // 2 for p, g in zip(prompt_lengths, generated, strict=True))
    steps, tokens = max(generated), sum(generated)
    total = steps * weights + kv_position * positions
    return {
        "weights_bytes": weights,
        "kv_bytes_per_position": kv_position,
        "steps": steps,
        "tokens": tokens,
        "kv_positions_read": positions,
        "total_bytes": total,
        "bytes_per_token": total / tokens,
    }


# -- (a) and (b): one point: decode and iteration against the peers -----------------------------------------


def decode_products(model: Any, rows: int, steps: int = 50, repeats: int = 5) -> dict[str, Any]:
    """The decode's ceiling set by its matrix products alone: one decode step's products of every
    layer (q|k|v, o, gate|up, down) and the head, on the model's own weights for ``rows`` rows of
    one token, with no attention, norm, sampling or framework step around them -- ``steps`` steps
    per repeat, by torch's ``F.linear`` and (where this torch has it) oneDNN's linear on weights
    reordered once. Every engine runs these products on every step; tokens/s = rows / step
    seconds, of the faster library (``library``), with each library's rate in ``by_library``."""
    from creditrl.policy.engines.decoder import Decoder, onednn_available, onednn_linear, reorder_weight

    with torch.no_grad():  # the engine's own fused weights (q|k|v and gate|up concatenated)
        dec = Decoder(model)
    weights = [w for ly in dec.layers for w in (ly.qkv, ly.o, ly.gate_up, ly.down)] + [dec.lm_head.detach()]
    xs = {w.shape[1]: torch.randn(rows, w.shape[1]) for w in weights}
    flops = sum(2 * rows * w.numel() for w in weights)
    found: dict[str, list[float]] = {}
    with torch.inference_mode():
        steps_by = {"torch": lambda: [F.linear(xs[w.shape[1]], w) for w in weights]}
        if onednn_available():
            packed = [(xs[w.shape[1]], reorder_weight(w, rows)) for w in weights]
            steps_by["onednn"] = lambda: [onednn_linear(x, p, None) for x, p in packed]
        for name, step in steps_by.items():
            step()
            seconds = []
            for _ in range(repeats):
                start = time.perf_counter()
                for _ in range(steps):
                    step()
                seconds.append((time.perf_counter() - start) / steps)
            found[name] = seconds
    best = min(found, key=lambda k: statistics.median(found[k]))
    seconds = found[best]
    return {
        "rows": rows,
        "library": best,
        "by_library": {k: rows / statistics.median(v) for k, v in found.items()},
        "step_s": spread(seconds),
        "tokens_per_s": rows / statistics.median(seconds),
        "gflops": flops / min(seconds) / 1e9,
        "flops_per_step": flops,
    }


def measure_decode(
    model: Any, tok: Any, prompts: list[list[int]], max_new: int, opts: PerformanceOptions
) -> dict[str, Any]:
    """creditrl's StaticEngine and HF generate, alternating, ``opts.repeats`` calls each (after one
    untimed call of each) on ``prompts x opts.group`` rows; seconds, tokens and row lengths per call."""
    from hf_peer import hf_generate_throughput

    engine = StaticEngine(model, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)
    params = SamplingParams(max_new_tokens=max_new, temperature=opts.temperature)

    def hf(seed: int) -> dict:
        return hf_generate_throughput(
            model,
            prompts,
            opts.group,
            max_new,
            temperature=opts.temperature,
            pad_id=tok.pad_token_id,
            eos_id=tok.eos_token_id,
            seed=seed,
        )

    def static(seed: int) -> tuple[float, list[int]]:
        start = time.perf_counter()
        g = engine.generate(prompts, opts.group, params, generator=torch.Generator().manual_seed(seed))
        return time.perf_counter() - start, [len(t) for t in g.tokens]

    hf(opts.seed), static(opts.seed)  # first-call costs (numba's cached code, allocator, threads) are not decode
    out: dict[str, Any] = {"hf": {"s": [], "tokens": []}, "creditrl": {"s": [], "tokens": [], "lengths": []}}
    for r in range(opts.repeats):
        res = hf(opts.seed + r)
        out["hf"]["s"].append(res["time_s"])
        out["hf"]["tokens"].append(res["new_tokens"])
        elapsed, lengths = static(opts.seed + r)
        out["creditrl"]["computed_row_steps"] = list(engine.last_rows)  # share_rows: (computed, decoded)
        out["creditrl"]["s"].append(elapsed)
        out["creditrl"]["tokens"].append(sum(lengths))
        out["creditrl"]["lengths"].append(lengths)
    return out


def measure_iterations(
    policy: str, settings: BenchOptions, task: Task, overrides: list[str], opts: PerformanceOptions
) -> dict[str, list[dict]]:
    """Rounds of creditrl GRPO iterations (chain config at ``settings``) and TRL GRPOTrainer steps
    on ``task``, alternating; the first iteration of every round dropped."""
    rows: list[dict] = []
    trl: list[dict] = []
    for _ in range(opts.rounds):
        rows += creditrl_iterations(policy, settings, opts.iterations, overrides, base=packaged_config("chain"))[1:]
        if opts.trl:
            trl += trl_iterations(policy, settings, opts.iterations, task)[1:]
    return {"creditrl": rows, "trl": trl}


def summarise_point(
    geometry: dict[str, int],
    prompt_lengths: list[int],
    decode: dict[str, Any],
    its: dict[str, list[dict]],
    limits: dict[str, float],
    group: int,
) -> dict[str, Any]:
    """Tokens/s, ratios (peer / creditrl median seconds), bandwidth and FLOP/s shares of one point
    (``prompt_lengths``: the prompts', each sampled ``group`` times in a row)."""
    d, h = decode["creditrl"], decode["hf"]
    rows = len(prompt_lengths) * group
    row_prompts = [p for p in prompt_lengths for _ in range(group)]
    traffic = [decode_bytes(geometry, row_prompts, g) for g in d["lengths"]]
    gbs = [t["total_bytes"] / s / 1e9 for t, s in zip(traffic, d["s"])]
    out: dict[str, Any] = {
        "decode": {
            "creditrl_tokens_per_s": spread([n / s for n, s in zip(d["tokens"], d["s"])]),
            "hf_generate_tokens_per_s": spread([n / s for n, s in zip(h["tokens"], h["s"])]),
            "creditrl_length": statistics.mean(d["tokens"]) / rows,
            "hf_generate_length": statistics.mean(h["tokens"]) / rows,
            # seconds per generated token: the two may generate different numbers of tokens (eos)
            "ratio_hf_vs_creditrl": median_ratio(
                [s / n for n, s in zip(h["tokens"], h["s"])], [s / n for n, s in zip(d["tokens"], d["s"])]
            ),
            "bytes_per_token": statistics.median(t["bytes_per_token"] for t in traffic),
            "computed_row_steps": d.get("computed_row_steps"),
            "traffic": traffic[-1],
            "gb_per_s": spread(gbs),
            "bandwidth_share": statistics.median(gbs) / limits["copy_gbs"],
        },
        "raw": {"decode": decode, "iterations": its},
    }
    c = its["creditrl"]
    n = geometry["non_embedding_parameters"]
    flops = [update_model_flops(n, r) for r in c]
    gflops = [f / r["time/update_s"] / 1e9 for f, r in zip(flops, c)]
    it: dict[str, Any] = {
        "creditrl_iter_s": spread([r["time/iter_s"] for r in c]),
        "creditrl_rollout_s": spread([r["time/rollout_s"] for r in c]),
        "creditrl_update_s": spread([r["time/update_s"] for r in c]),
        "creditrl_tokens_per_s": spread([r["tokens/generated"] / r["time/iter_s"] for r in c]),
        "creditrl_length": statistics.mean(r["response/length"] for r in c),
        "update_gflops": spread(gflops),
        "update_peak_share": statistics.median(gflops) / limits["peak_gflops"],
    }
    if its["trl"]:
        t = its["trl"]
        it["trl_iter_s"] = spread([r["time_s"] for r in t])
        it["trl_tokens_per_s"] = spread([r["tokens"] / r["time_s"] for r in t])
        it["trl_length"] = statistics.mean(r["tokens"] for r in t) / rows
        it["ratio_trl_vs_creditrl"] = median_ratio([r["time_s"] for r in t], [r["time/iter_s"] for r in c])
    out["iteration"] = it
    return out


def point_settings(policy: str, length: int, opts: PerformanceOptions, stops: bool) -> dict[str, Any]:
    """One point's GRPO settings: the chain task at ``steps_for_tokens(length)`` (a band of chain
    lengths around it), ``max_new_tokens`` (``length`` plus a margin where the policy can stop), the
    bench's settings and the trainer's overrides."""
    # a band of chain lengths around the one of ~length tokens (one length alone has 25 prompts, about
    # 1 in 10 held out), no longer than the chains the chain config's SFT saw (its counter never passed them)
    steps = steps_for_tokens(length)
    lo, hi = band(steps, sft_longest(load_config(packaged_config("chain"))))
    max_new = length + opts.length_margin if stops else length
    settings = BenchOptions(
        policy=policy,
        prompts=opts.prompts,
        group=opts.group,
        max_new_tokens=max_new,
        temperature=opts.temperature,
        lr=opts.lr,
        seed=opts.seed,
        trl=opts.trl,
    )
    overrides = [
        f"task.args={{min_steps: {lo}, max_steps: {hi}}}",
        f"optim.skip_zero_advantage={str(opts.skip_zero_advantage).lower()}",
    ]
    task = make_task("chain", min_steps=lo, max_steps=hi)
    return {"steps": steps, "max_new": max_new, "settings": settings, "overrides": overrides, "task": task}


def measure_point(
    policy: str, length: int, opts: PerformanceOptions, limits: dict[str, float], log: Callable[[str], None], label: str
) -> dict[str, Any]:
    """Decode and GRPO iteration of ``policy`` on the chain task at ``steps_for_tokens(length)``."""
    model, tok = load_policy(policy)
    model.eval()
    stops = can_stop(model, tok)
    point = point_settings(policy, length, opts, stops)
    steps, max_new, task = point["steps"], point["max_new"], point["task"]
    settings, overrides = point["settings"], point["overrides"]
    prompts = [encode_prompt(tok, p.prompt) for p in task.sample(opts.prompts, split="train", seed=opts.seed)]
    geometry = model_geometry(model)
    decode = measure_decode(model, tok, prompts, max_new, opts)
    products = decode_products(model, opts.prompts * opts.group)
    del model
    its = measure_iterations(policy, settings, task, overrides, opts)
    res = summarise_point(geometry, [len(p) for p in prompts], decode, its, limits, opts.group)
    res.update(length=length, chain_steps=steps, max_new_tokens=max_new, eos_reachable=stops, **geometry)
    res["decode"]["products"] = products
    d, it = res["decode"], res["iteration"]
    trl = (
        f"; TRL {it['trl_iter_s']['median']:.3f} s ({it['trl_length']:.0f} tokens/row) -> "
        f"{it['ratio_trl_vs_creditrl']:.2f}x"
        if "trl_iter_s" in it
        else ""
    )
    log(
        f"{label}: decode creditrl {d['creditrl_tokens_per_s']['median']:,.0f} tok/s ({d['creditrl_length']:.0f} "
        f"tokens/row), HF generate {d['hf_generate_tokens_per_s']['median']:,.0f} tok/s "
        f"({d['hf_generate_length']:.0f}) -> {d['ratio_hf_vs_creditrl']:.2f}x, {d['gb_per_s']['median']:.1f} GB/s = "
        f"{100 * d['bandwidth_share']:.0f}% of copy; iteration creditrl {it['creditrl_iter_s']['median']:.3f} s "
        f"({it['creditrl_length']:.0f} tokens/row, update {it['update_gflops']['median']:.1f} GFLOP/s = "
        f"{100 * it['update_peak_share']:.0f}% of peak){trl}"
    )
    return res


def length_policy(opts: PerformanceOptions, tmp: Path) -> str:
    """(a)'s start policy: the chain config's SFT checkpoint, a never-eos tiny model, or a model dir."""
    if opts.policy == "sft":
        from creditrl.train.sft import cached_sft

        path, _ = cached_sft(load_config(packaged_config("chain")), progress=True)
        return str(path)
    if opts.policy == "tiny":
        return str(save_never_eos_model(TINY, tmp / "tiny", opts.seed))
    return opts.policy


def bench_lengths(opts: PerformanceOptions, limits: dict, tmp: Path, log: Callable[[str], None]) -> list[dict]:
    policy = length_policy(opts, tmp)
    return [measure_point(policy, n, opts, limits, log, f"length {n}") for n in opts.lengths]


def bench_sizes(opts: PerformanceOptions, limits: dict, tmp: Path, log: Callable[[str], None]) -> list[dict]:
    out = []
    for size in opts.sizes:
        path = save_never_eos_model(size, tmp / f"size-{size.name}", opts.seed)
        model, _ = load_policy(str(path))
        geometry = model_geometry(model)
        del model
        log(
            f"size {size.name}: {geometry['parameters']:,} parameters ({geometry['non_embedding_parameters']:,} "
            f"non-embedding), random init, eos outside the vocabulary"
        )
        res = measure_point(str(path), opts.size_length, opts, limits, log, f"size {size.name}")
        out.append({"size": asdict(size), **res})
    return out
