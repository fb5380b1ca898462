"""``creditrl findings`` / ``make findings``: FINDINGS.md from committed finding files.

A finding file (``findings/*.yaml``) names a grid (``grids/*.yaml``, run by
:func:`creditrl.experiments.compare.run_compare`, resumably) and holds the prose: ``title``,
``question``, ``claim`` (the folk claim it tests) and ``reading``, a paragraph whose numbers are
placeholders filled from the grid's results, so no number in FINDINGS.md is typed by hand:

- ``{ARM.FIELD}`` with ARM the arm's slug (``gae + critic`` -> ``gae_critic``) and FIELD one of
  ``final``, ``step_final`` (accuracies, "27.3 ± 1.2%"), ``start`` ("23.4%"), ``iter_s``,
  ``wall_s`` (seconds, "1.23 ± 0.05 s"), ``length`` (held-out response length, "31.2 ± 0.4
  tokens"), ``length_start`` (the same before RL, "30.1 tokens"), ``tokens``, ``samples`` (counts), ``reached``
  ("2/3"), ``samples_to_target``, ``wall_to_target``;
- ``{ratio:ARM_A/ARM_B.FIELD}``: the ratio of the two means ("2.4x").

Each finding gets its question, setting (the grid's base, overrides, budget, seeds and arms), the
results table, the plots (copied to ``docs/findings/``) and the filled reading.
"""

from __future__ import annotations

import re
import shutil
import time
from pathlib import Path
from typing import Any

import yaml

from creditrl.config import ConfigError
from creditrl.experiments.compare import CompareRow, launch_text, load_grid, results_markdown, run_compare
from creditrl.experiments.seeds import slug

FINDING_KEYS = {"id", "title", "grid", "report", "question", "claim", "reading", "plots"}
REPORTS = ("values",)  # a finding measured by a report instead of a compare grid: creditrl value-report
PLOTS = ("accuracy_vs_samples", "accuracy_vs_wall_time", "length_vs_samples")  # what run_compare draws
DEFAULT_PLOTS = PLOTS[:2]
_PLACEHOLDER = re.compile(r"\{(ratio:)?([A-Za-z0-9_]+)(?:/([A-Za-z0-9_]+))?\.([a-z_]+)\}")


def load_finding(path: Path) -> dict[str, Any]:
    data = yaml.safe_load(Path(path).read_text()) or {}
    if (
        not isinstance(data, dict)
        or set(data) - FINDING_KEYS
        or not {"id", "title", "question", "reading"} <= set(data)
        or ("grid" in data) == ("report" in data)
    ):
        raise ConfigError(
            f"{path}: a finding file has keys {sorted(FINDING_KEYS)}: one of grid or report; claim, "
            f"plots optional; got {sorted(data) if isinstance(data, dict) else data!r}"
        )
    if "report" in data:
        if data["report"] not in REPORTS:
            raise ConfigError(f"{path}: key 'report' must be one of {', '.join(REPORTS)}; got {data['report']!r}")
        return data
    plots = data.setdefault("plots", list(DEFAULT_PLOTS))
    if not isinstance(plots, list) or not plots or any(p not in PLOTS for p in plots):
        raise ConfigError(f"{path}: key 'plots' must be a non-empty list of {', '.join(PLOTS)}; got {plots!r}")
    return data


def _mean(stat: Any) -> float | None:
    """The mean of a ``(mean, ci95)`` pair (a list once read from JSON), or the number itself."""
    return None if stat is None else float(stat[0] if isinstance(stat, (list, tuple)) else stat)


def _fmt(field: str, value: Any) -> str:
    if value is None:
        return "not reached"
    if field == "start":
        return f"{100 * value:.1f}%"
    if field == "reached":
        return str(value)
    if field == "length_start":
        return f"{value:.1f} tokens"
    if field == "rank_acc":  # value report
        return "n/a" if value != value else f"{100 * value:.1f}%"
    if field == "mae":
        return f"{float(value[0]):.3f} ± {float(value[1]):.3f}"
    if isinstance(value, (int, float)):
        return f"{value:,.0f}"
    mean, ci = float(value[0]), float(value[1])
    if field in ("final", "step_final"):
        return f"{100 * mean:.1f} ± {100 * ci:.1f}%"
    if field in ("iter_s", "wall_s", "wall_to_target"):
        return f"{mean:.2f} ± {ci:.2f} s"
    if field == "length":
        return f"{mean:.1f} ± {ci:.1f} tokens"
    return f"{mean:,.0f} ± {ci:,.0f}"


def fill(template: str, rows: list[dict[str, Any]]) -> str:
    """Replace every placeholder of ``template`` (module docstring) by the number from ``rows``
    (``CompareRow`` dicts); an unknown arm or field raises ValueError naming it."""
    by_slug = {slug(r["arm"]): r for r in rows}

    def value(arm: str, field: str) -> Any:
        if arm not in by_slug:
            raise ValueError(f"reading: unknown arm '{arm}'; arms: {', '.join(sorted(by_slug))}")
        row = by_slug[arm]
        if field == "reached":
            return f"{row['reached']}/{row['seeds']}"
        if field not in row:
            raise ValueError(f"reading: unknown field '{field}'; fields: {', '.join(sorted(row))}")
        return row[field]

    def sub(m: re.Match) -> str:
        ratio, a, b, field = m.groups()
        if ratio:
            if b is None:
                raise ValueError(f"reading: {m.group(0)} needs two arms, {{ratio:A/B.field}}")
            num, den = _mean(value(a, field)), _mean(value(b, field))
            return "n/a" if not num or not den else f"{num / den:.1f}x"
        return _fmt(field, value(a, field))

    return _PLACEHOLDER.sub(sub, template)


