"""Section e of `benchmarks/performance.py`: the peak RSS of one creditrl iteration of 128
samples x 1,024 tokens at the ~10M size, in a subprocess, with the resident set sampled by stage
and the stage in which the process's peak was reached."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from creditrl.config import load_config
from creditrl.config.loader import packaged_config
from creditrl.experiments.report import peak_rss_mb
from creditrl.tasks.chain import steps_for_tokens
from perf_options import BENCHMARKS, CREDITRL_SRC, ModelSize, PerformanceOptions
from perf_points import save_never_eos_model

_ROW_STAGES = ("rollout", "reference", "score", "value", "credit", "update")  # in the order they run


class RssSampler:
    """The resident set size of this process every ``every`` seconds while the block runs (from
    ``/proc/self/statm``; empty where there is none), with the time of each sample; and with it the
    process's peak so far (:func:`peak_rss_mb`), which no spike between two samples escapes."""

    def __init__(self, every: float = 0.02) -> None:
        self.every, self.samples, self.highs, self._stop = every, [], [], threading.Event()

    def _run(self) -> None:
        page = os.sysconf("SC_PAGE_SIZE")
        while not self._stop.is_set():
            try:
                resident = int(Path("/proc/self/statm").read_text().split()[1])
            except OSError:
                return
            now = time.perf_counter()
            self.samples.append((now, resident * page / 2**20))
            self.highs.append((now, peak_rss_mb()))
            self._stop.wait(self.every)

    def __enter__(self) -> RssSampler:
        self.start = time.perf_counter()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def peak_stage(self, row: dict[str, float]) -> str:
        """The stage of ``row`` during which the process's peak (:func:`peak_rss_mb`) was reached: the
        first sample that saw its final value, less one interval (it rose before that sample)."""
        if not self.highs:
            return "unknown"
        final = self.highs[-1][1]
        at = next(t for t, mb in self.highs if mb >= final) - self.every
        t = self.start
        if at < t:
            return "before the iteration"
        for stage in _ROW_STAGES:
            t += row.get(f"time/{stage}_s", 0.0)
            if at <= t:
                return stage
        return "after the stages"

    def stage_peaks(self, row: dict[str, float]) -> dict[str, float]:
        """The largest sample (MB) within each stage of an iteration's metrics ``row``: the stages
        run one after another from the block's start, for their ``time/<stage>_s``; a stage shorter
        than the sampling interval gets the first sample after it."""
        out, t = {}, self.start
        for stage in _ROW_STAGES:
            seconds = row.get(f"time/{stage}_s", 0.0)
            end = t + seconds
            inside = [mb for at, mb in self.samples if t <= at <= end]
            if not inside and seconds > 0:  # shorter than the sampling interval: the next sample after it
                inside = [mb for at, mb in self.samples if at > end][:1] or [mb for _, mb in self.samples][-1:]
            if inside:
                out[stage] = max(inside)
            t = end
        return out


def rss_child(spec_json: str) -> None:
    """(In a subprocess.) One creditrl iteration on chain.yaml (KL on) from a never-eos model of
    ``spec["size"]``: prints one JSON line with its peak RSS (this process) and timings."""
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
        with RssSampler() as rss:
            row = trainer.iteration(0)
    print(
        json.dumps(
            {
                "peak_rss_mb": peak_rss_mb(),
                "stage_peak_mb": rss.stage_peaks(row),
                "peak_stage": rss.peak_stage(row),
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
    code = "import sys; from perf_rss import rss_child; rss_child(sys.argv[1])"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(CREDITRL_SRC), str(BENCHMARKS)])}
    proc = subprocess.run([sys.executable, "-c", code, json.dumps(spec)], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"the peak-RSS subprocess exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    res.update(spec=spec)
    log(
        f"rss: one iteration of {res['samples']} samples x {opts.rss_tokens} tokens at {opts.rss_size.name} "
        f"({res['response_length']:.0f} tokens/row, {res['iter_s']:.1f} s): peak RSS {res['peak_rss_mb']:,.0f} MB"
    )
    return res
