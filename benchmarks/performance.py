"""Long outputs, larger models and whole study runs, against the peers and against the machine's own
limits.

    python benchmarks/performance.py --out runs/performance --results docs/results/performance.md \
        [--baseline DIR --baseline-name NAME] [--min-speedup 3 --min-peak-share 0.5 ...]
    python benchmarks/performance.py --render docs/results/performance.json --results docs/results/performance.md
    python benchmarks/performance.py --update docs/results/performance.json --sections study,rss

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
   chain.yaml: samples/s and the share of every stage; and, with ``--baseline DIR`` (a checkout of
   older code the user made, e.g. ``git worktree add DIR COMMIT``), arith.yaml on it against the current
   code, interleaved, same seed and interpreter: samples/s, the speed-up and whether their metrics rows agree.
d. ``limits``   -- a STREAM-style copy (bandwidth) and the fp32 matmul peak, in this process; the
   decode's bytes-per-token arithmetic (:func:`decode_bytes`) against the copy bandwidth and the
   update's model FLOP/s against the peak, at every point of (a) and (b).
e. ``rss``      -- peak RSS of a subprocess running one creditrl iteration of 128 samples x 1,024
   tokens at the ~10M size.
f. ``forward``, ``kl_skip`` -- the packed forward against the HF pass; what leaving zero-advantage
   rows out under a KL term would change.
g. ``profile``  -- where an iteration's time goes (study arith.yaml, the first length, the middle
   size), by stage and by kind of work (`perf_profile.py`).

Results go to ``OUT/performance.json`` and the plots ``OUT/performance_length.png`` and
``OUT/performance_size.png``; the markdown report is printed (and written with ``--results PAGE``, with
the run's JSON beside it as PAGE's name with .json: ``--render`` and ``--update`` take that file). The
targets (``--min-speedup`` ...) are arguments, kept in the JSON; the page shows each point against them.

The code follows the sections: `perf_options.py` (the sizes),
`perf_points.py` (a, b, d; the limits in :mod:`common.py`),
`perf_study.py` (c, f),
`perf_rss.py` (e), `perf_profile.py` (g),
`performance_report.py` (the page), `perf_targets.py` (the targets and
bounds), `perf_plots.py` (the plots), `common.py` (the limits); this script runs them in order.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from common import copy_bandwidth, log_fn, matmul_peak, write_json
from creditrl.experiments.report import command_line, peak_rss_mb, utc_stamp, write_results
from perf_options import PerformanceOptions, Targets, quick_options
from perf_plots import plot_lengths, plot_sizes
from perf_points import bench_lengths, bench_sizes
from perf_profile import profile_workloads
from perf_rss import bench_rss
from perf_study import bench_forward, bench_kl_skip, bench_study
from perf_targets import TARGET_KEYS
from performance_report import performance_report

# -- the command ---------------------------------------------------------------------------------------------


def run_performance(opts: PerformanceOptions) -> dict[str, Any]:
    if opts.iterations < 2 or opts.rounds < 1 or opts.repeats < 1:
        raise ValueError("need iterations >= 2 (the first of a round is warm-up), rounds >= 1 and repeats >= 1")
    opts.out.mkdir(parents=True, exist_ok=True)
    log = log_fn("benchmarks/performance.py", time.time())
    threads = torch.get_num_threads()
    options = json.loads(json.dumps(asdict(opts), default=str))  # paths as strings
    result: dict[str, Any] = {"options": options, "threads": threads, "torch": torch.__version__}
    result["targets"] = asdict(opts.targets)
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
    write_json(partial, result)
    result["study"] = bench_study(opts, threads, log)
    write_json(partial, result)
    if opts.rss:
        result["rss"] = bench_rss(opts, threads, log)
    result["forward"] = bench_forward(opts, threads, log)
    if opts.kl_skip:
        result["kl_skip"] = bench_kl_skip(opts, threads, log)
    if opts.profile:
        result["profile"] = profile_workloads(opts, threads, log)
    result["peak_rss_mb"] = peak_rss_mb()
    log(f"peak RSS of the bench process: {result['peak_rss_mb']:.0f} MB")
    write_json(opts.out / "performance.json", result)
    publish(result, opts.out, opts.results)
    return result


def publish(result: dict[str, Any], out: Path, results: Path | None) -> str:
    """The plots, the report (printed) and, with ``results``, the page of a finished run (dated
    when it was measured) and the run's JSON beside it (``results`` with the suffix .json)."""
    plot_lengths(result, out / "performance_length.png")
    plot_sizes(result, out / "performance_size.png")
    report = performance_report(result, result.get("targets", {}))
    print(report)
    if results is not None:
        # the run itself next to its page, so that a later --render or --update starts from the repository
        write_json(results.with_suffix(".json"), result, indent=1)
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


