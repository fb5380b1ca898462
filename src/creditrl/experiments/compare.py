"""``creditrl compare GRID.yaml``: a grid of arms x seeds at a fixed generation budget per run.

Grid file (every key but ``arms``/``grid`` optional)::

    name: estimators          # default: the file's stem; output in runs/compare-<name>
    base: arith               # demo | arith | demo_quick (packaged configs) | a config path
                              # (relative to the grid file or cwd); default demo
    set: [train.eval_every=10]  # overrides common to every run (after base, before the arm's)
    seeds: [0, 1, 2]
    budget: {tokens: 400000}  # or {samples: 20000}, per run
    target: {gain: 0.10}      # "to reach": absolute accuracy (0.5) or {gain: g} over the arm's start
    init: sft                 # sft = the cached SFT of base + set, or a checkpoint directory
    arms:                     # name -> overrides
      grpo: [credit.estimator=grpo]
    grid:                     # key -> values, expanded as a cartesian product (x arms when both)
      task.args: [{min_ops: 4, max_ops: 6}, {min_ops: 5, max_ops: 7}]

Budgets: ``tokens`` sets ``train.max_tokens`` (and, before ``set``, ``train.iterations`` to
1,000,000 so the budget ends a run; schedules over training such as ``credit.lam_end`` follow
``train.iterations``, so set it in ``set`` to about the budget's iteration count if you use one,
large enough for the budget to be reached, or the run is never "finished"); ``samples`` sets ``train.iterations =
ceil(samples / (prompts_per_iter x group_size))`` per arm, since the trainer has no samples
budget. Every run goes through :func:`creditrl.experiments.seeds.run_arms`: a finished run in
the output directory is read back, not rerun (an arm is keyed by its name, not its overrides).
"""

from __future__ import annotations

import csv
import io
import itertools
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from creditrl.config import ConfigError, load_config
from creditrl.config.loader import arith_config_path, demo_config_path, packaged_config
from creditrl.experiments.report import eval_rows
from creditrl.experiments.seeds import launch_settings, mean_ci95, plot_seed_curves, run_arms, slug
from creditrl.experiments.summaries import read_summary
from creditrl.train.resolve import checked

KEYS = {"name", "base", "set", "seeds", "budget", "target", "init", "arms", "grid", "reference"}
PACKAGED = ("demo", "demo_quick", "arith")  # configs shipped in creditrl/configs, named in a grid's base
TOKEN_ITERATIONS = 1_000_000
# --quick: demo_quick sizes on any base, a tiny budget, 2 seeds (numbers meaningless)
QUICK_SET = [
    "sft.steps=20",
    "sft.batch_size=16",
    "sft.warmup_steps=5",
    "rollout.prompts_per_iter=4",
    "rollout.group_size=4",
    "rollout.max_new_tokens=40",
    "train.eval_every=1",
    "train.eval_size=16",
    "train.checkpoint_every=1000",
]
QUICK_BUDGET = {"tokens": 600, "samples": 32}


@dataclass
class Grid:
    name: str
    base: Path
    common: list[str]
    seeds: list[int]
    unit: str  # tokens | samples
    budget: int
    target: float | None  # absolute accuracy target, or None when gain is set
    gain: float | None  # target = the arm's start accuracy + gain
    init: str
    arms: dict[str, list[str]]
    reference: str | None = None  # the arm every other is compared with, problem by problem


def _value_text(v: Any) -> str:
    """An override's value as YAML text (``gae``, ``0.5``, ``{min_ops: 5, max_ops: 7}``)."""
    if isinstance(v, str):
        return v
    return yaml.safe_dump(v, default_flow_style=True, sort_keys=False, width=10**6).strip().removesuffix("\n...")


def expand_grid(grid: dict[str, list[Any]], where: str = "grid") -> dict[str, list[str]]:
    """``{"credit.estimator": ["grpo", "rloo"], "credit.lam": [0, 1]}`` -> 4 arms named
    ``estimator=grpo, lam=0`` ... in cartesian (first key slowest) order; a key's last part names
    it unless two keys share that part, then the full key does."""
    if not isinstance(grid, dict) or not grid:
        raise ConfigError(f"{where}: 'grid' must be a non-empty mapping key -> [values]")
    for key, values in grid.items():
        if not isinstance(values, list) or not values:
            raise ConfigError(f"{where}: grid key '{key}' must be a non-empty list of values, got {values!r}")
    leaves = [str(k).split(".")[-1] for k in grid]
    label = {k: (leaf if leaves.count(leaf) == 1 else str(k)) for k, leaf in zip(grid, leaves)}
    arms: dict[str, list[str]] = {}
    for point in itertools.product(*grid.values()):
        pairs = list(zip(grid, point))
        arms[", ".join(f"{label[k]}={_value_text(v)}" for k, v in pairs)] = [f"{k}={_value_text(v)}" for k, v in pairs]
    return arms


