"""``creditrl findings`` / ``make findings``: FINDINGS.md from committed finding files.

A finding file (``findings/*.yaml``) names a grid (``grids/*.yaml``) and the ``plots`` of it to
show (copied to ``docs/findings/``), and holds the prose: ``title``, ``question``, ``claim`` (the
folk claim it tests), ``power`` (optional: why the grid has the seeds it has) and ``reading``, a
paragraph whose numbers are placeholders filled from the grid's results, so no number in
FINDINGS.md is typed by hand:

- ``{ARM.FIELD}`` with ARM the arm's slug (``gae + critic`` -> ``gae_critic``) and FIELD one of
  ``final``, ``step_final`` ("27.3 ± 1.2%"), ``start`` ("23.4%"), ``iter_s``, ``wall_s`` ("1.23 ±
  0.05 s"), ``length`` (held-out response length, "31.2 ± 0.4 tokens"), ``length_start`` ("30.1
  tokens"), ``tokens``, ``samples`` (counts), ``reached`` ("2/3"), ``samples_to_target``,
  ``wall_to_target`` (median and range over every seed, "3,840 (2,560 – not reached)");
- ``{ARM.diff}`` and ``{ARM.verdict}``: the paired difference to the grid's ``reference`` arm (at
  the verdict's Holm-adjusted level where the arm has one, "+2.3 points [-1.1, +5.7] at 99.75%";
  else at 95%) and its verdict;
- ``{ARM.gain}``: the arm's held-out exact match at the end minus at its start with its 95%
  seed-level t-interval; ``{ARM.moved}``: "above", "below" or "not shown different from" its start;
  ``{ARM.finals}``: each seed's final held-out exact match, in seed order ("24.3, 0.0, 22.8%");
  ``{ARM.starts}``: each seed's held-out exact match at its start, in seed order (seeds from
  several SFT starts, ``sft_seeds``, differ there);
- ``{ARM.explained_variance}``, ``{ARM.zero_spread}``, ``{ARM.kl}``, ``{ARM.entropy}``: each run's
  mean over its iterations, then the mean over seeds ("not recorded" where a run kept none);
- ``{ratio:A/B.FIELD}``: the ratio of the two means ("2.4x"; of the medians for the to-target
  fields, "n/a" where one is not reached), times only between arms run on one kind of CPU;
- ``{diff:A/B.final}``: A's paired difference to B in final held-out exact match, at the level of
  the verdict row comparing them where there is one, else the unadjusted 95% seed-level t;
  ``{cmp:A/B.final}``: the words that interval decides ("above", "below", "not shown different
  from");
- ``{ID:A/B.verdict}``, ``{ID:A/B.diff}``: the verdict (", fragile" where it is) and the difference
  with its interval and seeds of the verdict row A against B of the finding whose id is ``ID``
  (``{C1-long:token/sequence_GRPO.verdict}``), so a reading can set its rows beside another
  setting's; "not judged yet" while that finding has no such row;
- ``{family.changes}``: which verdicts of the claim's other rows change when this finding's rows
  join the claim's Holm family (each with its verdict without them), or that none does;
  ``{ARM.changes}``, ``{changes:A/B.verdicts}``: the same for this finding's rows in which ARM (A
  or B) is the arm (new arms beside a finding's earlier ones);
- ``{timing:A/B.ratio}``: A's RL seconds per iteration against B's, with its spread over rounds,
  in the controlled timing the finding's ``timing`` key names (a ``creditrl compare GRID
  --timing`` timing.json, relative to the repository root), and with ``time_claim: 3`` the verdict
  on "about 3x"; without one, "no controlled timing yet, so no time verdict".

**Verdicts.** A finding that tests a claim names it (``claim_id``: C1 ... C7, :data:`CLAIMS`), its
``regime`` and ``task`` (words for the table), and in ``expect`` what the claim predicts for each
arm against the grid's ``reference``: ``better``, ``worse``, ``same``, ``no better``, ``no
worse``, ``better by 5`` (a claimed size in points) or ``any`` (no prediction). ``sequence_level``
and ``sequence_expect`` add rows against the setting's best sequence-level arm, ``also`` further
pairs (:mod:`creditrl.experiments.claim_verdicts`); a claim's rows are judged as one Holm family
(:mod:`creditrl.experiments.verdicts`).

**Persistence.** Every finished run's summary is committed under ``findings/runs/<grid>/``
(:mod:`creditrl.experiments.summaries`); ``creditrl findings --no-train`` builds FINDINGS.md from
them alone, and a finding whose runs are not all summarised shows how many are. While a grid's
seeds are still running, each arm that shares at least two seeds with the reference is shown on the
seeds it has, and each difference, interval and verdict pairs the seeds its two arms share (seed
``s`` with seed ``s``: the same start and prompts), naming how many where they differ. The findings of
the protocol before verdicts are kept as written, in ``findings/legacy.md``.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from creditrl.config import ConfigError
from creditrl.experiments.claim_verdicts import (
    BASELINE,
    Comparison,
    changes_markdown,
    comparisons,
    family_changes,
    judge,
    sensitivity_markdown,
    verdicts_markdown,
)
from creditrl.experiments.compare import run_compare
from creditrl.experiments.compare_report import (
    CompareRow,
    charged_s,
    costs_markdown,
    differences_markdown,
    launch_text,
    prm_markdown,
    results_markdown,
)
from creditrl.experiments.finding_files import CLAIMS, fill, load_finding, load_timing, names_only
from creditrl.experiments.findings_figures import length_figure, settings_figure
from creditrl.experiments.grid import load_grid
from creditrl.experiments.plan import summarised_runs
from creditrl.experiments.summaries import history, read_summary


def _section(
    finding: dict[str, Any],
    grid,
    summary: dict[str, Any],
    plots: list[Path],
    root: Path,
    verdicts: list[dict],
    reading: bool = True,
    timing: dict[str, Any] | None = None,
    others: dict[str, list[dict[str, Any]]] | None = None,
    changes: Callable[[tuple[str, ...] | None], str] | None = None,
) -> str:
    diffs = {r["arm"]: r["difference"] for r in summary.get("differences", [])}
    diffs |= {r["arm"]: r["difference"] for r in verdicts if r["role"] == BASELINE}  # at the verdict's level
    judged = {r["arm"]: r["verdict"] for r in verdicts if r["role"] == BASELINE}
    rows = [{**r, "diff": diffs.get(r["arm"]), "verdict": judged.get(r["arm"], "not judged")} for r in summary["rows"]]
    machines = summary.get("machines")
    table = results_markdown(
        [CompareRow(**{k: tuple(v) if isinstance(v, list) else v for k, v in r.items()}) for r in summary["rows"]]
    )
    if summary.get("differences"):
        table += "\n" + differences_markdown(summary["differences"], grid.reference, machines, summary.get("seeds"))
    if summary.get("prm"):
        table += "\n" + prm_markdown(summary["prm"])
    if summary.get("costs"):
        table += "\n" + costs_markdown(summary["costs"])
    images = "\n".join(f"![{p.stem}]({p.relative_to(root).as_posix()})" for p in plots)
    results, claim_x, seeds = summary.get("results"), finding.get("time_claim"), summary.get("seeds")
    text = (
        ""
        if not reading
        else fill(
            finding["reading"].strip(), rows, machines, results, verdicts, timing, claim_x, seeds, others, changes
        )
    )
    runs = sum(map(len, seeds.values())) if seeds else len(grid.arms) * len(grid.seeds)
    return (
        f"{_head(finding, grid)}; {_starts_text(summary)}; launched: "
        f"{launch_text(summary.get('launches', [{}]))}. Arms: {_arms(grid)}. "
        f"Compute: {summary.get('cpu_hours', 0.0):.1f} CPU-hours of RL and evaluation over "
        f"{runs} runs (the SFT start not counted){_load_text(summary)}. "
        f"Regenerate: `creditrl compare {finding['grid']}` (then `creditrl findings`).\n{_power(finding)}\n"
        f"{table}\n{images}\n" + (f"\n*Reading.* {text}\n" if reading else "")
    )


def _head(finding: dict[str, Any], grid) -> str:
    """A section's anchor (``#c1-short``, the verdict table's link target) and head, up to its seeds."""
    claim = f"\n*Folk claim:* {finding['claim'].strip()}\n" if finding.get("claim") else ""
    return (
        f'<a id="{finding["id"].lower()}"></a>\n\n## {finding["id"]}: {finding["title"]}\n\n'
        f"*Question:* {finding['question'].strip()}\n{claim}\n"
        f"*Setting:* base `{grid.base.name}` with `{' '.join(grid.common) or '-'}`; {grid.budget:,} generated "
        f"{grid.unit} per run; seeds {grid.seeds}"
    )


def _arms(grid) -> str:
    return "; ".join(f"**{name}**: `{' '.join(over) or '(base)'}`" for name, over in grid.arms.items())


def _starts_text(summary: dict[str, Any]) -> str:
    """The runs' start ("start `findings/starts/<recipe>`"), or each of their SFT starts with its seeds."""
    starts = summary.get("starts") or [{"init": summary["init"]}]
    if len(starts) == 1:
        return f"start `{starts[0]['init']}`"
    return "starts " + " and ".join(f"`{s['init']}` (seeds {', '.join(map(str, s['seeds']))})" for s in starts)


