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
f. ``forward``, ``kl_skip`` -- the packed forward against the HF pass; what leaving zero-advantage
   rows out under a KL term would change.
g. ``profile``  -- where an iteration's time goes (study arith.yaml, the first length, the middle
   size), by stage and by kind of work (:mod:`~creditrl.bench.perf_profile`).

Results go to ``OUT/performance.json`` and the plots ``OUT/performance_length.png`` and
``OUT/performance_size.png``; the markdown report is printed (and written with ``--results PAGE``, with
the run's JSON beside it as PAGE's name with .json: ``--render`` and ``--update`` take that file).

The code follows the sections: :mod:`~creditrl.bench.perf_options` (the sizes),
:mod:`~creditrl.bench.perf_points` (a, b, d; the limits in :mod:`~creditrl.bench.limits`),
:mod:`~creditrl.bench.perf_study` (c, f),
:mod:`~creditrl.bench.perf_rss` (e), :mod:`~creditrl.bench.perf_profile` (g),
:mod:`~creditrl.bench.performance_report` (the page), :mod:`~creditrl.bench.perf_flags` (the flagged points
and what explains them), :mod:`~creditrl.bench.perf_plots` (the plots); this module runs them in order.
"""

from __future__ import annotations

import json
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from creditrl.bench.limits import copy_bandwidth, matmul_peak
from creditrl.bench.perf_flags import flags
from creditrl.bench.perf_options import ModelSize, PerformanceOptions, quick_options
from creditrl.bench.perf_plots import plot_lengths, plot_sizes
from creditrl.bench.perf_points import (
    _log_fn,
    bench_lengths,
    bench_sizes,
    decode_bytes,
    save_never_eos_model,
)
from creditrl.bench.perf_profile import profile_workloads
from creditrl.bench.perf_rss import bench_rss
from creditrl.bench.perf_study import (
    bench_forward,
    bench_kl_skip,
    bench_study,
    compare_rows,
    summarise_run,
)
from creditrl.bench.performance_report import performance_report
from creditrl.experiments.report import command_line, peak_rss_mb, utc_stamp, write_results

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
    result["date"] = utc_stamp()
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
    if opts.profile:
        result["profile"] = profile_workloads(opts, threads, log)
    result["peak_rss_mb"] = peak_rss_mb()
    result["flags"] = flags(result)
    log(f"peak RSS of the bench process: {result['peak_rss_mb']:.0f} MB; {len(result['flags'])} points flagged")
    (opts.out / "performance.json").write_text(json.dumps(result, indent=2, default=str))
    publish(result, opts.out, opts.results)
    return result


def publish(result: dict[str, Any], out: Path, results: Path | None) -> str:
    """The plots, the report (printed) and, with ``results``, the page of a finished run (dated
    when it was measured) and the run's JSON beside it (``results`` with the suffix .json)."""
    plot_lengths(result, out / "performance_length.png")
    plot_sizes(result, out / "performance_size.png")
    report = performance_report(result)
    print(report)
    if results is not None:
        # the run itself next to its page, so that a later --render or --update starts from the repository
        results.parent.mkdir(parents=True, exist_ok=True)
        results.with_suffix(".json").write_text(json.dumps(result, indent=1, default=str))
        stem = results.stem
        figures = {
            f"{stem}_length.png": out / "performance_length.png",
            f"{stem}_size.png": out / "performance_size.png",
        }
        body = report.replace("(performance_length.png)", f"({stem}_length.png)")
        body = body.replace("(performance_size.png)", f"({stem}_size.png)")
        title = "Performance: long outputs, model size and study settings"
        write_results(results, title, body, command=result.get("command"), figures=figures, stamp=result.get("date"))
    return report


def _load_saved(path: Path) -> dict[str, Any]:
    result = json.loads(Path(path).read_text())
    o = result["options"]
    result.setdefault(
        "command",
        f"creditrl bench --performance --threads {result['threads']} --out {o['out']} --results {o['results']}",
    )
    result.setdefault("date", utc_stamp(Path(path).stat().st_mtime))  # a run saved before runs were dated
    return result


def render_saved(path: Path, results: Path | None) -> str:
    """Re-render a finished run's page from its ``performance.json`` (the command that measured it
    and its date stay the page's); the flags are recomputed by today's report code."""
    result = _load_saved(path)
    result["flags"] = flags(result)
    return publish(result, Path(path).parent, results)


# the sections that stand alone, so they can be measured again into a saved run
REMEASURABLE = {
    "study": bench_study,
    "rss": bench_rss,
    "forward": bench_forward,
    "kl_skip": bench_kl_skip,
    "profile": profile_workloads,
}


def remeasure(path: Path, sections: list[str], opts: PerformanceOptions) -> dict[str, Any]:
    """Measure ``sections`` (of :data:`REMEASURABLE`) again with ``opts`` and put them into the
    saved run at ``path``: its ``performance.json`` is rewritten and its page republished; the page
    names each re-measured section with its own command and date (the others keep the run's)."""
    unknown = sorted(set(sections) - set(REMEASURABLE))
    if unknown:
        raise ValueError(f"--sections: unknown {', '.join(unknown)}; valid: {', '.join(REMEASURABLE)}")
    result = _load_saved(path)
    if result["threads"] != torch.get_num_threads():
        raise ValueError(
            f"--update {path}: that run used {result['threads']} threads and this one {torch.get_num_threads()}; "
            "pass --threads to match"
        )
    log = _log_fn(time.time())
    for name in sections:
        result[name] = REMEASURABLE[name](opts, result["threads"], log)
        result.setdefault("remeasured", {})[name] = {"command": command_line(), "date": utc_stamp()}
    result["flags"] = flags(result)
    Path(path).write_text(json.dumps(result, indent=2, default=str))
    publish(result, Path(path).parent, opts.results)
    return result


def options_from_args(args: Any) -> PerformanceOptions:
    opts = PerformanceOptions(
        policy=args.policy,
        trl=not args.no_trl,
        out=Path(args.out),
        results=Path(args.results) if args.results else None,
    )
    return quick_options(opts) if args.quick else opts
