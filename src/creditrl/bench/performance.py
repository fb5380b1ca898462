"""``creditrl bench --performance``: long outputs, larger models and whole study runs, against the
peers and against the machine's own limits.

Sections (every ratio measured in the same run, the peers interleaved with creditrl: a round of
creditrl, then one of the peer, repeated; medians of the repeats; ratios are peer / creditrl
seconds, i.e. creditrl's speed-up):

a. ``lengths``  -- the chain task (:mod:`creditrl.tasks.chain`) at ``n = steps_for_tokens(L)`` for each
   generated length ``L``, from the chain config's SFT policy with ``rollout.max_new_tokens = L + 40``
   (the policy writes about ``L`` tokens and stops at eos): creditrl's GRPO iteration against TRL's
   ``GRPOTrainer`` at identical settings, and creditrl's decode (:class:`StaticEngine`) against HF
   ``generate`` on the same prompts. The measured mean response lengths are reported.
b. ``sizes``    -- random-init Llamas of about 0.9M, 10M and 50M parameters at one length; their
   tokenizer carries an extra special token appended as eos, outside the model's vocabulary, so no
   row can end early and both peers decode exactly ``max_new_tokens`` on every row.
c. ``study``    -- whole ``creditrl train`` runs (subprocesses, end to end) on arith.yaml and
   chain.yaml: samples/s and the share of every stage; and arith.yaml on the baseline commit
   (a ``git worktree`` of it, same venv) against the current code, interleaved, same seed:
   samples/s, the speed-up and whether their metrics rows agree.
d. ``limits``   -- a STREAM-style copy (bandwidth) and the fp32 matmul peak, in this process; the
   decode's bytes-per-token arithmetic (:func:`decode_bytes`) against the copy bandwidth and the
   update's model FLOP/s against the peak, at every point of (a) and (b).
e. ``rss``      -- peak RSS of a subprocess running one creditrl iteration of 128 samples x 1,024
   tokens at the ~10M size, against a 4 GB target.

Results go to ``OUT/performance.json`` and the plots ``OUT/performance_length.png`` and
``OUT/performance_size.png``; the markdown report is printed (and written with ``--results PAGE``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from creditrl.bench.performance_report import flags, performance_report, plot_lengths, plot_sizes
from creditrl.bench.run import BenchOptions, creditrl_iterations, matmul_peak, spread, trl_iterations
from creditrl.config import Config, load_config
from creditrl.config.loader import packaged_config
from creditrl.experiments.report import command_line, peak_rss_mb, write_results
from creditrl.policy.engines import SamplingParams, StaticEngine
from creditrl.policy.model import TinyPreset, build_tiny, count_parameters, load_policy
from creditrl.policy.tokenizer import encode_prompt
from creditrl.tasks import Task, make_task
from creditrl.tasks.chain import steps_for_tokens

__all__ = [
    "ModelSize",
    "PerformanceOptions",
    "quick_options",
    "options_from_args",
    "run_performance",
    "save_never_eos_model",
    "decode_bytes",
    "copy_bandwidth",
    "compare_rows",
    "summarise_run",
]

NEVER_EOS = "<never-eos>"  # the appended eos of the random-init models: outside every model's vocabulary
BASELINE = "d760505"  # the commit the performance issue names as its baseline
CREDITRL_SRC = Path(__file__).resolve().parents[2]  # .../src: PYTHONPATH of the current code's subprocesses


@dataclass(frozen=True)
class ModelSize:
    """A Llama shape built by :func:`~creditrl.policy.model.build_tiny` (defaults: the tiny preset)."""

    name: str
    hidden_size: int = 128
    num_layers: int = 4
    num_heads: int = 4
    intermediate_size: int = 384

    def preset(self) -> TinyPreset:
        return TinyPreset(
            hidden_size=self.hidden_size,
            num_layers=self.num_layers,
            num_heads=self.num_heads,
            intermediate_size=self.intermediate_size,
        )


TINY = ModelSize("tiny")
SIZE_10M = ModelSize("10M", 384, 6, 6, 1024)
SIZE_50M = ModelSize("50M", 640, 10, 10, 1728)


@dataclass
class PerformanceOptions:
    """Every size of the benchmark (:func:`quick_options`: the seconds-long variant)."""

    policy: str = "sft"  # (a): "sft" (chain.yaml's cached SFT policy), "tiny" (random init, never-eos) or a dir
    lengths: tuple[int, ...] = (64, 256, 512, 1000)  # (a): generated tokens (1,000: n = 99, the SFT's longest chain)
    length_margin: int = 40  # (a): max_new_tokens = L + margin where the policy can stop (exactly L where not)
    prompts: int = 4
    group: int = 4
    temperature: float = 1.0  # TRL trains the tempered policy; at 1.0 both losses are the same
    lr: float = 5e-5
    skip_zero_advantage: bool = False  # False: creditrl trains every row, as TRL does (the same update work)
    rounds: int = 2  # creditrl and TRL alternate this many times per point
    iterations: int = 3  # iterations per trainer and round; the first of each dropped as warm-up
    repeats: int = 3  # decode calls per engine and point, alternating with HF generate
    sizes: tuple[ModelSize, ...] = (TINY, SIZE_10M, SIZE_50M)  # (b), random init
    size_length: int = 256  # (b): every row decodes exactly this many tokens
    study: tuple[str, ...] = ("arith", "chain")  # (c): packaged configs run by `creditrl train`
    study_iterations: dict[str, int] = field(default_factory=lambda: {"arith": 45, "chain": 10})
    study_overrides: dict[str, tuple[str, ...]] = field(default_factory=dict)  # extra --set per config
    baseline: str | None = BASELINE  # (c): arith.yaml on this commit vs the current code (None skips it)
    baseline_rounds: int = 2  # (old, new) pairs
    baseline_warmup: bool = True  # one untimed 1-iteration run of each code first (a fresh worktree compiles numba)
    copy_mb: int = 256  # (d)
    copy_repeats: int = 10
    matmul_n: int = 2048
    rss: bool = True  # (e)
    rss_size: ModelSize = SIZE_10M
    rss_prompts: int = 16
    rss_group: int = 8
    rss_tokens: int = 1024
    rss_target_mb: float = 4096.0
    forward: tuple[str, ...] = ("arith", "chain")  # (f): packed vs HF forward on these configs' first batch
    forward_repeats: int = 3
    kl_skip: bool = True  # (f): what optim.skip_zero_advantage_kl changes, on arith.yaml
    kl_skip_iterations: int = 31
    kl_skip_at: tuple[int, ...] = (5, 15, 30)
    trl: bool = True
    seed: int = 0
    out: Path = field(default_factory=lambda: Path("runs/bench"))
    results: Path | None = None


def quick_options(opts: PerformanceOptions) -> PerformanceOptions:
    """``opts`` at sizes where the whole command takes well under a minute (numbers meaningless)."""
    small = ("train.init=policy", "rollout.prompts_per_iter=2", "rollout.group_size=2", "train.eval_size=4")
    return replace(
        opts,
        policy="tiny" if opts.policy == "sft" else opts.policy,
        lengths=(8, 16),
        prompts=2,
        group=2,
        rounds=1,
        iterations=2,
        repeats=1,
        sizes=(ModelSize("0.1M", 64, 2, 2, 192), ModelSize("0.3M", 96, 3, 3, 256)),
        size_length=16,
        study_iterations={"arith": 3, "chain": 3},
        study_overrides={
            "arith": (*small, "rollout.max_new_tokens=8"),
            "chain": (*small, "rollout.max_new_tokens=16", "task.args={min_steps: 1, max_steps: 1}"),
        },
        baseline_rounds=1,
        baseline_warmup=False,
        copy_mb=8,
        copy_repeats=3,
        matmul_n=256,
        rss_size=ModelSize("0.1M", 64, 2, 2, 192),
        rss_prompts=2,
        rss_group=2,
        rss_tokens=32,
        forward_repeats=1,
        kl_skip_iterations=3,
        kl_skip_at=(1, 2),
    )


# -- models and the machine's limits -----------------------------------------------------------------------


def save_never_eos_model(size: ModelSize, out: Path, seed: int = 0) -> Path:
    """A random-init Llama of ``size`` and the character tokenizer, saved to ``out`` (model and
    tokenizer) with one extra special token appended and made eos: its id is the model's
    vocabulary size, so no model can sample it and every row decodes ``max_new_tokens``, in
    creditrl's engine, HF ``generate`` and TRL alike."""
    model, tok = build_tiny(seed, size.preset())
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