def _power(finding: dict[str, Any]) -> str:
    """The finding's note on its seeds and power, as a paragraph of its own ("" without one)."""
    return f"\n*Power:* {finding['power'].strip()}\n" if finding.get("power") else ""


def _load_text(summary: dict[str, Any]) -> str:
    """How loaded the machine was while the runs ran (wall times depend on it)."""
    load = summary.get("load")
    if load is None:
        return ""
    return f"; the 15-minute load average at the runs' ends was {load:.1f} on average on 2 cores"


def _pending_section(finding: dict[str, Any], grid, finished: list[tuple[Any, dict[str, Any]]], total: int) -> str:
    """A finding whose runs are not all summarised: its question, its progress and its finished runs."""
    return (
        f"{_head(finding, grid)}. Arms: {_arms(grid)}.\n{_power(finding)}\n"
        f"*In progress:* {len(finished)} of {total} runs finished and summarised; `creditrl findings` runs the rest "
        f"(`creditrl compare {finding['grid']}`).\n{_runs_so_far(finished, grid.reference)}"
    )


_WAITING = (
    "The runs finished so far, each on its own (differences to the reference, their intervals and the "
    "verdicts wait until another arm shares at least two seeds with the reference arm):"
)


def _runs_so_far(finished: list[tuple[Any, dict[str, Any]]], reference: str, lead: str = _WAITING) -> str:
    """A table of each finished run's held-out exact match at its start, end and best, its RL wall
    time (the PRM's charged) and its CPU, under ``lead`` ("" without a run)."""
    if not finished:
        return ""
    rows = []
    for run, summary in finished:
        h = history(summary)
        acc = [100 * r["eval/accuracy"] for r in h if "eval/accuracy" in r]
        cpu = summary.get("launch", {}).get("cpu", "not recorded")
        name = f"{run.arm} (reference)" if run.arm == reference else run.arm
        rows.append(
            f"| {name} | {run.seed} | {acc[0]:.1f}% | {acc[-1]:.1f}% | {max(acc):.1f}% "
            f"| {charged_s(h, h[-1]):,.0f} s | {cpu} |"
        )
    return (
        f"\n{lead}\n\n"
        "| arm | seed | held-out exact match at the start | at the end | best | RL wall time | CPU |\n"
        "|---|---|---|---|---|---|---|\n" + "\n".join(rows) + "\n"
    )


