"""What ``creditrl compare`` reports of a grid's runs: the per-arm table, the paired differences to
the reference arm, the PRMs, the costs, the compute and the launch."""

from __future__ import annotations

import csv
import io
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from creditrl.experiments.compare_verdicts import verdict_lines as verdict_lines
from creditrl.experiments.compare_verdicts import verdict_rows as verdict_rows
from creditrl.experiments.report import eval_rows
from creditrl.experiments.seeds import mean_ci95

Stat = tuple[float, float]  # mean, 95% half-width over seeds
Reach = tuple[float | None, float, float | None]  # over all seeds: median, first, last; None = not reached


@dataclass
class CompareRow:
    arm: str
    seeds: int
    start: float  # mean over seeds of the iteration-0 held-out accuracy (the init checkpoint)
    target: float
    final: Stat  # held-out exact match at the last evaluation
    step_final: Stat  # held-out step accuracy at the last evaluation
    reached: int  # seeds whose held-out accuracy reached the target at some evaluation
    samples_to_target: Reach | None  # over every seed (see reach_stat); None when none reached
    wall_to_target: Reach | None
    tokens: Stat  # generated tokens at the end
    samples: Stat
    iter_s: Stat  # per seed the mean time/iter_s over its iterations
    wall_s: Stat  # RL wall time per run at the end (evaluations excluded), the PRM's cost charged
    length: Stat | None = None  # held-out greedy response length (tokens) at the last evaluation
    length_start: float | None = None  # the same before RL (mean over seeds)


def charged_s(history: list[dict[str, Any]], row: dict[str, Any]) -> float:
    """The wall time a run is charged at ``row``: its RL time so far plus its PRM's labelling and
    training (``time/prm_s`` of the start row), paid whole by each run, as a single run would."""
    return row["time/total_s"] + (history[0].get("time/prm_s", 0.0) if history else 0.0)


def reach_stat(values: list[float | None]) -> Reach | None:
    """The median and range over seeds of a quantity counted up to the target (samples, seconds;
    ``None`` for a seed that never reached it); None when no seed did.

    A seed that never reached the target counts as later than any that did, so the median is the
    smallest value by which at least half the seeds had reached it (the inverted empirical CDF; for
    samples, censored at the shared budget, the Kaplan-Meier median), None when fewer than half
    did; the range's end is None when some seed never reached it."""
    hits = sorted(v for v in values if v is not None)
    if not hits:
        return None
    median = float(np.quantile([*hits, *[np.inf] * (len(values) - len(hits))], 0.5, method="inverted_cdf"))
    return (None if median == np.inf else median), hits[0], (hits[-1] if len(hits) == len(values) else None)


def reach_text(r: Reach | None, unit: str = "", digits: int = 0) -> str:
    """``3,840 (2,560 – 5,120)``: median (first – last) over seeds, or ``not reached (first 7,680)``."""
    if r is None:
        return "–"
    num = lambda x: "not reached" if x is None else f"{x:,.{digits}f}{unit}"  # noqa: E731
    return f"not reached (first {num(r[1])})" if r[0] is None else f"{num(r[0])} ({num(r[1])} – {num(r[2])})"


