"""creditrl's rollout and GRPO iteration against TRL and HF ``generate``, back to back in one
process, on the same model, batch and settings.

    python benchmarks/bench.py [--curve 50] [--scaling] [--out runs/bench] [--results docs/results/bench.md]
    python benchmarks/bench.py --render docs/results/bench.json --results docs/results/bench.md

Sections (each prints min / median / max over repeats, and ratios peer / creditrl):

1. ``peak``      -- a square fp32 matmul: the FLOP/s ceiling the update step is measured against.
2. ``decode``    -- tokens per second at batch ``prompts x group`` for HF ``generate``,
   :class:`~creditrl.policy.engines.base.HFEngine` and :class:`~creditrl.policy.engines.static.StaticEngine`,
   on two workloads: ``fixed`` (eos disabled, every row decodes ``max_new_tokens``) and
   ``rollout`` (the policy's own eos: what an RL iteration generates). Repeats are interleaved.
3. ``iteration`` -- one GRPO iteration (rollout, score, credit, update) through TRL's
   ``GRPOTrainer`` and through :class:`~creditrl.train.rl.RLTrainer`, in alternating rounds of a
   few iterations each (the first of every round dropped as warm-up); creditrl's rollout / update split; the update's
   achieved FLOP/s
   (``6 * non-embedding parameters * positions computed``, forward + backward) against ``peak``.
4. ``curve``     -- (``--curve N``) N iterations of each from the same start: mean reward per
   iteration, plotted together (``reward_curve.png``).
5. ``scaling``   -- (``--scaling``) creditrl's iteration time vs group size and vs max new tokens.

Peak RSS of the bench process is printed at the end. Results go to ``OUT/bench.json`` (and, with
``--results PAGE``, beside the page as PAGE's name with .json: ``--render`` writes the page again from it).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from bench_report import markdown_report, plot_curve
from common import log_fn, matmul_peak, spread, write_json
from creditrl.config import Config, load_config
from creditrl.config.loader import arith_config_path
from creditrl.experiments.report import command_line, peak_rss_mb, utc_stamp, write_results
from creditrl.policy.engines import HFEngine, SamplingParams, StaticEngine
from creditrl.policy.model import build_tiny, count_parameters, load_policy
from creditrl.policy.tokenizer import encode_prompt
from creditrl.tasks import Task, make_task


@dataclass
class BenchOptions:
    policy: str = "sft"  # "sft" (the arith config's cached SFT policy), "tiny" (random init) or a model path
    prompts: int = 16
    group: int = 8
    max_new_tokens: int = 48
    temperature: float = 1.0
    lr: float = 5e-5
    repeats: int = 5  # decode repeats per engine and workload
    iterations: int = 4  # iterations per trainer and round (the first of each is dropped as warm-up)
    rounds: int = 3  # creditrl and TRL alternate this many times, so drift in machine speed hits both
    curve: int = 0  # iterations of the learning-curve comparison (0 skips it)
    scaling: bool = False
    scaling_iterations: int = 4  # timed iterations per scaling setting (after one warm-up)
    groups: tuple[int, ...] = (4, 8, 16, 32)
    lengths: tuple[int, ...] = (32, 64, 128, 256)
    matmul_n: int = 2048
    trl: bool = True  # include TRL (an optional dependency: pip install 'creditrl[bench]')
    out: Path = field(default_factory=lambda: Path("runs/bench"))
    seed: int = 0
    results: Path | None = None  # also write the tables as a results page here (e.g. docs/results/bench.md)


def bench_config(opts: BenchOptions, overrides: list[str] | None = None, base: Path | None = None) -> Config:
    """``base`` (default: the arith config) at the bench's GRPO settings, then ``overrides``."""
    return load_config(
        base if base is not None else arith_config_path(False),
        [
            f"rollout.prompts_per_iter={opts.prompts}",
            f"rollout.group_size={opts.group}",
            f"rollout.max_new_tokens={opts.max_new_tokens}",
            f"rollout.temperature={opts.temperature}",
            f"optim.lr={opts.lr}",
            "optim.warmup_iterations=0",
            "loss.kl_coef=0",  # TRL at beta=0: no reference model
            "loss.aggregation=token-mean",
            "credit.estimator=grpo",
            "reward.source=outcome",
            "train.progress=false",
            f"train.seed={opts.seed}",
            *(overrides or []),
        ],
    )