_PROTOCOL = (
    "**The protocol** (creditrl.experiments.verdicts). The seed is the unit of replication: each seed gives one "
    "paired difference in held-out exact match over the same problems, and a difference's interval is the "
    "seed-level paired Student-t interval over those per-seed differences, whose coverage holds at 3 and 5 seeds "
    "(checked by simulation). A claim's rows are one family: their p-values are Holm-adjusted, and each row's "
    "interval is at its Holm level (the method column gives it), so that it excludes 0 exactly when Holm rejects. "
    "A prediction of *better* is **supported** when that interval lies above 0 (and reaches a claimed size), "
    "**contradicted** when it lies below 0 (or wholly short of a claimed size); a predicted tie (*same*) is "
    "supported when the interval lies within ±2 points and contradicted when it lies wholly outside them; *no "
    "better* is supported when the interval's upper end is at most +2 points and contradicted when the interval "
    "lies wholly above +2; any other interval is **inconclusive**. Where the claim predicts nothing, the verdict "
    "says whether the arm is higher, lower, tied (within ±2 points) or undecided. *Detectable* is the difference "
    "the same t-test (at the row's level) detects with 80% power, from the observed seed-level spread; *gain over "
    "the start* is each arm's held-out exact match at the end minus at its start, mean over seeds. A verdict is "
    "**fragile** when leaving out any one seed or a tie margin of ±1 or ±3 points changes it. Each setting's "
    "arms are compared with the claim's stated baseline and, where it is another arm, with the setting's best "
    "sequence-level arm (outcome GRPO where it ran). *Costs* are in units no machine's speed or load changes, "
    "each the arm's mean over seeds divided by the reference's: generated tokens, the token positions the updates "
    "forwarded and backpropagated (every PPO epoch), and the CPU seconds of the run's process tree; runs summarised "
    "before summaries recorded costs hold generated tokens only, so their other two columns say *not recorded*. "
    "The PRM column gives the wall seconds the PRM each arm's reward reads took to label for and train (– where "
    "that arm's runs record none; *not recorded* where neither's do); the PRM's labelling and training are not in "
    "the other three. Wall times of the grid runs, in the findings' tables, come from loaded, shared machines and "
    "decide nothing; a claim about time is judged only against a controlled timing (`creditrl compare GRID "
    "--timing`). Within the findings, the differences tables give the "
    "unadjusted 95% seed-level t; the per-arm tables give 95% Student-t intervals over seeds, and for the samples "
    "and wall time to the target their median and range over every seed (a seed that never reached the target "
    "counts as later than all that did). Every arm runs to its grid's stated budget (10x the earlier findings'); "
    "each table says whether an arm was still improving over the last third of it."
)