def summarise_arm(
    arm: str, histories: list[list[dict[str, Any]]], target: float | None = None, gain: float | None = None
) -> CompareRow:
    """An arm's row over its runs. With ``gain`` (no absolute ``target``) each run's target is its own
    start plus ``gain`` (seeds from several SFT starts start apart), and the row's is their mean."""
    evals = [eval_rows(h) for h in histories]
    starts = [e[0]["eval/accuracy"] for e in evals]
    start = float(np.mean(starts))
    goals = [round(s + gain, 9) if target is None else target for s in starts]  # 0.2 + 0.1 must reach 0.3
    target = round(start + gain, 9) if target is None else target
    firsts = [
        (h, next((r for r in eval_rows(h) if r["eval/accuracy"] >= goal), None)) for h, goal in zip(histories, goals)
    ]
    last = [h[-1] for h in histories]
    its = [[r["time/iter_s"] for r in h if "time/iter_s" in r] or [0.0] for h in histories]
    return CompareRow(
        arm=arm,
        seeds=len(histories),
        start=start,
        target=target,
        final=mean_ci95([e[-1]["eval/accuracy"] for e in evals]),
        step_final=mean_ci95([e[-1]["eval/step_accuracy"] for e in evals]),
        reached=sum(r is not None for _, r in firsts),
        samples_to_target=reach_stat([None if r is None else float(r["samples/total"]) for _, r in firsts]),
        wall_to_target=reach_stat([None if r is None else charged_s(h, r) for h, r in firsts]),
        tokens=mean_ci95([r["tokens/total"] for r in last]),
        samples=mean_ci95([r["samples/total"] for r in last]),
        iter_s=mean_ci95([float(np.mean(x)) for x in its]),
        wall_s=mean_ci95([charged_s(h, h[-1]) for h in histories]),
        length=mean_ci95([e[-1]["eval/length"] for e in evals]) if all("eval/length" in e[-1] for e in evals) else None,
        length_start=float(np.mean([e[0]["eval/length"] for e in evals]))
        if all("eval/length" in e[0] for e in evals)
        else None,
    )


def results_markdown(rows: list[CompareRow]) -> str:
    pct = lambda m: f"{100 * m[0]:.1f} ± {100 * m[1]:.1f}%"  # noqa: E731
    num = lambda m, u="", d=0: "–" if m is None else f"{m[0]:,.{d}f} ± {m[1]:,.{d}f}{u}"  # noqa: E731
    head = (
        "| arm | seeds | start | target | final accuracy | step accuracy | reached "
        "| samples to target, median (range) | wall time to target, median (range) "
        "| tokens generated | samples | iteration time | RL wall time | response length |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n"
    )
    return head + "".join(
        f"| {r.arm} | {r.seeds} | {100 * r.start:.1f}% | {100 * r.target:.1f}% | {pct(r.final)} | {pct(r.step_final)} "
        f"| {r.reached}/{r.seeds} | {reach_text(r.samples_to_target)} | {reach_text(r.wall_to_target, ' s', 1)} "
        f"| {num(r.tokens)} | {num(r.samples)} | {r.iter_s[0]:.2f} ± {r.iter_s[1]:.2f} s | {num(r.wall_s, ' s', 1)} "
        f"| {num(r.length, '', 1)} |\n"
        for r in rows
    )


def results_csv(rows: list[CompareRow]) -> str:
    """One row per arm; every Stat column as ``<name>_mean`` and ``<name>_ci95``, every Reach column
    as ``<name>_median``, ``<name>_first`` and ``<name>_last`` (empty where None: not reached)."""
    kinds = {f: str(t) for f, t in CompareRow.__annotations__.items()}
    flat = []
    for r in rows:
        d: dict[str, Any] = {}
        for k, v in asdict(r).items():
            if "Reach" in kinds[k]:
                for part, x in zip(("median", "first", "last"), v or (None, None, None)):
                    d[f"{k}_{part}"] = "" if x is None else x
            elif "Stat" in kinds[k]:
                d[f"{k}_mean"], d[f"{k}_ci95"] = v if v is not None else ("", "")
            else:
                d[k] = v
        flat.append(d)
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(flat[0]))
    writer.writeheader()
    writer.writerows(flat)
    return buf.getvalue()


def comparable(machines: dict[str, list[str | None]] | None, a: str, b: str) -> bool:
    """Whether arms ``a`` and ``b`` ran on one kind of CPU (``machines``: each arm's runs' CPU kinds,
    None where not recorded; all unrecorded counts as one)."""
    return machines is None or len(set(machines.get(a, [None])) | set(machines.get(b, [None]))) == 1