def resolve_policy(opts: BenchOptions) -> str:
    """A model directory to start every peer from (the tiny preset is saved to a temp dir)."""
    if opts.policy == "sft":
        from creditrl.train.sft import cached_sft

        # the arith config's own SFT checkpoint (its cache key is that config, not the bench overrides)
        path, _ = cached_sft(load_config(arith_config_path(False)), progress=True)
        return str(path)
    if opts.policy == "tiny":
        model, tok = build_tiny(opts.seed)
        out = Path(tempfile.mkdtemp(prefix="creditrl-bench-tiny-"))
        model.save_pretrained(out)
        tok.save_pretrained(out)
        return str(out)
    return opts.policy


def bench_policy_and_prompts(n_prompts: int = 16) -> tuple[Any, Any, list[list[int]]]:
    """The bench's SFT policy (in eval mode), its tokenizer and ``n_prompts`` encoded 4-6-operation
    arithmetic prompts (train split, seed 0): the set-up the scripts in ``benchmarks/`` share."""
    model, tok = load_policy(resolve_policy(BenchOptions()))
    model.eval()
    task = make_task("arithmetic", min_ops=4, max_ops=6)
    return model, tok, [encode_prompt(tok, p.prompt) for p in task.sample(n_prompts, split="train", seed=0)]


def bench_decode(policy: str, opts: BenchOptions, log: Callable[[str], None]) -> dict[str, Any]:
    from hf_peer import hf_generate_throughput

    model, tok = load_policy(policy)
    model.eval()
    task = make_task("arithmetic", min_ops=4, max_ops=6)
    prompts = [encode_prompt(tok, p.prompt) for p in task.sample(opts.prompts, split="train", seed=opts.seed)]
    params = SamplingParams(max_new_tokens=opts.max_new_tokens, temperature=opts.temperature)
    out: dict[str, Any] = {}
    for workload in ("fixed", "rollout"):
        eos = tok.eos_token_id if workload == "rollout" else -1  # -1: no token ends a row
        engines = {
            "creditrl_static": StaticEngine(model, eos_id=eos, pad_id=tok.pad_token_id),
            # the same engine decoding every row, also the identical ones: share_rows' A/B
            "creditrl_static_every_row": StaticEngine(model, eos_id=eos, pad_id=tok.pad_token_id, share_rows=False),
            # the same engine without the compiled kernels (policy.kernels=torch): their A/B
            "creditrl_static_torch": StaticEngine(model, eos_id=eos, pad_id=tok.pad_token_id, kernels="torch"),
            "creditrl_hf_engine": HFEngine(model, eos_id=eos, pad_id=tok.pad_token_id),
        }
        rates: dict[str, list[float]] = {"hf_generate": [], **{k: [] for k in engines}}
        tokens: dict[str, int] = {}
        computed: list[float] = []  # share of row-steps the static engine computed (share_rows)
        # one untimed call of each first: first-call costs (numba loading its cached machine
        # code, allocator and thread-pool start-up) are not decode throughput
        hf_generate_throughput(
            model,
            prompts,
            opts.group,
            opts.max_new_tokens,
            temperature=opts.temperature,
            pad_id=tok.pad_token_id,
            eos_id=None if eos < 0 else eos,
            seed=opts.seed,
        )
        for engine in engines.values():
            engine.generate(prompts, opts.group, params, generator=torch.Generator().manual_seed(opts.seed))
        for r in range(opts.repeats):
            res = hf_generate_throughput(
                model,
                prompts,
                opts.group,
                opts.max_new_tokens,
                temperature=opts.temperature,
                pad_id=tok.pad_token_id,
                eos_id=None if eos < 0 else eos,
                seed=opts.seed + r,
            )
            rates["hf_generate"].append(res["tokens_per_s"])
            tokens["hf_generate"] = res["new_tokens"]
            for name, engine in engines.items():
                gen = torch.Generator().manual_seed(opts.seed + r)
                start = time.perf_counter()
                g = engine.generate(prompts, opts.group, params, generator=gen)
                elapsed = time.perf_counter() - start
                tokens[name] = sum(len(t) for t in g.tokens)
                rates[name].append(tokens[name] / elapsed)
                if name == "creditrl_static":
                    computed.append(engine.last_rows[0] / engine.last_rows[1])
        out[workload] = {name: {"tokens_per_s": spread(v), "new_tokens": tokens[name]} for name, v in rates.items()}
        ratio = statistics.median(rates["creditrl_static"]) / statistics.median(rates["hf_generate"])
        out[workload]["ratio_static_vs_hf_generate"] = ratio
        out[workload]["ratio_kernels_vs_tensor_ops"] = statistics.median(rates["creditrl_static"]) / statistics.median(
            rates["creditrl_static_torch"]
        )
        out[workload]["ratio_shared_vs_every_row"] = statistics.median(rates["creditrl_static"]) / statistics.median(
            rates["creditrl_static_every_row"]
        )
        out[workload]["computed_share"] = spread(computed)
        log(
            f"decode/{workload}: static {statistics.median(rates['creditrl_static']):,.0f} tok/s "
            f"({out[workload]['ratio_kernels_vs_tensor_ops']:.2f}x its tensor-op path, "
            f"{out[workload]['ratio_shared_vs_every_row']:.2f}x decoding every row; computed "
            f"{100 * statistics.median(computed):.0f}% of the row-steps), "
            f"HF generate {statistics.median(rates['hf_generate']):,.0f} tok/s -> {ratio:.2f}x"
        )
    return out