def copy_bandwidth(mb: int, repeats: int) -> dict[str, float]:
    """STREAM-style copy: ``dst.copy_(src)`` of an ``mb`` MB fp32 buffer; GB/s with bytes moved =
    2 x size (read + write), per repeat (after one untimed copy)."""
    src = torch.rand(mb * 2**20 // 4)
    dst = torch.empty_like(src)
    dst.copy_(src)
    rates = []
    for _ in range(repeats):
        start = time.perf_counter()
        dst.copy_(src)
        rates.append(2 * src.numel() * 4 / (time.perf_counter() - start) / 1e9)
    return spread(rates)


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


def _log_fn(start: float) -> Callable[[str], None]:
    def log(msg: str) -> None:
        print(f"[creditrl bench --performance] {time.time() - start:6.0f} s  {msg}", flush=True)

    return log


def measure_decode(
    model: Any, tok: Any, prompts: list[list[int]], max_new: int, opts: PerformanceOptions
) -> dict[str, Any]:
    """creditrl's StaticEngine and HF generate, alternating, ``opts.repeats`` calls each (after one
    untimed call of each) on ``prompts x opts.group`` rows; seconds, tokens and row lengths per call."""
    from creditrl.bench.hf_peer import hf_generate_throughput

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


def _median_ratio(peer: list[float], ours: list[float]) -> float:
    return statistics.median(peer) / statistics.median(ours)


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
            "ratio_hf_vs_creditrl": _median_ratio(
                [s / n for n, s in zip(h["tokens"], h["s"])], [s / n for n, s in zip(d["tokens"], d["s"])]
            ),
            "bytes_per_token": statistics.median(t["bytes_per_token"] for t in traffic),
            "traffic": traffic[-1],
            "gb_per_s": spread(gbs),
            "bandwidth_share": statistics.median(gbs) / limits["copy_gbs"],
        },
        "raw": {"decode": decode, "iterations": its},
    }
    c = its["creditrl"]
    n = geometry["non_embedding_parameters"]
    # model FLOPs of the rows the update trained: 6 N x their share of the batch's padded positions
    flops = [6 * n * r["tokens/padded"] * (1 - r.get("update/skipped_rows", 0.0)) for r in c]
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
        it["ratio_trl_vs_creditrl"] = _median_ratio([r["time_s"] for r in t], [r["time/iter_s"] for r in c])
    out["iteration"] = it
    return out