# a section, given its finding's judged verdict rows, every finding's by finding id, and what the rows of
# given arms (None: all) change in its claim's Holm family (family_changes)
Render = Callable[[list[dict[str, Any]], dict[str, list[dict[str, Any]]], Callable[[tuple[str, ...] | None], str]], str]


def _grid_section(
    finding: dict[str, Any], root: Path, runs: Path, docs: Path, out: Path, quick: bool, jobs: int, train: bool
) -> tuple[Render, list[Comparison], list[str], tuple[dict[str, Any], dict[str, Any]] | None]:
    """A grid finding's section (rendered once the claim's rows are judged: Holm's family spans the
    claim's settings), its unjudged verdict rows, the days its runs were summarised and its panel
    for the claim's figures: (the finding with its grid's reference, the reported arms' histories),
    None while no arm is reported."""
    grid_path = root / finding["grid"]
    grid = load_grid(grid_path, quick=quick)
    summaries = None if quick else root / "findings" / "runs" / grid.name
    arms = None  # every arm, on every seed
    if summaries is not None and not train:
        so_far = summarised_runs(grid, summaries)
        have = {a: [r.seed for r, _ in so_far if r.arm == a] for a in grid.arms}
        arms = _reported(grid, have)
        if not arms:
            pending = _pending_section(finding, grid, so_far, len(grid.arms) * len(grid.seeds))
            return lambda *_: pending, [], [], None
        if len(arms) == len(grid.arms) and all(have[a] == grid.seeds for a in arms):
            arms = None
    where = runs / grid.name
    summary = run_compare(
        grid_path,
        where,
        quick=quick,
        jobs=jobs,
        summaries=summaries,
        arms=arms,
        arm_seeds=None if arms is None else {a: have[a] for a in arms},
    )
    plots = []
    for name in finding["plots"]:
        dest = docs / f"{finding['id']}_{name}.png"
        shutil.copyfile(where / "plots" / f"{name}.png", dest)
        plots.append(dest)
    if arms is not None:
        finding = {**finding, "expect": {a: e for a, e in finding.get("expect", {}).items() if a in arms}}
        if finding.get("sequence_level") not in arms:
            finding.pop("sequence_level", None)
        finding["also"] = [x for x in finding.get("also", []) if x["arm"] in arms and x["against"] in arms]
    rows = (
        comparisons(finding, summary["results"], grid.reference, summary["seeds"], summary.get("costs"))
        if finding.get("expect")
        else []
    )
    days = [] if summaries is None else [read_summary(p)["date"] for p in sorted(summaries.glob("*/seed*.json"))]
    panel = ({**finding, "reference": grid.reference}, summary["results"])
    timing = load_timing(finding, root)
    if arms is None:
        render = lambda judged, others, changes: _section(  # noqa: E731
            finding, grid, summary, plots, out.parent, judged, timing=timing, others=others, changes=changes
        )
        return render, rows, days, panel
    pending = {a: len(have[a]) for a in grid.arms if len(have[a]) < len(grid.seeds)}
    note = "; ".join(f"**{a}** {n} of {len(grid.seeds)} seeds" for a, n in pending.items())
    shown = dataclasses.replace(grid, arms={a: o for a, o in grid.arms.items() if a in arms})
    reads = names_only(finding["reading"], arms)  # a reading of the reported arms only is given now
    what = "the table, the verdicts and the reading above are" if reads else "the table and the verdicts above are"
    wait = "" if reads else ", and the reading waits for the rest"
    which = (
        "the arms with every seed"
        if all(have[a] == grid.seeds for a in arms)
        else "the arms that share at least two seeds with the reference, each on the seeds it has run, each "
        "difference and verdict on the seeds its two arms share"
    )
    tail = f"\n*In progress:* {note}; {what} those of {which}{wait} (`creditrl compare {finding['grid']}`).\n"
    tail += _runs_so_far(
        [(run, s) for run, s in so_far if run.arm not in arms],
        grid.reference,
        "The finished runs of the arms not reported yet, each on its own (their differences, intervals and "
        "verdicts wait until the arm shares at least two seeds with the reference):",
    )
    return (
        lambda judged, others, changes: (
            _section(finding, shown, summary, plots, out.parent, judged, reads, timing, others, changes) + tail
        ),
        rows,
        days,
        panel,
    )