def wall_ratio(
    results: dict[str, list[list[dict[str, Any]]]], machines: dict[str, list[str | None]] | None, a: str, b: str
) -> float | None:
    """Arm ``a``'s wall time (:func:`charged_s` at the end) over arm ``b``'s: the ratio of their mean
    wall times on each kind of CPU both ran on, averaged weighted by ``a``'s runs on each
    (``machines`` as in :func:`comparable`; an unrecorded kind pairs only when no run recorded
    one). None where the arms share no kind (or ``b`` took no time)."""
    walls = {arm: [charged_s(h, h[-1]) for h in results[arm]] for arm in (a, b)}
    if machines is None or comparable(machines, a, b):  # every run of one kind
        kinds: dict[str, list[str | None]] = {arm: ["one"] * len(walls[arm]) for arm in (a, b)}
    else:
        kinds = {arm: machines.get(arm, [None] * len(walls[arm])) for arm in (a, b)}
    ratios, weights = [], []
    for kind in dict.fromkeys(kinds[a]):
        if kind is None or kind not in kinds[b]:
            continue
        x, y = ([w for w, k in zip(walls[arm], kinds[arm]) if k == kind] for arm in (a, b))
        if np.mean(y) > 0:
            ratios.append(float(np.mean(x) / np.mean(y)))
            weights.append(len(x))
    return float(np.average(ratios, weights=weights)) if ratios else None


def difference_rows(
    results: dict[str, list[list[dict[str, Any]]]],
    reference: str,
    machines: dict[str, list[str | None]] | None = None,
    seeds: dict[str, list[int]] | None = None,
) -> list[dict[str, Any]]:
    """Every arm against ``reference`` at the last evaluation: the unadjusted 95% seed-level paired
    t over the seeds both ran (None with one; ``seeds`` as in
    :func:`~creditrl.experiments.verdicts.shared_runs`), whether it was still improving, and its
    :func:`wall_ratio`."""
    from creditrl.experiments.verdicts import outcome_matrix, paired_difference, shared_runs, still_improving

    rows = []
    for arm, hs in results.items():
        x, y, _ = shared_runs(results, seeds, arm, reference)
        paired = arm != reference and len(x) > 1
        diff = paired_difference(outcome_matrix(x), outcome_matrix(y)) if paired else None
        late = still_improving(hs)
        rows.append(
            {
                "arm": arm,
                "difference": None if diff is None else asdict(diff),
                "improving": None if late is None else asdict(late),
                "cost": wall_ratio(results, None if arm == reference else machines, arm, reference),
            }
        )
    return rows


def _points(x: float) -> str:
    return f"{100 * x:+.1f}"


def differences_markdown(
    rows: list[dict[str, Any]],
    reference: str,
    machines: dict[str, list[str | None]] | None = None,
    seeds: dict[str, list[int]] | None = None,
) -> str:
    """The table of :func:`difference_rows`, saying how wall-time ratios pair runs of several CPU
    kinds, and, where the arms ran different seeds (``seeds``: each arm's), how many each pairs."""
    kinds = len({k for ks in (machines or {}).values() for k in ks})
    from creditrl.experiments.verdicts import seeds_differ

    varied = seeds_differ(seeds)
    out = [
        f"Against **{reference}**: paired difference in held-out exact match at the last evaluation "
        "(points; 95% seed-level paired t-interval over the per-seed differences and its p-value, neither adjusted "
        "for multiplicity), the smallest difference the same test detects with 80% power, and each arm's change "
        "over the last third of its evaluations (the same t). The wall-time ratio is of runs on a loaded, shared "
        "machine and decides nothing; the cost table gives costs no machine's load changes."
        + (
            " Wall-time ratios pair runs on one kind of CPU: an arm's ratio to the reference within each kind "
            "both ran on, averaged over those kinds weighted by the arm's runs (a run whose CPU was not recorded "
            "pairs only where no run recorded one)."
            if kinds > 1
            else ""
        )
        + (
            " No wall-time ratio (–) where an arm and the reference share no kind of CPU."
            if any(r["cost"] is None and r["difference"] is not None for r in rows)
            else ""
        )
        + (
            " The arms ran different seeds so far: each difference pairs the seeds the arm and the reference "
            "both ran (the seeds column)."
            if varied
            else ""
        )
        + "\n",
        "| arm | difference | 95% interval | p | detectable | last third | still improving "
        "| loaded-grid wall time vs reference |" + (" seeds |" if varied else ""),
        "|---|---|---|---|---|---|---|---|" + ("---|" if varied else ""),
    ]
    for r in rows:
        d, late = r["difference"], r["improving"]
        diff = "reference" if r["arm"] == reference else "– (one seed)" if d is None else _points(d["mean"])
        ci = "–" if d is None else f"[{_points(d['lo'])}, {_points(d['hi'])}]"
        p = "–" if d is None else f"{d['p']:.3f}"
        mde = "–" if d is None else f"{100 * d['mde']:.1f}"
        change = "–" if late is None else f"{_points(late['mean'])} [{_points(late['lo'])}, {_points(late['hi'])}]"
        going = "–" if late is None else ("yes" if late["lo"] > 0 else "no")
        cost = "–" if r["cost"] is None else f"{r['cost']:.2f}x"
        paired = (f" {'–' if d is None else d['seeds']} |") if varied else ""
        out.append(f"| {r['arm']} | {diff} | {ci} | {p} | {mde} | {change} | {going} | {cost} |{paired}")
    return "\n".join(out) + "\n"