def creditrl_iterations(
    policy: str, opts: BenchOptions, n: int, overrides: list[str] | None = None, base: Path | None = None
) -> list[dict]:
    """``n`` GRPO iterations of :class:`~creditrl.train.rl.RLTrainer` from ``policy``: their metrics rows
    (``base``: the config under the bench's settings, default the arith config)."""
    from creditrl.train.rl import RLTrainer

    cfg = bench_config(opts, overrides, base)
    with tempfile.TemporaryDirectory(prefix="creditrl-bench-") as run_dir:
        trainer = RLTrainer.from_config(cfg, Path(run_dir), init_path=policy)
        return [trainer.iteration(i) for i in range(n)]


def trl_iterations(
    policy: str, opts: BenchOptions, n: int, task: Task | None = None, device: str = "cpu", precision: str = "fp32"
) -> list[dict]:
    """``n`` TRL GRPOTrainer steps from ``policy`` at the bench's settings on ``task`` (default the
    arith config's 4-6-operation arithmetic), on ``device`` in ``precision`` (``PeerSettings``)."""
    from trl_peer import PeerSettings, trl_grpo_run

    model, tok = load_policy(policy)
    settings = PeerSettings(
        prompts_per_iter=opts.prompts,
        group_size=opts.group,
        max_new_tokens=opts.max_new_tokens,
        temperature=opts.temperature,
        lr=opts.lr,
        seed=opts.seed,
        device=device,
        precision=precision,
    )
    return trl_grpo_run(model, tok, task or make_task("arithmetic", min_ops=4, max_ops=6), n, settings)


def update_model_flops(non_embedding: int, row: dict[str, Any]) -> float:
    """Model FLOPs of one iteration's update from its metrics ``row``: 6 N per position the update
    trained -- every row's real prompt and response tokens (``tokens/prompt`` + ``tokens/generated``;
    padding is not counted, as the packed pass does not compute it), times the share of rows
    trained (``update/skipped_rows``: exactly zero-advantage rows left out)."""
    positions = row["tokens/prompt"] + row["tokens/generated"]
    return 6 * non_embedding * positions * (1.0 - row.get("update/skipped_rows", 0.0))