def _reported(grid, have: dict[str, list[int]]) -> list[str]:
    """The arms a report of a grid still running shows (``have``: each arm's summarised seeds), in
    the grid's order: the reference (which needs two seeds) and every arm that shares at least two
    seeds with it, each to be shown on the seeds it has; none while no other arm has two."""
    reference = grid.reference or next(iter(grid.arms))
    shared = [a for a in grid.arms if a != reference and len(set(have[a]) & set(have[reference])) >= 2]
    return [a for a in grid.arms if a == reference or a in shared] if shared else []


def _train_only(root: Path, files: list[Path], only: list[str], quick: bool, runs: Path, jobs: int) -> None:
    """Run the grids of the findings ``only`` names, in that order."""
    by_id = {f["id"]: f for f in map(load_finding, files) if "grid" in f}
    if unknown := [i for i in only if i not in by_id]:
        raise ConfigError(f"--only: no grid finding {', '.join(unknown)}; findings: {', '.join(sorted(by_id))}")
    for finding_id in only:
        grid_path = root / by_id[finding_id]["grid"]
        name = load_grid(grid_path, quick=quick).name
        summaries = None if quick else root / "findings" / "runs" / name
        run_compare(grid_path, runs / name, quick=quick, jobs=jobs, summaries=summaries)