def measure_point(
    policy: str, length: int, opts: PerformanceOptions, limits: dict[str, float], log: Callable[[str], None], label: str
) -> dict[str, Any]:
    """Decode and GRPO iteration of ``policy`` on the chain task at ``steps_for_tokens(length)``."""
    model, tok = load_policy(policy)
    model.eval()
    stops = can_stop(model, tok)
    max_new = length + opts.length_margin if stops else length
    # a band of chain lengths around the one of ~length tokens (one length alone has 25 prompts, about
    # 1 in 10 held out), no longer than the chains the chain config's SFT saw (its counter never passed them)
    from creditrl.experiments.long_report import band, sft_longest

    steps = steps_for_tokens(length)
    lo, hi = band(steps, sft_longest(load_config(packaged_config("chain"))))
    task = make_task("chain", min_steps=lo, max_steps=hi)
    prompts = [encode_prompt(tok, p.prompt) for p in task.sample(opts.prompts, split="train", seed=opts.seed)]
    geometry = model_geometry(model)
    decode = measure_decode(model, tok, prompts, max_new, opts)
    del model
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
    its = measure_iterations(policy, settings, task, overrides, opts)
    res = summarise_point(geometry, [len(p) for p in prompts], decode, its, limits, opts.group)
    res.update(length=length, chain_steps=steps, max_new_tokens=max_new, eos_reachable=stops, **geometry)
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