def bench_iteration(policy: str, opts: BenchOptions, peak: float, log: Callable[[str], None]) -> dict[str, Any]:
    model, _ = load_policy(policy)
    n_params = count_parameters(model) - model.get_input_embeddings().weight.numel()
    rows: list[dict] = []
    every: list[dict] = []  # the same iterations with every row trained (no zero-advantage skipping)
    trl: list[dict] = []
    for _ in range(opts.rounds):
        rows += creditrl_iterations(policy, opts, opts.iterations)[1:]
        every += creditrl_iterations(policy, opts, opts.iterations, ["optim.skip_zero_advantage=false"])[1:]
        if opts.trl:
            trl += trl_iterations(policy, opts, opts.iterations)[1:]
    upd_flops = [update_model_flops(n_params, r) for r in rows]
    out: dict[str, Any] = {
        "creditrl": {
            "iter_s": spread([r["time/iter_s"] for r in rows]),
            "rollout_s": spread([r["time/rollout_s"] for r in rows]),
            "update_s": spread([r["time/update_s"] for r in rows]),
            "response_length": spread([r["response/length"] for r in rows]),
            "update_gflops": spread([f / r["time/update_s"] / 1e9 for f, r in zip(upd_flops, rows)]),
            "skipped_rows": spread([r.get("update/skipped_rows", 0.0) for r in rows]),
        },
        "creditrl_every_row": {
            "iter_s": spread([r["time/iter_s"] for r in every]),
            "update_s": spread([r["time/update_s"] for r in every]),
        },
        "non_embedding_parameters": n_params,
    }
    out["creditrl"]["update_share_of_peak"] = out["creditrl"]["update_gflops"]["median"] / peak
    log(
        f"iteration/creditrl: {out['creditrl']['iter_s']['median']:.3f} s (rollout "
        f"{out['creditrl']['rollout_s']['median']:.3f}, update {out['creditrl']['update_s']['median']:.3f}; "
        f"update {out['creditrl']['update_gflops']['median']:.0f} GFLOP/s = "
        f"{100 * out['creditrl']['update_share_of_peak']:.0f}% of peak; "
        f"{100 * out['creditrl']['skipped_rows']['median']:.0f}% of rows skipped with advantage 0)"
    )
    log(
        f"iteration/creditrl, every row trained: {out['creditrl_every_row']['iter_s']['median']:.3f} s "
        f"(update {out['creditrl_every_row']['update_s']['median']:.3f})"
    )
    if opts.trl:
        out["trl"] = {"iter_s": spread([r["time_s"] for r in trl])}
        out["ratio_trl_vs_creditrl"] = out["trl"]["iter_s"]["median"] / out["creditrl"]["iter_s"]["median"]
        out["ratio_trl_vs_creditrl_every_row"] = (
            out["trl"]["iter_s"]["median"] / out["creditrl_every_row"]["iter_s"]["median"]
        )
        log(
            f"iteration/TRL GRPOTrainer: {out['trl']['iter_s']['median']:.3f} s -> creditrl "
            f"{out['ratio_trl_vs_creditrl']:.2f}x faster ({out['ratio_trl_vs_creditrl_every_row']:.2f}x training "
            "every row)"
        )
    return out


def bench_curve(policy: str, opts: BenchOptions, log: Callable[[str], None]) -> dict[str, Any]:
    rows = creditrl_iterations(policy, opts, opts.curve)
    out: dict[str, Any] = {"creditrl": [r["reward/mean"] for r in rows]}
    if opts.trl:
        out["trl"] = [r["reward"] for r in trl_iterations(policy, opts, opts.curve)]
    for name, rewards in list(out.items()):
        se = statistics.stdev(rewards) / len(rewards) ** 0.5 if len(rewards) > 1 else 0.0
        half = len(rewards) // 2
        out[f"{name}_summary"] = {
            "mean": statistics.mean(rewards),
            "se": se,
            "first_half": statistics.mean(rewards[: max(1, half)]),
            "second_half": statistics.mean(rewards[half:]),
        }
        log(
            f"curve/{name}: mean reward {statistics.mean(rewards):.3f} +- {se:.3f} (first half "
            f"{out[f'{name}_summary']['first_half']:.3f}, second half {out[f'{name}_summary']['second_half']:.3f})"
        )
    a, b = out["creditrl"], out.get("trl", [])
    if len(b) > 2 and statistics.pstdev(a) > 0 and statistics.pstdev(b) > 0:  # undefined for a constant series
        out["correlation"] = statistics.correlation(a, b)
        log(f"curve: per-iteration correlation of the two reward series (same prompts): {out['correlation']:.2f}")
    return out


def bench_scaling(policy: str, opts: BenchOptions, log: Callable[[str], None]) -> list[dict[str, Any]]:
    table = []
    settings = [("group", g, [f"rollout.group_size={g}"]) for g in opts.groups]
    settings += [("max_new_tokens", t, [f"rollout.max_new_tokens={t}"]) for t in opts.lengths]
    for axis, value, overrides in settings:
        rows = creditrl_iterations(policy, opts, opts.scaling_iterations + 1, overrides)[1:]
        entry = {
            "axis": axis,
            "value": value,
            "iter_s": statistics.median(r["time/iter_s"] for r in rows),
            "rollout_s": statistics.median(r["time/rollout_s"] for r in rows),
            "update_s": statistics.median(r["time/update_s"] for r in rows),
            "response_length": statistics.median(r["response/length"] for r in rows),
            "samples": opts.prompts * (value if axis == "group" else opts.group),
        }
        table.append(entry)
        log(
            f"scaling/{axis}={value}: {entry['iter_s']:.3f} s (rollout {entry['rollout_s']:.3f}, "
            f"update {entry['update_s']:.3f}, mean length {entry['response_length']:.1f})"
        )
    return table