def _base_path(raw: Any, here: Path, where: str) -> Path:
    if raw is None:
        return demo_config_path(False)
    if raw in PACKAGED:
        return packaged_config(str(raw))
    for p in (here / str(raw), Path(str(raw))):
        if p.exists():
            return p
    raise ConfigError(f"{where}: key 'base': config file not found: {raw}")


def _str_list(raw: Any, where: str) -> list[str]:
    raw = [raw] if isinstance(raw, str) else raw
    if not isinstance(raw, list) or not all(isinstance(x, str) and "=" in x for x in raw):
        raise ConfigError(f"{where} must be a list of 'key=value' overrides, got {raw!r}")
    return list(raw)


def load_grid(path: str | Path, *, quick: bool = False, seeds: int | None = None) -> Grid:
    """Parse and validate a grid file; every arm's config is loaded once so a bad key fails here."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"grid file not found: {path}")
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a grid file is a mapping (base, set, seeds, budget, target, init, arms, grid)")
    if unknown := set(data) - KEYS:
        raise ConfigError(f"{path}: unknown key(s) {sorted(unknown)}; expected some of {sorted(KEYS)}")
    base = _base_path(data.get("base"), path.parent, str(path))
    if quick and base in (demo_config_path(False), arith_config_path(False)):
        base = demo_config_path(True)
    common = _str_list(data.get("set", []), f"{path}: key 'set'") + (QUICK_SET if quick else [])
    seed_list = data.get("seeds", [0, 1, 2])
    if not isinstance(seed_list, list) or not seed_list or not all(isinstance(s, int) for s in seed_list):
        raise ConfigError(f"{path}: key 'seeds' must be a non-empty list of integers, got {seed_list!r}")
    seed_list = list(range(seeds)) if seeds is not None else (seed_list[:2] if quick else seed_list)
    budget = data.get("budget")
    if not (
        isinstance(budget, dict)
        and len(budget) == 1
        and next(iter(budget)) in ("tokens", "samples")
        and isinstance(next(iter(budget.values())), int)
        and next(iter(budget.values())) > 0
    ):
        raise ConfigError(f"{path}: key 'budget' must be {{tokens: N}} or {{samples: N}} with N > 0, got {budget!r}")
    ((unit, amount),) = budget.items()
    target = data.get("target", {"gain": 0.10})
    if isinstance(target, dict) and set(target) == {"gain"} and isinstance(target["gain"], (int, float)):
        absolute, gain = None, float(target["gain"])
    elif isinstance(target, (int, float)) and not isinstance(target, bool) and 0 <= target <= 1:
        absolute, gain = float(target), None
    else:
        raise ConfigError(f"{path}: key 'target' must be an accuracy in [0, 1] or {{gain: g}}, got {target!r}")
    init = data.get("init", "sft")
    if not isinstance(init, str) or (init != "sft" and not Path(init).exists()):
        raise ConfigError(f"{path}: key 'init' must be 'sft' or an existing checkpoint directory, got {init!r}")
    if "arms" not in data and "grid" not in data:
        raise ConfigError(f"{path}: needs 'arms' (name -> overrides) or 'grid' (key -> values), or both")
    arms = data.get("arms", {"": []})
    if not isinstance(arms, dict) or not arms:
        raise ConfigError(f"{path}: key 'arms' must be a non-empty mapping name -> [overrides]")
    arms = {str(k): _str_list(v or [], f"{path}: arm '{k}'") for k, v in arms.items()}
    if "grid" in data:
        points = expand_grid(data["grid"], str(path))
        arms = {
            ", ".join(x for x in (a, p) if x): over + pover for a, over in arms.items() for p, pover in points.items()
        }
    for name, over in arms.items():
        try:
            checked(load_config(base, common + over))
        except ConfigError as exc:
            raise ConfigError(f"{path}: arm '{name}': {exc}") from exc
    reference = data.get("reference")
    if reference is not None and reference not in arms:
        raise ConfigError(f"{path}: key 'reference': no arm {reference!r}; arms: {', '.join(arms)}")
    return Grid(
        name=str(data.get("name", path.stem)),
        base=base,
        common=common,
        seeds=seed_list,
        unit=unit,
        budget=QUICK_BUDGET[unit] if quick else amount,
        target=absolute,
        gain=gain,
        init=init,
        arms=arms,
        reference=reference,
    )


Stat = tuple[float, float]  # mean, 95% half-width over seeds


@dataclass
class CompareRow:
    arm: str
    seeds: int
    start: float  # mean over seeds of the iteration-0 held-out accuracy (the init checkpoint)
    target: float
    final: Stat  # held-out exact match at the last evaluation
    step_final: Stat  # held-out step accuracy at the last evaluation
    reached: int  # seeds whose held-out accuracy reached the target at some evaluation
    samples_to_target: Stat | None  # over the reaching seeds; None when none reached
    wall_to_target: Stat | None
    tokens: Stat  # generated tokens at the end
    samples: Stat
    iter_s: Stat  # per seed the mean time/iter_s over its iterations
    wall_s: Stat  # RL wall time per run at the end (evaluations excluded)
    length: Stat | None = None  # held-out greedy response length (tokens) at the last evaluation
    length_start: float | None = None  # the same before RL (mean over seeds)


def first_reach(history: list[dict[str, Any]], target: float) -> dict[str, Any] | None:
    """The first evaluation row with held-out accuracy >= target (the start row counts)."""
    return next((r for r in eval_rows(history) if r["eval/accuracy"] >= target), None)


def summarise_arm(
    arm: str, histories: list[list[dict[str, Any]]], target: float | None = None, gain: float | None = None
) -> CompareRow:
    evals = [eval_rows(h) for h in histories]
    start = float(np.mean([e[0]["eval/accuracy"] for e in evals]))
    target = round(start + gain, 9) if target is None else target  # 0.2 + 0.1 must reach 0.3
    hits = [r for r in (first_reach(h, target) for h in histories) if r is not None]
    last = [h[-1] for h in histories]
    its = [[r["time/iter_s"] for r in h if "time/iter_s" in r] or [0.0] for h in histories]
    return CompareRow(
        arm=arm,
        seeds=len(histories),
        start=start,
        target=target,
        final=mean_ci95([e[-1]["eval/accuracy"] for e in evals]),
        step_final=mean_ci95([e[-1]["eval/step_accuracy"] for e in evals]),
        reached=len(hits),
        samples_to_target=mean_ci95([r["samples/total"] for r in hits]) if hits else None,
        wall_to_target=mean_ci95([r["time/total_s"] for r in hits]) if hits else None,
        tokens=mean_ci95([r["tokens/total"] for r in last]),
        samples=mean_ci95([r["samples/total"] for r in last]),
        iter_s=mean_ci95([float(np.mean(x)) for x in its]),
        wall_s=mean_ci95([r["time/total_s"] for r in last]),
        length=mean_ci95([e[-1]["eval/length"] for e in evals]) if all("eval/length" in e[-1] for e in evals) else None,
        length_start=float(np.mean([e[0]["eval/length"] for e in evals]))
        if all("eval/length" in e[0] for e in evals)
        else None,
    )


def results_markdown(rows: list[CompareRow]) -> str:
    pct = lambda m: f"{100 * m[0]:.1f} ± {100 * m[1]:.1f}%"  # noqa: E731
    num = lambda m, u="", d=0: "–" if m is None else f"{m[0]:,.{d}f} ± {m[1]:,.{d}f}{u}"  # noqa: E731
    head = (
        "| arm | seeds | start | target | final accuracy | step accuracy | reached | samples to target "
        "| wall time to target | tokens generated | samples | iteration time | RL wall time | response length |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n"
    )
    return head + "".join(
        f"| {r.arm} | {r.seeds} | {100 * r.start:.1f}% | {100 * r.target:.1f}% | {pct(r.final)} | {pct(r.step_final)} "
        f"| {r.reached}/{r.seeds} | {num(r.samples_to_target)} | {num(r.wall_to_target, ' s', 1)} | {num(r.tokens)} "
        f"| {num(r.samples)} | {r.iter_s[0]:.2f} ± {r.iter_s[1]:.2f} s | {num(r.wall_s, ' s', 1)} "
        f"| {num(r.length, '', 1)} |\n"
        for r in rows
    )


def results_csv(rows: list[CompareRow]) -> str:
    """One row per arm; every Stat column as ``<name>_mean`` and ``<name>_ci95`` (empty if None)."""
    flat = []
    for r in rows:
        d: dict[str, Any] = {}
        for k, v in asdict(r).items():
            if k in {f for f, t in CompareRow.__annotations__.items() if "Stat" in str(t)}:
                d[f"{k}_mean"], d[f"{k}_ci95"] = v if v is not None else ("", "")
            else:
                d[k] = v
        flat.append(d)
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(flat[0]))
    writer.writeheader()
    writer.writerows(flat)
    return buf.getvalue()


def difference_rows(results: dict[str, list[list[dict[str, Any]]]], reference: str) -> list[dict[str, Any]]:
    """Every arm against ``reference`` at the last evaluation, problem by problem and seed by seed
    (:func:`creditrl.experiments.verdicts.paired_difference`), with whether each arm (the
    reference too) was still improving at the end and its wall-time ratio to the reference."""
    from creditrl.experiments.verdicts import outcome_matrix, paired_difference, still_improving

    ref = outcome_matrix(results[reference])
    ref_wall = float(np.mean([h[-1]["time/total_s"] for h in results[reference]]))
    rows = []
    for arm, hs in results.items():
        diff = None if arm == reference else paired_difference(outcome_matrix(hs), ref)
        late = still_improving(hs)
        wall = float(np.mean([h[-1]["time/total_s"] for h in hs]))
        rows.append(
            {
                "arm": arm,
                "difference": None if diff is None else asdict(diff),
                "improving": None if late is None else asdict(late),
                "cost": wall / ref_wall if ref_wall > 0 else None,
            }
        )
    return rows


def _points(x: float) -> str:
    return f"{100 * x:+.1f}"


def differences_markdown(rows: list[dict[str, Any]], reference: str) -> str:
    """The table of :func:`difference_rows`: accuracy points, 95% intervals, the minimum
    detectable effect, the late change and the cost ratio."""
    out = [
        f"Against **{reference}**: paired difference in held-out exact match at the last evaluation "
        "(points, 95% two-level bootstrap interval over seeds and problems), the smallest difference the run "
        "could detect (80% power), and each arm's change over the last third of its evaluations.\n",
        "| arm | difference | 95% interval | detectable | last third | still improving | wall time vs reference |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        d, late = r["difference"], r["improving"]
        diff = "reference" if d is None else _points(d["mean"])
        ci = "–" if d is None else f"[{_points(d['lo'])}, {_points(d['hi'])}]"
        mde = "–" if d is None else f"{100 * d['mde']:.1f}"
        change = "–" if late is None else f"{_points(late['mean'])} [{_points(late['lo'])}, {_points(late['hi'])}]"
        going = "–" if late is None else ("yes" if late["lo"] > 0 else "no")
        cost = "–" if r["cost"] is None else f"{r['cost']:.2f}x"
        out.append(f"| {r['arm']} | {diff} | {ci} | {mde} | {change} | {going} | {cost} |")
    return "\n".join(out) + "\n"


def cpu_hours(results: dict[str, list[list[dict[str, Any]]]], launches: list[dict[str, int]]) -> float:
    """The grid's compute: every run's RL and evaluation wall time times its threads (one thread
    where the launches differ or are unknown), in hours; the SFT start is not counted."""
    threads = launches[0].get("threads", 1) if len(launches) == 1 else 1
    seconds = sum(
        h[-1].get("time/total_s", 0.0) + sum(r.get("time/eval_s", 0.0) for r in h)
        for hs in results.values()
        for h in hs
    )
    return threads * seconds / 3600


def launch_text(launches: list[dict[str, int]]) -> str:
    """How the runs were launched, for the reports: iteration and wall times depend on it."""

    def one(d: dict[str, int]) -> str:
        if not d:
            return "runs from before launch.json was recorded"
        return (
            "one run at a time" if d["jobs"] == 1 else f"{d['jobs']} runs at a time"
        ) + f", {d['threads']} thread{'s' if d['threads'] > 1 else ''} each"

    return "; ".join(one(d) for d in launches) or "no runs"


def run_compare(
    grid_path: str | Path,
    out: str | Path | None = None,
    *,
    quick: bool = False,
    seeds: int | None = None,
    jobs: int = 1,
    summaries: Path | None = None,
) -> dict[str, Any]:
    """Run (resumably) and report a grid. ``summaries``: a folder of committed run summaries
    (:func:`creditrl.experiments.seeds.run_arms`); when every run has one, nothing trains."""
    grid = load_grid(grid_path, quick=quick, seeds=seeds)
    out = Path(out or Path("runs") / f"compare-{grid.name}")
    out.mkdir(parents=True, exist_ok=True)
    start = time.time()
    log = lambda msg: print(f"[creditrl compare] {time.time() - start:6.0f} s  {msg}", flush=True)  # noqa: E731
    init = grid.init
    if init == "sft" and summaries is None:
        from creditrl.train.sft import cached_sft

        cfg = load_config(grid.base, grid.common)
        init = str(cached_sft(cfg, progress=cfg.train.progress)[0])
    common = ([f"train.iterations={TOKEN_ITERATIONS}"] if grid.unit == "tokens" else []) + grid.common
    log(f"{len(grid.arms)} arms x {len(grid.seeds)} seeds, {grid.budget:,} generated {grid.unit} per run -> {out}")
    results = run_arms(
        grid.base,
        grid.arms,
        grid.seeds,
        grid.budget,
        out,
        init,
        common,
        log,
        unit=grid.unit,
        jobs=jobs,
        summaries=summaries,
    )
    launches = launch_settings(out)
    loads: list[float] = []
    if summaries is not None:
        found = [read_summary(summaries / slug(a) / f"seed{s}.json") for a in grid.arms for s in grid.seeds]
        init = found[0]["init"]
        loads = [f["load"] for f in found if f.get("load") is not None]
        launches = [x for i, x in enumerate(f["launch"] for f in found) if x not in [f["launch"] for f in found[:i]]]
    rows = [summarise_arm(name, hs, grid.target, grid.gain) for name, hs in results.items()]
    table = results_markdown(rows)
    differences = difference_rows(results, grid.reference) if grid.reference else []
    if differences:
        table += "\n" + differences_markdown(differences, grid.reference)
    title = f"{grid.name}: {grid.budget:,} generated {grid.unit} per run, mean ± 95% CI over {len(grid.seeds)} seeds"
    plot_seed_curves(
        results,
        out / "plots" / "accuracy_vs_samples.png",
        title,
        "samples/total",
        "generated samples",
        "ci95",
        reference=grid.reference,
    )
    plot_seed_curves(
        results,
        out / "plots" / "accuracy_vs_wall_time.png",
        title,
        "time/total_s",
        "RL wall time (s, evaluations excluded)",
        "ci95",
        reference=grid.reference,
    )
    plot_seed_curves(
        results,
        out / "plots" / "length_vs_samples.png",
        title,
        "samples/total",
        "generated samples",
        "ci95",
        y_key="eval/length",
        y_label="held-out greedy response length (tokens)",
        reference=grid.reference,
    )
    target = f"{100 * grid.target:.1f}%" if grid.target is not None else f"start + {100 * grid.gain:.1f} points"
    (out / "results.md").write_text(
        f"# compare: {grid.name}\n\nGrid {grid_path}; base {grid.base}; seeds {grid.seeds}; budget {grid.budget:,} "
        f"generated {grid.unit} per run; target {target}; init {init}; launched: {launch_text(launches)}.\n\n{table}\n"
        "![accuracy vs samples](plots/accuracy_vs_samples.png)\n![accuracy vs wall "
        "time](plots/accuracy_vs_wall_time.png)\n"
        "![response length vs samples](plots/length_vs_samples.png)\n"
    )
    (out / "results.csv").write_text(results_csv(rows))
    summary = {
        "grid": {**asdict(grid), "base": str(grid.base)},
        "init": init,
        "rows": [asdict(r) for r in rows],
        "differences": differences,
        "launches": launches,
        "cpu_hours": cpu_hours(results, launches),
        "load": float(np.mean(loads)) if loads else None,
        "wall_s": time.time() - start,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    print("\n" + table)
    log(f"results: {out / 'results.md'}")
    return summary