PRM_COLUMNS = (
    ("prm/label_agreement", "labels agreeing with the oracle", "{:.3f}"),
    ("prm/label_coverage", "steps labelled", "{:.3f}"),
    ("prm/label_fpr", "false-positive rate", "{:.3f}"),
    ("prm/heldout_auroc", "step AUROC, held out", "{:.3f}"),
    ("time/prm_s", "labelling + training", "{:.0f} s"),
)


def prm_rows(results: dict[str, list[list[dict[str, Any]]]]) -> list[dict[str, Any]]:
    """Per arm whose runs' start rows record a PRM (``creditrl.prm.cache.prm_record``): the mean over
    its seeds of each of :data:`PRM_COLUMNS`."""
    out = []
    for arm, runs in results.items():
        starts = [h[0] for h in runs if h]
        if not any(k in row for row in starts for k, _, _ in PRM_COLUMNS):
            continue
        values = {k: [row[k] for row in starts if row.get(k) is not None] for k, _, _ in PRM_COLUMNS}
        out.append({"arm": arm, **{k: float(np.mean(v)) if v else None for k, v in values.items()}})
    return out


def prm_markdown(rows: list[dict[str, Any]]) -> str:
    """The table of :func:`prm_rows`: what each arm's PRM learned from and what it cost."""
    out = [
        "The PRM each arm reads (mean over its seeds): its training labels against the oracle's, its step AUROC "
        "against oracle labels on held-out samples of the start policy, and what labelling and training cost.\n",
        "| arm | " + " | ".join(title for _, title, _ in PRM_COLUMNS) + " |",
        "|---|" + "---|" * len(PRM_COLUMNS),
    ]
    for r in rows:
        cells = ["–" if r.get(k) is None else fmt.format(r[k]) for k, _, fmt in PRM_COLUMNS]
        out.append(f"| {r['arm']} | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def cpu_hours(results: dict[str, list[list[dict[str, Any]]]], launches: list[dict[str, int]]) -> float:
    """The grid's compute in hours: every run's RL and evaluation wall time times its threads (one
    where the launches differ or are unknown), plus each distinct PRM's cost once; no SFT."""
    shared = {d.get("threads", 1) for d in launches}
    threads = shared.pop() if len(shared) == 1 else 1
    runs = [h for hs in results.values() for h in hs]
    seconds = sum(h[-1].get("time/total_s", 0.0) + sum(r.get("time/eval_s", 0.0) for r in h) for h in runs)
    prms = {h[0]["time/prm_s"] for h in runs if h and "time/prm_s" in h[0]}  # runs sharing a PRM record one cost
    return (threads * seconds + sum(prms)) / 3600


def launch_text(launches: list[dict[str, int]]) -> str:
    """How the runs were launched, for the reports: iteration and wall times depend on it."""
    recorded = any("cpu" in d for d in launches)

    def one(d: dict[str, int]) -> str:
        if not d:
            return "runs from before launch.json was recorded"
        where = f" on {d['cpu']}" if "cpu" in d else " (CPU not recorded)" if recorded else ""
        runs = "one run" if d["jobs"] == 1 else f"{d['jobs']} runs"  # in this grid's process; another grid may share
        threads = f"{d['threads']} thread{'s' if d['threads'] > 1 else ''}"
        return f"{runs} at a time in the grid's process, {threads} each{where}"

    return "; ".join(one(d) for d in launches) or "no runs"


def cost_rows(
    results: dict[str, list[list[dict[str, Any]]]], spent: dict[str, list[dict[str, Any]]]
) -> list[dict[str, Any]]:
    """Per arm, the mean and 95% half-width over seeds of its runs' generated tokens and, where every
    run recorded them (``spent``: each arm's runs' ``cost`` in seed order), trained token positions
    and process-tree CPU seconds. A run that reads a PRM is charged the PRM's labelling and training
    as its start row records them (``prm/generated_tokens``, ``prm/trained_positions``,
    ``prm/cpu_s``), whole, as a single run would be; None where it does not. A run's own CPU seconds
    leave out a PRM built in its process (:func:`creditrl.usage.charge_elsewhere`); a run
    recorded before ``prm/cpu_s`` was may hold one, and is None."""

    def stat(values: list[Any]) -> tuple[float, float] | None:
        return mean_ci95([float(v) for v in values]) if values and None not in values else None

    def prm(h: list[dict[str, Any]], key: str) -> float | None:
        """The PRM's part of a run's cost: 0 without a PRM, None when the run read one unrecorded."""
        first = h[0] if h else {}
        return first.get(key) if "time/prm_s" in first or key in first else 0.0

    def plus(a: Any, b: Any) -> Any:
        return None if a is None or b is None else a + b

    return [
        {
            "arm": arm,
            "generated_tokens": stat([plus(h[-1]["tokens/total"], prm(h, "prm/generated_tokens")) for h in hs]),
            "trained_positions": stat(
                [
                    plus(c.get("trained_positions"), prm(h, "prm/trained_positions"))
                    for c, h in zip(spent.get(arm, []), hs)
                ]
            ),
            "cpu_s": stat([plus(c.get("cpu_s"), prm(h, "prm/cpu_s")) for c, h in zip(spent.get(arm, []), hs)]),
        }
        for arm, hs in results.items()
    ]


def costs_markdown(rows: list[dict[str, Any]]) -> str:
    """The table of :func:`cost_rows`."""
    out = [
        "Cost per run, mean ± 95% over seeds: generated tokens, the token positions (prompt and response) the "
        "updates forwarded and backpropagated over every PPO epoch, and the CPU seconds (user + system) of the "
        "run's process and the helper processes it waited for, which a machine's load does not inflate as it "
        "does wall time. A run whose reward reads a PRM is charged, whole, the tokens the PRM's labelling generated, "
        "the positions its training forwarded and backpropagated and the CPU seconds both took, as a single run "
        "would be, also where several runs read one PRM (one per labeller, or one per seed with `prm.seed=run`, "
        "read by each of that seed's arms); – where the run or its PRM did not record them (a PRM built before "
        "`prm/cpu_s` was recorded has no CPU seconds, and the run that built it may hold them).\n",
        "| arm | generated tokens | trained token-positions | CPU seconds |",
        "|---|---|---|---|",
    ]
    num = lambda m, d=0: "–" if m is None else f"{m[0]:,.{d}f} ± {m[1]:,.{d}f}"  # noqa: E731
    for r in rows:
        out.append(
            f"| {r['arm']} | {num(r['generated_tokens'])} | {num(r['trained_positions'])} | {num(r['cpu_s'], 1)} |"
        )
    return "\n".join(out) + "\n"