def run_bench(opts: BenchOptions) -> dict[str, Any]:
    opts.out.mkdir(parents=True, exist_ok=True)
    log = log_fn("benchmarks/bench.py", time.time())

    policy = resolve_policy(opts)
    result: dict[str, Any] = {
        "options": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(opts).items()},
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
    }
    result["peak_gflops"] = matmul_peak(opts.matmul_n)
    log(f"peak: fp32 {opts.matmul_n}^3 matmul {result['peak_gflops']['max']:.0f} GFLOP/s (max of 5)")
    result["decode"] = bench_decode(policy, opts, log)
    result["iteration"] = bench_iteration(policy, opts, result["peak_gflops"]["max"], log)
    if opts.curve:
        result["curve"] = bench_curve(policy, opts, log)
    if opts.scaling:
        result["scaling"] = bench_scaling(policy, opts, log)
    result["peak_rss_mb"] = peak_rss_mb()
    result["command"], result["date"] = command_line(), utc_stamp()
    log(f"peak RSS of the bench process: {result['peak_rss_mb']:.0f} MB")
    write_json(opts.out / "bench.json", result)
    publish(result, opts.out, opts.results)
    return result


def publish(result: dict[str, Any], out: Path, results: Path | None) -> str:
    """The report (printed) and, with ``results``, the page (dated when it was measured) with the run's
    JSON beside it (``results`` with the suffix .json), from which ``--render`` writes the page again."""
    report = markdown_report(result)
    print(report)
    if "curve" in result:
        out.mkdir(parents=True, exist_ok=True)
        plot_curve(result["curve"], out / "reward_curve.png")
    if results is not None:
        write_json(results.with_suffix(".json"), result, indent=1)
        figures = {}
        if "curve" in result:
            figures[f"{results.stem}_reward_curve.png"] = out / "reward_curve.png"
            report += f"\n\n![reward curves]({results.stem}_reward_curve.png)\n"
        title = "Speed: creditrl against TRL and HF generate"
        write_results(results, title, report, command=result.get("command"), figures=figures, stamp=result.get("date"))
    return report


def options_from_args(args: Any) -> BenchOptions:
    results = Path(args.results) if args.results else None
    opts = BenchOptions(
        policy=args.policy,
        out=Path(args.out),
        curve=args.curve,
        scaling=args.scaling,
        trl=not args.no_trl,
        results=results,
    )
    if args.quick:  # every section in seconds; the numbers mean nothing
        opts = BenchOptions(
            policy=args.policy if args.policy != "sft" else "tiny",
            prompts=2,
            group=2,
            max_new_tokens=8,
            repeats=2,
            iterations=2,
            rounds=1,
            curve=min(args.curve, 3),
            scaling=args.scaling,
            scaling_iterations=1,
            groups=(2, 4),
            lengths=(4, 8),
            matmul_n=256,
            trl=not args.no_trl,
            out=Path(args.out),
            results=results,
        )
    return opts


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--policy", default="sft", help="sft (the arith config's SFT policy), tiny (random init) or a model dir"
    )
    p.add_argument("--curve", type=int, default=0, metavar="N", help="also N-iteration reward curves, TRL vs creditrl")
    p.add_argument("--scaling", action="store_true", help="also iteration time vs group size and max new tokens")
    p.add_argument("--no-trl", action="store_true", help="skip the TRL peer (trl not installed)")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    p.add_argument("--quick", action="store_true", help="tiny sizes: every section in seconds (numbers meaningless)")
    p.add_argument("--out", default="runs/bench", help="where bench.json and the plot go")
    p.add_argument("--results", metavar="PAGE", help="also write the tables as a results page, its JSON beside it")
    p.add_argument("--render", metavar="JSON", help="only write the page again from a saved run's JSON (no measuring)")
    args = p.parse_args(argv)
    if args.render:
        result = json.loads(Path(args.render).read_text())
        publish(result, Path(args.out), Path(args.results) if args.results else None)
        return 0
    if args.threads:
        torch.set_num_threads(args.threads)
    run_bench(options_from_args(args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