def _section(finding: dict[str, Any], grid, summary: dict[str, Any], plots: list[Path], root: Path) -> str:
    rows = summary["rows"]
    table = results_markdown(
        [CompareRow(**{k: tuple(v) if isinstance(v, list) else v for k, v in r.items()}) for r in rows]
    )
    arms = "; ".join(f"**{name}**: `{' '.join(over) or '(base)'}`" for name, over in grid.arms.items())
    images = "\n".join(f"![{p.stem}]({p.relative_to(root).as_posix()})" for p in plots)
    claim = f"\n*Folk claim:* {finding['claim'].strip()}\n" if finding.get("claim") else ""
    return (
        f"## {finding['id']}: {finding['title']}\n\n*Question:* {finding['question'].strip()}\n{claim}\n"
        f"*Setting:* base `{grid.base.name}` with `{' '.join(grid.common) or '-'}`; {grid.budget:,} generated "
        f"{grid.unit} per run; seeds {grid.seeds}; start `{summary['init']}`; launched: "
        f"{launch_text(summary.get('launches', [{}]))}. Arms: {arms}. "
        f"Regenerate: `creditrl compare {finding['grid']}` (then `creditrl findings`).\n\n"
        f"{table}\n{images}\n\n*Reading.* {fill(finding['reading'].strip(), rows)}\n"
    )


def _report_section(finding: dict[str, Any], runs: Path, docs: Path, root: Path, quick: bool) -> str:
    """A finding measured by ``creditrl value-report`` (the only report kind so far)."""
    from creditrl.experiments.value_report import EstimatorRow, results_markdown, run_value_report

    where = runs / "values"
    summary = run_value_report(where, quick=quick)
    rows = summary["rows"]
    table = results_markdown(
        [EstimatorRow(**{k: tuple(v) if isinstance(v, list) else v for k, v in r.items()}) for r in rows],
        summary["truth_se"],
    )
    dest = docs / f"{finding['id']}_value_error.png"
    shutil.copyfile(where / "plots" / "value_error.png", dest)
    st = summary["settings"]
    claim = f"\n*Folk claim:* {finding['claim'].strip()}\n" if finding.get("claim") else ""
    return (
        f"## {finding['id']}: {finding['title']}\n\n*Question:* {finding['question'].strip()}\n{claim}\n"
        f"*Setting:* base `{Path(st['base']).name}`; the start policy `{summary['init']}` held fixed; one tree "
        f"(branching {st['branching']}, depth {st['depth']}) per held-out problem ({st['problems']} problems), every "
        f"inner node a state; truth = the mean outcome of {st['truth']} fresh continuations; MC K in {st['mc']}; "
        f"critics trained for {st['critic_iterations']} iterations without a policy update. "
        f"Regenerate: `creditrl value-report --out runs/findings/values` (then `creditrl findings`).\n\n"
        f"{table}\n![value_error]({dest.relative_to(root).as_posix()})\n\n"
        f"*Reading.* {fill(finding['reading'].strip(), rows)}\n"
    )


def run_findings(
    root: Path, *, quick: bool = False, out: Path | None = None, runs: Path | None = None, jobs: int = 1
) -> Path:
    """Run every finding's grid (resumably; ``jobs`` runs at a time) and write FINDINGS.md
    (``out``) with its plots."""
    root = Path(root)
    files = sorted((root / "findings").glob("*.yaml"))
    if not files:
        raise ConfigError(f"{root / 'findings'}: no finding files (*.yaml)")
    out = Path(out or root / "FINDINGS.md")
    runs = Path(runs or root / "runs" / ("findings-quick" if quick else "findings"))
    docs = out.parent / "docs" / "findings"
    docs.mkdir(parents=True, exist_ok=True)
    sections = []
    for f in files:
        finding = load_finding(f)
        if "report" in finding:
            sections.append(_report_section(finding, runs, docs, out.parent, quick))
            continue
        grid_path = root / finding["grid"]
        grid = load_grid(grid_path, quick=quick)
        where = runs / grid.name
        summary = run_compare(grid_path, where, quick=quick, jobs=jobs)
        plots = []
        for name in finding["plots"]:
            dest = docs / f"{finding['id']}_{name}.png"
            shutil.copyfile(where / "plots" / f"{name}.png", dest)
            plots.append(dest)
        sections.append(_section(finding, grid, summary, plots, out.parent))
    note = "\n**Quick mode: smoke test only, the numbers mean nothing.**\n" if quick else ""
    out.write_text(
        f"# Findings\n{note}\nEvery number below was measured on this machine (2 CPU cores) and is filled in from the "
        f"runs by `creditrl findings` ({time.strftime('%Y-%m-%d')}); `make findings` reruns whatever is missing "
        "(finished runs are read back) and rewrites this file. Intervals are 95% Student-t intervals over seeds.\n\n"
        + "\n".join(sections)
    )
    print(f"[creditrl findings] wrote {out} ({len(sections)} findings)")
    return out