def load_saved(path: Path, targets: dict[str, float | None] | None = None) -> dict[str, Any]:
    """A saved run, its targets those it was measured with, replaced by each of ``targets`` not None."""
    result = json.loads(Path(path).read_text())
    result.pop("flags", None)  # the verdict lines of runs saved before the targets became a table
    result.setdefault("date", utc_stamp(Path(path).stat().st_mtime))  # a run saved before runs were dated
    kept = result.get("targets", {})
    result["targets"] = {
        k: (targets or {}).get(k) if (targets or {}).get(k) is not None else kept.get(k) for k in TARGET_KEYS
    }
    return result


def render_saved(path: Path, results: Path | None, targets: dict[str, float | None] | None = None) -> str:
    """Re-render a finished run's page from its ``performance.json`` (the command that measured it
    and its date stay the page's), against its targets or ``targets``."""
    return publish(load_saved(path, targets), Path(path).parent, results)


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
    result = load_saved(path, asdict(opts.targets))
    if result["threads"] != torch.get_num_threads():
        raise ValueError(
            f"--update {path}: that run used {result['threads']} threads and this one {torch.get_num_threads()}; "
            "pass --threads to match"
        )
    log = log_fn("benchmarks/performance.py", time.time())
    for name in sections:
        result[name] = REMEASURABLE[name](opts, result["threads"], log)
        result.setdefault("remeasured", {})[name] = {"command": command_line(), "date": utc_stamp()}
    write_json(Path(path), result)
    publish(result, Path(path).parent, opts.results)
    return result


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--policy", default="sft", help="sft (the chain config's SFT policy), tiny (random init) or a dir")
    p.add_argument("--no-trl", action="store_true", help="skip the TRL peer (trl not installed)")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    p.add_argument("--quick", action="store_true", help="tiny sizes: every section in seconds (numbers meaningless)")
    p.add_argument("--out", default="runs/bench", help="where performance.json and the plots go")
    p.add_argument("--results", metavar="PAGE", help="also write the page (e.g. docs/results/performance.md)")
    p.add_argument("--render", metavar="JSON", help="only re-render a saved run's page from its JSON (no measuring)")
    p.add_argument("--update", metavar="JSON", help="with --sections: the saved run the sections go into")
    p.add_argument(
        "--sections",
        metavar="LIST",
        help="with --update: measure only these again (comma-separated: study, rss, forward, kl_skip, profile)",
    )
    p.add_argument("--baseline", metavar="DIR", type=Path, help="a checkout of older code to run arith.yaml against")
    p.add_argument("--baseline-name", default="", help="the baseline's name on the page (default: DIR's name)")
    t = p.add_argument_group("targets (each optional; the page shows every point against those given)")
    t.add_argument("--min-speedup", type=float, help="iteration vs TRL and decode vs HF generate (x)")
    t.add_argument("--min-bandwidth-share", type=float, help="decode at the longest length vs copy bandwidth (0-1)")
    t.add_argument("--min-peak-share", type=float, help="update model FLOP/s vs the matmul peak (0-1)")
    t.add_argument("--min-baseline-speedup", type=float, help="arith.yaml's samples/s vs the baseline's (x)")
    t.add_argument("--max-rss-mb", type=float, help="section e's peak RSS (MB)")
    return p


def options_from_args(args: argparse.Namespace) -> PerformanceOptions:
    opts = PerformanceOptions(
        policy=args.policy,
        trl=not args.no_trl,
        out=Path(args.out),
        results=Path(args.results) if args.results else None,
        baseline=args.baseline,
        baseline_name=args.baseline_name,
        targets=Targets(**{k: getattr(args, k) for k in TARGET_KEYS}),
    )
    return quick_options(opts) if args.quick else opts


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    opts = options_from_args(args)
    if args.render:
        render_saved(Path(args.render), opts.results, asdict(opts.targets))
    elif args.sections or args.update:
        if not (args.sections and args.update):
            raise SystemExit("benchmarks/performance.py: --sections and --update go together")
        remeasure(Path(args.update), args.sections.split(","), opts)
    else:
        run_performance(opts)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