def run_findings(
    root: Path,
    *,
    quick: bool = False,
    out: Path | None = None,
    runs: Path | None = None,
    jobs: int = 1,
    train: bool = True,
    only: tuple[str, ...] | list[str] = (),
) -> Path:
    """Run every finding's grid (resumably, ``jobs`` runs at a time) and write FINDINGS.md (``out``)
    with its plots. ``train=False``: nothing trains; ``only``: only the grids of these finding ids
    train, in this order, and the rest are read from their summaries."""
    root = Path(root)
    if only and not train:
        raise ConfigError(
            f"--only {' '.join(only)} trains those grids, and --no-train trains nothing: give one of them"
        )
    files = sorted((root / "findings").glob("*.yaml"))
    if not files:
        raise ConfigError(f"{root / 'findings'}: no finding files (*.yaml)")
    runs = Path(runs or root / "runs" / ("findings-quick" if quick else "findings"))
    if only:
        _train_only(root, files, list(only), quick, runs, jobs)
        train = False
    out = Path(out or root / "FINDINGS.md")
    docs = out.parent / "docs" / "findings"
    docs.mkdir(parents=True, exist_ok=True)
    sections: list[tuple[str, Render]] = []
    compared: list[Comparison] = []
    days: list[str] = []
    panels: dict[str, list[tuple[dict[str, Any], dict[str, Any]]]] = {}
    for f in files:
        finding = load_finding(f)
        render, rows, when, panel = _grid_section(finding, root, runs, docs, out, quick, jobs, train)
        sections.append((finding["id"], render))
        compared += rows
        days += when
        if panel is not None and finding.get("claim_id"):
            panels.setdefault(finding["claim_id"], []).append(panel)
    verdicts = judge(compared)
    by_finding = {id: [r for r in verdicts if r["finding"] == id] for id, _ in sections}
    texts = [
        render(by_finding[id], by_finding, lambda arms, id=id: family_changes(compared, verdicts, id, arms).text())
        for id, render in sections
    ]
    figures = "".join(
        "\n" + settings_figure(claim, found, docs, out.parent) + length_figure(claim, found, docs, out.parent)
        for claim, found in panels.items()
        if len(found) > 1
    )
    legacy = root / "findings" / "legacy.md"
    if legacy.is_file() and not quick:
        texts.append(legacy.read_text().strip() + "\n")
    note = "\n**Quick mode: smoke test only, the numbers mean nothing.**\n" if quick else ""
    when = f"runs summarised up to {max(days)}" if days else "no run summarised yet"
    measured = {r["claim"] for r in verdicts}
    waiting = [f"{c} ({text})" for c, text in CLAIMS.items() if c not in measured]
    changes = f"**Changes from the previous protocol.** {changes_markdown(verdicts)}\n" if verdicts else ""
    robust = (
        "**Sensitivity.** Each row's verdict with one seed left out (recomputed from the other seeds at the row's "
        "level), with a tie margin of ±1 or ±3 points, by the unadjusted 95% seed-level t, and by the previous "
        'protocol ("unchanged" where it equals the verdict):\n\n' + sensitivity_markdown(verdicts)
        if verdicts
        else ""
    )
    out.write_text(
        f"# Findings\n{note}\nEvery number below was measured on this machine (2 CPU cores) and is filled in from "
        f"the runs' committed summaries by `creditrl findings` ({when}); `make findings` runs "
        "whatever is missing and rewrites this file, `creditrl findings --no-train` rebuilds it from the summaries "
        "alone.\n\n"
        + _PROTOCOL
        + "\n\n"
        + changes
        + verdicts_markdown(verdicts, waiting)
        + robust
        + figures
        + "\n"
        + "\n".join(texts)
    )
    if not quick:
        _write_verdicts_json(verdicts, docs / VERDICTS_JSON, when)
    print(f"[creditrl findings] wrote {out} ({len(texts)} findings)")
    return out


VERDICTS_JSON = "verdicts.json"  # beside the findings' figures: every verdict row's numbers, read by README's table


def _write_verdicts_json(verdicts: list[dict[str, Any]], path: Path, when: str) -> None:
    """Every verdict row as FINDINGS.md's table states it, in numbers (accuracy fractions; the
    interval at the row's Holm level): what README's results table is generated from."""
    keep = ("claim", "finding", "arm", "reference", "role", "expect", "verdict", "gain", "reference_gain", "fragile")
    rows = [{k: r[k] for k in keep} | {"difference": r["difference"]} for r in verdicts]
    text = json.dumps({"summarised": when, "rows": rows}, indent=1, sort_keys=True, default=float)
    path.write_text(text + "\n")