# -- (c): whole `creditrl train` runs -----------------------------------------------------------------------


def _read_new_rows(path: Path, seen: int, stamps: list[float], start: float) -> int:
    """Stamp the time each complete new line of ``path`` appeared; returns the bytes consumed."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return seen
    if size <= seen:
        return seen
    with path.open("rb") as f:
        f.seek(seen)
        chunk = f.read(size - seen)
    done = chunk.rfind(b"\n") + 1
    now = time.perf_counter() - start
    stamps.extend(now for _ in range(chunk[:done].count(b"\n")))
    return seen + done


def timed_train(src: Path, config: Path, overrides: list[str], run_dir: Path) -> dict[str, Any]:
    """``python -m creditrl.cli train CONFIG --set ... --run-dir RUN_DIR`` with ``PYTHONPATH=src``
    (a fresh run dir), timed end to end; each metrics row is stamped when it appears."""
    run_dir = run_dir.resolve()  # the old tree's train runs in its own folder: a relative dir would land there
    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "creditrl.cli", "train", str(config)]
    cmd += [a for o in overrides for a in ("--set", o)] + ["--run-dir", str(run_dir)]
    env = {**os.environ, "PYTHONPATH": str(src)}
    log_path = run_dir.parent / f"{run_dir.name}.log"
    stamps: list[float] = []
    seen = 0
    with log_path.open("w") as log:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=src.parent)
        while proc.poll() is None:
            seen = _read_new_rows(run_dir / "metrics.jsonl", seen, stamps, start)
            time.sleep(0.02)
        wall = time.perf_counter() - start
    _read_new_rows(run_dir / "metrics.jsonl", seen, stamps, start)
    if proc.returncode != 0:
        tail = "\n".join(log_path.read_text().splitlines()[-20:])
        raise RuntimeError(f"`{' '.join(cmd)}` exited {proc.returncode}; the end of {log_path}:\n{tail}")
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return {"command": cmd, "src": str(src), **summarise_run(rows, wall, stamps)}


def summarise_run(rows: list[dict], wall: float, stamps: list[float] | None = None) -> dict[str, Any]:
    """Samples/s and where the wall time went. The rows' stage times sum to ``time/iter_s``; the
    rest of the wall time is outside the iterations. With ``stamps`` (when each row appeared) that
    rest is split: until row 0 (start-up + the first evaluation), each evaluation row's gap beyond
    its iteration and the other rows' median gap (later evaluations), and the remainder (checkpoints,
    inspector records, logging, exit). Rows with a ``time/eval_s`` give the evaluations directly."""
    its = [r for r in rows if "time/iter_s" in r]
    stages: dict[str, float] = {}
    for r in its:
        for k, v in r.items():
            if k.startswith("time/") and k.endswith("_s") and k not in ("time/iter_s", "time/total_s", "time/eval_s"):
                stages[k[5:-2]] = stages.get(k[5:-2], 0.0) + v
    in_iterations = sum(r["time/iter_s"] for r in its)
    samples = rows[-1]["samples/total"] if rows else 0
    out: dict[str, Any] = {
        "wall_s": wall,
        "iterations": len(its),
        "samples": samples,
        "samples_per_s": samples / wall,
        "samples_per_iteration_s": samples / in_iterations if in_iterations else 0.0,
        "stages_s": stages,
        "iterations_s": in_iterations,
        "outside_iterations_s": wall - in_iterations,
        "evaluations": sum("eval/accuracy" in r for r in rows),
        "rows": [{k: r[k] for k in ("iteration", "eval/accuracy", "reward/mean") if k in r} for r in rows],
    }
    if any("time/eval_s" in r for r in rows):
        out["eval_s"] = sum(r.get("time/eval_s", 0.0) for r in rows)
        out["eval_source"] = "time/eval_s"
    elif stamps and len(stamps) == len(rows) and len(rows) > 1:
        gaps = [stamps[i] - stamps[i - 1] - rows[i].get("time/iter_s", 0.0) for i in range(1, len(rows))]
        plain = [g for g, r in zip(gaps, rows[1:]) if "eval/accuracy" not in r]
        overhead = statistics.median(plain) if plain else 0.0
        later = [g - overhead for g, r in zip(gaps, rows[1:]) if "eval/accuracy" in r]
        out["until_first_row_s"] = stamps[0]
        out["later_evals_s"] = sum(later)
        out["mean_eval_s"] = statistics.mean(later) if later else 0.0
        out["eval_source"] = "row gaps"
    return out


def compare_rows(a: list[dict], b: list[dict], keys: tuple[str, ...] = ("eval/accuracy", "reward/mean")) -> dict:
    """Largest absolute difference of each of ``keys`` over the iterations both runs logged it at."""
    by_it = {r["iteration"]: r for r in b}
    out: dict[str, Any] = {}
    for key in keys:
        diffs = [
            abs(r[key] - by_it[r["iteration"]][key]) for r in a if key in r and key in by_it.get(r["iteration"], {})
        ]
        out[key] = {"max_abs_diff": max(diffs) if diffs else None, "compared": len(diffs)}
    return out


@contextlib.contextmanager
def baseline_worktree(commit: str) -> Iterator[Path]:
    """A detached ``git worktree`` of ``commit`` in a temporary directory, removed afterwards."""
    repo = subprocess.run(
        ["git", "-C", str(CREDITRL_SRC), "rev-parse", "--show-toplevel"], capture_output=True, text=True
    )
    if repo.returncode != 0:
        raise RuntimeError(f"the baseline comparison needs creditrl's git checkout ({repo.stderr.strip()})")
    top = repo.stdout.strip()
    tree = Path(tempfile.mkdtemp(prefix=f"creditrl-{commit}-")) / "tree"
    subprocess.run(
        ["git", "-C", top, "worktree", "add", "--detach", str(tree), commit], check=True, capture_output=True
    )
    try:
        yield tree
    finally:
        subprocess.run(["git", "-C", top, "worktree", "remove", "--force", str(tree)], capture_output=True)
        shutil.rmtree(tree.parent, ignore_errors=True)
        subprocess.run(["git", "-C", top, "worktree", "prune"], capture_output=True)


def _study_overrides(opts: PerformanceOptions, name: str, threads: int) -> list[str]:
    iterations = opts.study_iterations.get(name)  # None: the config's own
    return [
        *([f"train.iterations={iterations}"] if iterations else []),
        f"train.threads={threads}",
        "train.progress=false",
        f"train.seed={opts.seed}",
        *opts.study_overrides.get(name, ()),
    ]


def _log_run(log: Callable[[str], None], label: str, r: dict) -> None:
    log(
        f"study {label}: {r['iterations']} iterations, {r['samples']:,} samples in {r['wall_s']:.1f} s = "
        f"{r['samples_per_s']:.1f} samples/s end to end ({r['samples_per_iteration_s']:.1f} within iterations; "
        f"{r['outside_iterations_s']:.1f} s outside them)"
    )


def _ensure_sft(name: str, overrides: list[str], log: Callable[[str], None]) -> None:
    """Find (or train, untimed) the SFT warm start a study run of ``name`` starts from."""
    cfg = load_config(packaged_config(name), overrides)
    if cfg.train.init == "sft":
        from creditrl.train.sft import cached_sft

        path, _ = cached_sft(cfg, progress=True)
        log(f"study {name}: starts from the cached SFT policy {path}")


def bench_study(opts: PerformanceOptions, threads: int, log: Callable[[str], None]) -> dict[str, Any]:
    runs_dir = opts.out / "study"
    out: dict[str, Any] = {"threads": threads, "runs": {}}
    for name in opts.study:
        _ensure_sft(name, _study_overrides(opts, name, threads), log)
        if name == "arith" and opts.baseline:
            continue  # the baseline comparison's runs of the current code are the arith study runs
        r = timed_train(CREDITRL_SRC, packaged_config(name), _study_overrides(opts, name, threads), runs_dir / name)
        out["runs"][name] = [r]
        _log_run(log, name, r)
    if opts.baseline:
        overrides = _study_overrides(opts, "arith", threads)
        if "arith" not in opts.study:
            _ensure_sft("arith", overrides, log)
        old: list[dict] = []
        new: list[dict] = []
        with baseline_worktree(opts.baseline) as tree:
            config = tree / "src/creditrl/configs/arith.yaml"
            if opts.baseline_warmup:  # untimed: the worktree's numba cache and bytecode, and the current code's
                warm = [*overrides, "train.iterations=1"]
                timed_train(tree / "src", config, warm, runs_dir / f"warmup-{opts.baseline}")
                timed_train(CREDITRL_SRC, packaged_config("arith"), warm, runs_dir / "warmup")
                log(f"study baseline: warm-up runs of {opts.baseline} and of the current code done")
            for i in range(opts.baseline_rounds):  # old, new, old, new
                old.append(timed_train(tree / "src", config, overrides, runs_dir / f"arith-{opts.baseline}-{i}"))
                _log_run(log, f"arith at {opts.baseline} #{i + 1}", old[-1])
                new.append(timed_train(CREDITRL_SRC, packaged_config("arith"), overrides, runs_dir / f"arith-{i}"))
                _log_run(log, f"arith, current code #{i + 1}", new[-1])
        out["runs"]["arith"] = new
        agree = compare_rows(old[0]["rows"], new[0]["rows"])
        out["baseline"] = {
            "commit": opts.baseline,
            "warmup": opts.baseline_warmup,
            "old": old,
            "speedup": _median_ratio([r["wall_s"] for r in old], [r["wall_s"] for r in new]),
            "speedup_iterations": _median_ratio([r["iterations_s"] for r in old], [r["iterations_s"] for r in new]),
            "agreement": agree,
            "same_code_agreement": compare_rows(new[0]["rows"], new[-1]["rows"]) if len(new) > 1 else None,
        }
        b = out["baseline"]
        log(
            f"study baseline: current code {b['speedup']:.2f}x the samples/s of {opts.baseline} end to end "
            f"({b['speedup_iterations']:.2f}x within iterations); largest |difference| eval/accuracy "
            f"{agree['eval/accuracy']['max_abs_diff']}, reward/mean {agree['reward/mean']['max_abs_diff']}"
        )
    return out


# -- (f): the packed forward against the HF pass, and the KL row-skipping approximation --------------------------


def _start_of(name: str, overrides: list[str]) -> tuple[Config, str]:
    """A study config and the path its run starts from (the cached SFT policy, or policy.model)."""
    from creditrl.train.build import start_policy

    cfg = load_config(packaged_config(name), overrides)
    return cfg, start_policy(cfg, progress=True)


def bench_forward(opts: PerformanceOptions, threads: int, log: Callable[[str], None]) -> dict[str, Any]:
    from creditrl.bench.forward_ab import forward_ab

    out: dict[str, Any] = {}
    for name in opts.forward:
        cfg, start = _start_of(name, _study_overrides(opts, name, threads))
        r = out[name] = forward_ab(cfg, start, opts.forward_repeats)
        log(
            f"forward/{name}: {r['rows']} rows, {r['response_tokens']:,} response tokens of {r['padded_positions']:,} "
            f"padded positions; packed {r['speedup_infer']:.2f}x the HF pass without gradient, "
            f"{r['speedup_train']:.2f}x forward + backward; max |d log p| {r['max_abs_logprob_diff']:.1e}, "
            f"gradient distance {r['grad_relative_distance']:.1e}"
        )
    return out


def bench_kl_skip(opts: PerformanceOptions, threads: int, log: Callable[[str], None]) -> dict[str, Any]:
    from creditrl.bench.kl_skip import kl_skip_effect

    overrides = [o for o in _study_overrides(opts, "arith", threads) if not o.startswith("train.iterations=")]
    cfg, start = _start_of("arith", [*overrides, "train.eval_every=100000"])
    out = kl_skip_effect(cfg, start, opts.kl_skip_iterations, opts.kl_skip_at)
    m = out["median"]
    log(
        f"kl_skip: gradient cosine {m['cosine']:.4f}, relative distance {m['relative_distance']:.3f} with "
        f"{100 * m['skipped_rows']:.0f}% of rows left out; update {m['update_s_exact']:.3f} s exact vs "
        f"{m['update_s_approx']:.3f} s approximate (medians over iterations {list(opts.kl_skip_at)})"
    )
    return out


# -- (e): peak RSS of one large iteration --------------------------------------------------------------------


def rss_child(spec_json: str) -> None:
    """(In a subprocess.) One creditrl iteration on chain.yaml (KL on) from a never-eos model of
    ``spec["size"]``: prints one JSON line with its peak RSS (this process) and timings."""
    import resource

    from creditrl.train.rl import RLTrainer

    spec = json.loads(spec_json)
    if spec["threads"]:
        torch.set_num_threads(spec["threads"])
    steps = steps_for_tokens(spec["tokens"])
    with tempfile.TemporaryDirectory(prefix="creditrl-rss-") as tmp:
        path = save_never_eos_model(ModelSize(**spec["size"]), Path(tmp) / "model", spec["seed"])
        cfg = load_config(
            packaged_config("chain"),
            [
                f"rollout.prompts_per_iter={spec['prompts']}",
                f"rollout.group_size={spec['group']}",
                f"rollout.max_new_tokens={spec['tokens']}",
                f"task.args={{min_steps: {steps}, max_steps: {steps}}}",
                "optim.skip_zero_advantage=false",
                "train.progress=false",
                f"train.seed={spec['seed']}",
            ],
        )
        trainer = RLTrainer.from_config(cfg, Path(tmp) / "run", init_path=str(path))
        row = trainer.iteration(0)
    print(
        json.dumps(
            {
                "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                "iter_s": row["time/iter_s"],
                "rollout_s": row["time/rollout_s"],
                "update_s": row["time/update_s"],
                "response_length": row["response/length"],
                "samples": spec["prompts"] * spec["group"],
            }
        )
    )


def bench_rss(opts: PerformanceOptions, threads: int, log: Callable[[str], None]) -> dict[str, Any]:
    spec = {
        "size": asdict(opts.rss_size),
        "prompts": opts.rss_prompts,
        "group": opts.rss_group,
        "tokens": opts.rss_tokens,
        "threads": threads,
        "seed": opts.seed,
    }
    code = "import sys; from creditrl.bench.performance import rss_child; rss_child(sys.argv[1])"
    env = {**os.environ, "PYTHONPATH": str(CREDITRL_SRC)}
    proc = subprocess.run([sys.executable, "-c", code, json.dumps(spec)], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"the peak-RSS subprocess exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    res.update(spec=spec, target_mb=opts.rss_target_mb, within_target=res["peak_rss_mb"] <= opts.rss_target_mb)
    log(
        f"rss: one iteration of {res['samples']} samples x {opts.rss_tokens} tokens at {opts.rss_size.name} "
        f"({res['response_length']:.0f} tokens/row, {res['iter_s']:.1f} s): peak RSS {res['peak_rss_mb']:,.0f} MB "
        f"(target {opts.rss_target_mb:,.0f} MB)"
    )
    return res


# -- the command ---------------------------------------------------------------------------------------------


def run_performance(opts: PerformanceOptions) -> dict[str, Any]:
    if opts.iterations < 2 or opts.rounds < 1 or opts.repeats < 1:
        raise ValueError("need iterations >= 2 (the first of a round is warm-up), rounds >= 1 and repeats >= 1")
    opts.out.mkdir(parents=True, exist_ok=True)
    log = _log_fn(time.time())
    threads = torch.get_num_threads()
    options = json.loads(json.dumps(asdict(opts), default=str))  # paths as strings
    result: dict[str, Any] = {"options": options, "threads": threads, "torch": torch.__version__}
    result["command"] = command_line()
    copy, peak = copy_bandwidth(opts.copy_mb, opts.copy_repeats), matmul_peak(opts.matmul_n)
    result["limits"] = {"copy": copy, "matmul": peak, "copy_gbs": copy["max"], "peak_gflops": peak["max"]}
    log(
        f"limits: copy of {opts.copy_mb} MB {copy['max']:.1f} GB/s (best of {opts.copy_repeats}), fp32 "
        f"{opts.matmul_n}^3 matmul {peak['max']:.0f} GFLOP/s (best of 5)"
    )
    with tempfile.TemporaryDirectory(prefix="creditrl-performance-") as tmp:
        result["lengths"] = bench_lengths(opts, result["limits"], Path(tmp), log)
        result["sizes"] = bench_sizes(opts, result["limits"], Path(tmp), log)
    partial = opts.out / "performance.partial.json"  # each finished section, so a failure keeps them
    partial.write_text(json.dumps(result, indent=2, default=str))
    result["study"] = bench_study(opts, threads, log)
    partial.write_text(json.dumps(result, indent=2, default=str))
    if opts.rss:
        result["rss"] = bench_rss(opts, threads, log)
    result["forward"] = bench_forward(opts, threads, log)
    if opts.kl_skip:
        result["kl_skip"] = bench_kl_skip(opts, threads, log)
    result["peak_rss_mb"] = peak_rss_mb()
    result["flags"] = flags(result)
    log(f"peak RSS of the bench process: {result['peak_rss_mb']:.0f} MB; {len(result['flags'])} points flagged")
    (opts.out / "performance.json").write_text(json.dumps(result, indent=2, default=str))
    publish(result, opts.out, opts.results)
    return result


def publish(result: dict[str, Any], out: Path, results: Path | None) -> str:
    """The plots, the report (printed) and, with ``results``, the page of a finished run."""
    plot_lengths(result, out / "performance_length.png")
    plot_sizes(result, out / "performance_size.png")
    report = performance_report(result)
    print(report)
    if results is not None:
        stem = results.stem
        figures = {
            f"{stem}_length.png": out / "performance_length.png",
            f"{stem}_size.png": out / "performance_size.png",
        }
        body = report.replace("(performance_length.png)", f"({stem}_length.png)")
        body = body.replace("(performance_size.png)", f"({stem}_size.png)")
        title = "Performance: long outputs, model size and study settings"
        write_results(results, title, body, command=result.get("command"), figures=figures)
    return report


def render_saved(path: Path, results: Path | None) -> str:
    """Re-render a finished run's page from its ``performance.json`` (the command that measured it
    stays the page's command); the flags are recomputed by today's report code."""
    result = json.loads(Path(path).read_text())
    o = result["options"]
    result.setdefault(
        "command",
        f"creditrl bench --performance --threads {result['threads']} --out {o['out']} --results {o['results']}",
    )
    result["flags"] = flags(result)
    return publish(result, Path(path).parent, results)


def options_from_args(args: Any) -> PerformanceOptions:
    opts = PerformanceOptions(
        policy=args.policy,
        trl=not args.no_trl,
        out=Path(args.out),
        results=Path(args.results) if args.results else None,
    )
    return quick_options(opts) if args.quick else opts
