"""Sections c and f of `benchmarks/performance.py`: whole `creditrl train` runs (and a baseline
checkout's, back to back), the packed forward against the HF pass and what the KL
row-skipping approximation changes (section e, the peak RSS, is `perf_rss.py`)."""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from common import median_ratio
from creditrl.config import Config, load_config
from creditrl.config.loader import packaged_config
from creditrl.inspect.data import load_metrics
from perf_options import CREDITRL_SRC, PerformanceOptions

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
    rows = load_metrics(run_dir)
    return {"command": cmd, "src": str(src), **summarise_run(rows, wall, stamps)}


_KEPT = ("iteration", "eval/accuracy", "reward/mean", "tokens/generated", "loss/policy")  # each run's rows, compared


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
        "rows": [{k: r[k] for k in _KEPT if k in r} for r in rows],
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
    out["samples"] = _first_sample_difference(a, by_it)
    return out


def _first_sample_difference(a: list[dict], by_it: dict[int, dict]) -> dict[str, Any] | None:
    """The first iteration whose samples differ (its generated token count does; None: none does),
    the largest absolute difference of the policy loss before it -- the float rounding the two codes'
    updates differ by while they train on the same samples -- and the median |policy loss| before it,
    its scale (None where the rows carry no token counts)."""
    first, diffs, scale = None, [0.0], []
    for r in a:
        o = by_it.get(r["iteration"], {})
        if "tokens/generated" not in r or "tokens/generated" not in o:
            continue
        if r["tokens/generated"] != o["tokens/generated"]:
            first = r["iteration"]
            break
        if "loss/policy" in r and "loss/policy" in o:
            diffs.append(abs(r["loss/policy"] - o["loss/policy"]))
            scale.append(abs(o["loss/policy"]))
    if first is None and not scale:
        return None  # rows kept without their token counts: unknown
    return {
        "first_differing_iteration": first,
        "loss_abs_diff_before": max(diffs),
        "loss_scale_before": statistics.median(scale) if scale else 0.0,
    }


def baseline_source(checkout: Path) -> Path:
    """The ``src`` folder of a checkout of the baseline (made by the user, e.g. ``git worktree add DIR
    COMMIT``); its ``creditrl train`` runs with this interpreter, so the baseline must import under it."""
    src = Path(checkout).resolve() / "src"
    if not (src / "creditrl" / "configs" / "arith.yaml").is_file():
        raise ValueError(f"--baseline {checkout}: not a creditrl checkout (no src/creditrl/configs/arith.yaml)")
    return src


def baseline_label(opts: PerformanceOptions) -> str:
    """The baseline's name on the page: ``--baseline-name``, else its checkout folder's name."""
    return opts.baseline_name or Path(opts.baseline or "").resolve().name


def study_overrides_of(opts: PerformanceOptions, name: str, threads: int) -> list[str]:
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
        _ensure_sft(name, study_overrides_of(opts, name, threads), log)
        if name == "arith" and opts.baseline:
            continue  # the baseline comparison's runs of the current code are the arith study runs
        r = timed_train(CREDITRL_SRC, packaged_config(name), study_overrides_of(opts, name, threads), runs_dir / name)
        out["runs"][name] = [r]
        _log_run(log, name, r)
    if opts.baseline:
        overrides = study_overrides_of(opts, "arith", threads)
        if "arith" not in opts.study:
            _ensure_sft("arith", overrides, log)
        old: list[dict] = []
        new: list[dict] = []
        src, name = baseline_source(opts.baseline), baseline_label(opts)
        config = src / "creditrl/configs/arith.yaml"
        if opts.baseline_warmup:  # untimed: a fresh checkout's numba cache and bytecode, and the current code's
            warm = [*overrides, "train.iterations=1"]
            timed_train(src, config, warm, runs_dir / f"warmup-{name}")
            timed_train(CREDITRL_SRC, packaged_config("arith"), warm, runs_dir / "warmup")
            log(f"study baseline: warm-up runs of {name} and of the current code done")
        for i in range(opts.baseline_rounds):  # old, new, old, new
            old.append(timed_train(src, config, overrides, runs_dir / f"arith-{name}-{i}"))
            _log_run(log, f"arith at {name} #{i + 1}", old[-1])
            new.append(timed_train(CREDITRL_SRC, packaged_config("arith"), overrides, runs_dir / f"arith-{i}"))
            _log_run(log, f"arith, current code #{i + 1}", new[-1])
        out["runs"]["arith"] = new
        agree = compare_rows(old[0]["rows"], new[0]["rows"])
        out["baseline"] = {
            "commit": name,
            "warmup": opts.baseline_warmup,
            "old": old,
            "speedup": median_ratio([r["wall_s"] for r in old], [r["wall_s"] for r in new]),
            "speedup_iterations": median_ratio([r["iterations_s"] for r in old], [r["iterations_s"] for r in new]),
            "agreement": agree,
            "same_code_agreement": compare_rows(new[0]["rows"], new[-1]["rows"]) if len(new) > 1 else None,
        }
        b = out["baseline"]
        log(
            f"study baseline: current code {b['speedup']:.2f}x the samples/s of {name} end to end "
            f"({b['speedup_iterations']:.2f}x within iterations); largest |difference| eval/accuracy "
            f"{agree['eval/accuracy']['max_abs_diff']}, reward/mean {agree['reward/mean']['max_abs_diff']}"
        )
    return out


# -- (f): the packed forward against the HF pass, and the KL row-skipping approximation --------------------------


def study_start(name: str, overrides: list[str]) -> tuple[Config, str]:
    """A study config and the path its run starts from (the cached SFT policy, or policy.model)."""
    from creditrl.train.build import start_policy

    cfg = load_config(packaged_config(name), overrides)
    return cfg, start_policy(cfg, progress=True)


def bench_forward(opts: PerformanceOptions, threads: int, log: Callable[[str], None]) -> dict[str, Any]:
    from forward_ab import forward_ab

    out: dict[str, Any] = {}
    for name in opts.forward:
        cfg, start = study_start(name, study_overrides_of(opts, name, threads))
        r = out[name] = forward_ab(cfg, start, opts.forward_repeats)
        log(
            f"forward/{name}: {r['rows']} rows, {r['response_tokens']:,} response tokens of {r['padded_positions']:,} "
            f"padded positions; packed {r['speedup_infer']:.2f}x the HF pass without gradient, "
            f"{r['speedup_train']:.2f}x forward + backward; max |d log p| {r['max_abs_logprob_diff']:.1e}, "
            f"gradient distance {r['grad_relative_distance']:.1e}"
        )
    return out


def bench_kl_skip(opts: PerformanceOptions, threads: int, log: Callable[[str], None]) -> dict[str, Any]:
    from kl_skip import kl_skip_effect

    overrides = [o for o in study_overrides_of(opts, "arith", threads) if not o.startswith("train.iterations=")]
    cfg, start = study_start("arith", [*overrides, "train.eval_every=100000"])
    out = kl_skip_effect(cfg, start, opts.kl_skip_iterations, opts.kl_skip_at)
    m = out["median"]
    log(
        f"kl_skip: gradient cosine {m['cosine']:.4f}, relative distance {m['relative_distance']:.3f} with "
        f"{100 * m['skipped_rows']:.0f}% of rows left out; update {m['update_s_exact']:.3f} s exact vs "
        f"{m['update_s_approx']:.3f} s approximate (medians over iterations {list(opts.kl_skip_at)})"
    )
    return out
