"""A finding file (``findings/*.yaml``): its keys, checked on load (:func:`load_finding`), and its
reading's placeholders filled from a grid's results (:func:`fill`)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from creditrl.config import ConfigError
from creditrl.config.loader import read_yaml_file
from creditrl.experiments.claim_verdicts import level_text
from creditrl.experiments.compare_report import comparable, reach_text, wall_ratio
from creditrl.experiments.plan import slug
from creditrl.experiments.timing import timing_text

TIME_FIELDS = {"iter_s", "wall_s", "wall_to_target"}  # fields that depend on the machine
_NO_KIND = "not comparable, the arms share no kind of CPU"

FINDING_KEYS = {
    "id",
    "title",
    "grid",
    "question",
    "claim",
    "reading",
    "plots",
    "claim_id",
    "expect",
    "regime",
    "task",
    "power",
    "sequence_level",
    "sequence_expect",
    "also",
    "timing",
    "time_claim",
}
CLAIMS = {
    "C1": "length: sequence reward + GAE suffices below ~100 tokens; above ~500 token-level rewards or MCTS are needed",
    "C2": "cost-benefit: token-level (PRM) rewards give about +15% for about 3x the training time",
    "C3": "hybrids: 80% sequence-level then 20% token-level gives about +10%; filter by outcome, then dense rewards",
    "C4": "critic: a GAE lambda schedule (0.5 to 0.95) helps by about 30%; dual critics (min) train better",
    "C5": "value sources: Monte-Carlo values vs a learned critic vs tree values, per sample and per second",
    "C6": "automatic labels: outcome and MC step labels are noisy; voting and calibration repair them",
    "C7": "tree search: MCTS / tree credit in training vs GRPO at equal generated tokens",
}
PLOTS = ("accuracy_vs_samples", "accuracy_vs_wall_time", "length_vs_samples")  # what run_compare draws
DEFAULT_PLOTS = PLOTS[:2]
# a kind is a word (ratio: ...) or another finding's id (C1-long:), whose verdict rows the field reads
_PLACEHOLDER = re.compile(
    r"\{(ratio:|diff:|cmp:|timing:|changes:|[A-Z][A-Z0-9]*-[a-z]+:)?([A-Za-z0-9_]+)(?:/([A-Za-z0-9_]+))?\.([a-z_]+)\}"
)
FAMILY = "family"  # {family.changes}: what the finding's rows change in its claim's Holm family
# per-arm fields computed from the runs' histories, not the table's rows
_FROM_RESULTS = ("gain", "moved", "finals", "starts")
# per-arm diagnostics from the runs' histories (a summary's windows): the mean over the run, then over seeds
DIAGNOSTICS = {
    "explained_variance": ("value/explained_variance", "{:.2f}"),
    "zero_spread": ("reward/zero_spread_groups", "{:.0%}"),
    "kl": ("kl/ref", "{:.3f}"),
    "entropy": ("policy/entropy", "{:.3f}"),
}


def load_finding(path: Path) -> dict[str, Any]:
    data = read_yaml_file(path, "finding") or {}
    if (
        not isinstance(data, dict)
        or set(data) - FINDING_KEYS
        or not {"id", "title", "grid", "question", "reading"} <= set(data)
    ):
        raise ConfigError(
            f"{path}: a finding file has keys {sorted(FINDING_KEYS)}: id, title, grid, question and reading; claim, "
            f"plots optional; got {sorted(data) if isinstance(data, dict) else data!r}"
        )
    plots = data.setdefault("plots", list(DEFAULT_PLOTS))
    if not isinstance(plots, list) or not plots or any(p not in PLOTS for p in plots):
        raise ConfigError(f"{path}: key 'plots' must be a non-empty list of {', '.join(PLOTS)}; got {plots!r}")
    if "expect" in data:
        if data.get("claim_id") not in CLAIMS:
            raise ConfigError(f"{path}: key 'claim_id' must be one of {', '.join(CLAIMS)} with 'expect'")
        if not isinstance(data["expect"], dict) or not data["expect"]:
            raise ConfigError(f"{path}: key 'expect' must map arms to better, worse or same")
        data["expect"] = {str(arm): _expectation(path, arm, e) for arm, e in data["expect"].items()}
    claimed = data.get("time_claim")
    if claimed is not None and (isinstance(claimed, bool) or not isinstance(claimed, (int, float)) or claimed <= 0):
        raise ConfigError(f"{path}: key 'time_claim' must be a positive number (the claimed ratio); got {claimed!r}")
    if "timing" in data and not isinstance(data["timing"], str):
        raise ConfigError(f"{path}: key 'timing' must be a timing.json path relative to the repository root")
    if "also" in data:  # further verdict rows: [{arm, against, expect}], in the claim's Holm family
        also = data["also"]
        if not isinstance(also, list) or not all(
            isinstance(x, dict) and set(x) == {"arm", "against", "expect"} and x["arm"] != x["against"] for x in also
        ):
            raise ConfigError(f"{path}: key 'also' must be a list of {{arm, against, expect}} with two different arms")
        if data.get("claim_id") not in CLAIMS:
            raise ConfigError(f"{path}: key 'claim_id' must be one of {', '.join(CLAIMS)} with 'also'")
        data["also"] = [
            {"arm": str(x["arm"]), "against": str(x["against"]), "expect": _expectation(path, x["arm"], x["expect"])}
            for x in also
        ]
    if "sequence_expect" in data:
        if "sequence_level" not in data:
            raise ConfigError(f"{path}: key 'sequence_expect' needs 'sequence_level', the arm it compares with")
        data["sequence_expect"] = _expectation(path, "sequence_level", data["sequence_expect"])
    return data


def _expectation(path: Path, arm: str, text: Any) -> tuple[str, float | None]:
    """``better`` -> ("better", None); ``better by 5`` -> ("better", 0.05); ``no better``."""
    text = str(text).strip()
    if text in ("no better", "no worse", "same", "any"):
        return text, None
    words = text.split()
    if words and words[0] in ("better", "worse") and (len(words) == 1 or (len(words) == 3 and words[1] == "by")):
        try:
            return words[0], float(words[2]) / 100 if len(words) == 3 else None
        except ValueError:
            pass
    raise ConfigError(
        f"{path}: expect '{arm}': expected better, worse (optionally 'by N' points), same, no better, no worse or any; "
        f"got {text!r}"
    )


def _mean(stat: Any) -> float | None:
    """The mean of a ``(mean, ci95)`` pair (a list once read from JSON), or the number itself."""
    return None if stat is None else float(stat[0] if isinstance(stat, (list, tuple)) else stat)


def _fmt(field: str, value: Any) -> str:
    if field == "diff":
        return "the reference" if value is None else diff_text(value)
    if field == "verdict":
        return str(value)
    if value is None:
        return "not reached"
    if field == "start":
        return f"{100 * value:.1f}%"
    if field == "reached":
        return str(value)
    if field == "length_start":
        return f"{value:.1f} tokens"
    if field in ("samples_to_target", "wall_to_target"):
        return reach_text(
            tuple(value), " s" if field == "wall_to_target" else "", 1 if field == "wall_to_target" else 0
        )
    if isinstance(value, (int, float)):
        return f"{value:,.0f}"
    mean, ci = float(value[0]), float(value[1])
    if field in ("final", "step_final"):
        return f"{100 * mean:.1f} ± {100 * ci:.1f}%"
    if field in TIME_FIELDS:
        return f"{mean:.2f} ± {ci:.2f} s"
    if field == "length":
        return f"{mean:.1f} ± {ci:.1f} tokens"
    return f"{mean:,.0f} ± {ci:,.0f}"


def fill(
    template: str,
    rows: list[dict[str, Any]],
    machines: dict[str, list[str | None]] | None = None,
    results: dict[str, list[list[dict[str, Any]]]] | None = None,
    verdicts: list[dict[str, Any]] | None = None,
    timing: dict[str, Any] | None = None,
    time_claim: float | None = None,
    seeds: dict[str, list[int]] | None = None,
    others: dict[str, list[dict[str, Any]]] | None = None,
    changes: Callable[[tuple[str, ...] | None], str] | None = None,
) -> str:
    """Replace every placeholder of ``template`` (syntax in :mod:`creditrl.experiments.findings`)
    by its number: per-arm fields from ``rows`` (``CompareRow`` dicts), differences, gains and
    diagnostics from ``results`` (each arm's per-seed histories) at the levels of ``verdicts`` (the
    finding's judged rows), time ratios from ``timing`` (:func:`load_timing`) against
    ``time_claim``; a difference pairs the seeds both arms ran (``seeds``: each arm's, in the order
    of its runs in ``results``; None: every arm ran the same). A ratio of times between arms that
    ran on different kinds of CPU (``machines``,
    :func:`creditrl.experiments.compare_report.comparable`) says so instead of a number; with
    ``results``, a ratio of wall times is taken within each kind of CPU the two arms share
    (:func:`~creditrl.experiments.compare_report.wall_ratio`). ``others``: every finding's judged
    verdict rows by finding id (an empty list for a finding without any yet), which
    ``{ID:A/B.verdict}`` and ``{ID:A/B.diff}`` read; ``changes``: given arm names (None: every arm),
    what their rows change in the claim's Holm family
    (:func:`~creditrl.experiments.claim_verdicts.family_changes`), which ``{family.changes}``,
    ``{ARM.changes}`` and ``{changes:A/B.verdicts}`` read.

    Raises:
        ValueError: An unknown arm or field, a placeholder that needs ``results`` without them, or
            one naming a finding ``others`` does not hold.
    """
    by_slug = {slug(r["arm"]): r for r in rows}
    from creditrl.experiments.verdicts import seeds_differ

    varied = seeds_differ(seeds)  # then a difference names its seeds

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
        kind, a, b, field = m.groups()
        if kind and b is None:
            raise ValueError(f"reading: {m.group(0)} needs two arms, {{{kind}A/B.{field}}}")
        if _other_finding(kind):
            return other_row(kind[:-1], a, b, field, m.group(0))
        if (not kind and field == "changes") or kind == "changes:":
            if kind and field != "verdicts":
                raise ValueError(f"reading: {m.group(0)}: the changes of two arms' rows are '.verdicts'")
            if changes is None:
                raise ValueError(f"reading: {m.group(0)} needs the claim's judged rows")
            return changes(None if a == FAMILY and not kind else tuple(value(x, "arm") for x in (a, b) if x))
        if kind == "timing:":
            if field != "ratio":
                raise ValueError(f"reading: {{timing:{a}/{b}.{field}}}: a controlled timing gives 'ratio' only")
            return timing_text(timing, value(a, "arm"), value(b, "arm"), time_claim)
        if kind in ("diff:", "cmp:"):
            d = pair(a, b, field, kind)
            return diff_text(d, varied) if kind == "diff:" else _side(d)
        if kind:
            if field == "wall_s" and results is not None:  # within each kind of CPU both ran on
                ratio = wall_ratio(results, machines, value(a, "arm"), value(b, "arm"))
                if ratio is None:
                    return "n/a" if comparable(machines, value(a, "arm"), value(b, "arm")) else _NO_KIND
                return f"{ratio:.1f}x"
            if field in TIME_FIELDS and not comparable(machines, value(a, "arm"), value(b, "arm")):
                return "not comparable, the arms ran on different kinds of CPU"
            num, den = _mean(value(a, field)), _mean(value(b, field))
            return "n/a" if not num or not den else f"{num / den:.1f}x"
        if field in _FROM_RESULTS:
            if field in ("finals", "starts"):  # each seed's last (first) held-out exact match, in seed order
                at = -1 if field == "finals" else 0
                return ", ".join(f"{100 * e[at]:.1f}" for e in evals(a, m.group(0))) + "%"
            d = gain(a, m.group(0))
            return diff_text(d) if field == "gain" else f"{_side(d)} its start"
        if field in DIAGNOSTICS:
            return diagnostic(a, field, m.group(0))
        if field == "diff" and value(a, field) is not None:
            return diff_text(value(a, field), varied)
        return _fmt(field, value(a, field))

    def pair(a: str, b: str, field: str, kind: str) -> dict[str, Any]:
        from creditrl.experiments.verdicts import outcome_matrix, paired_difference, shared_runs

        if field != "final":
            raise ValueError(f"reading: {{{kind}{a}/{b}.{field}}}: a difference between arms is of 'final' only")
        if results is None:
            raise ValueError(f"reading: {{{kind}{a}/{b}.final}} needs the arms' results")
        x, y = value(a, "arm"), value(b, "arm")
        if judged := [r["difference"] for r in verdicts or [] if (r["arm"], r["reference"]) == (x, y)]:
            return judged[0]
        runs, against, _ = shared_runs(results, seeds, x, y)
        return asdict(paired_difference(outcome_matrix(runs), outcome_matrix(against)))

    def other_row(finding: str, a: str, b: str, field: str, text: str) -> str:
        if others is None or finding not in others:
            raise ValueError(f"reading: {text} names finding '{finding}'; findings: {', '.join(sorted(others or {}))}")
        if field not in ("verdict", "diff"):
            raise ValueError(f"reading: {text}: another finding's row gives 'verdict' or 'diff' only")
        row = next((r for r in others[finding] if (slug(r["arm"]), slug(r["reference"])) == (a, b)), None)
        if row is None:
            return "not judged yet"
        if field == "diff":
            return diff_text(row["difference"], seeds=True)
        return row["verdict"] + (", fragile" if row["fragile"] else "")

    def evals(arm: str, text: str) -> list[list[float]]:
        if results is None:
            raise ValueError(f"reading: {text} needs the arms' results")
        return [[r["eval/accuracy"] for r in h if "eval/accuracy" in r] for h in results[value(arm, "arm")]]

    def gain(arm: str, text: str) -> dict[str, Any]:
        from creditrl.experiments.verdicts import t_difference

        return asdict(t_difference([e[-1] - e[0] for e in evals(arm, text)]))

    def diagnostic(arm: str, field: str, text: str) -> str:
        from creditrl.experiments.summaries import run_mean

        if results is None:
            raise ValueError(f"reading: {text} needs the arms' results")
        key, fmt = DIAGNOSTICS[field]
        name = value(arm, "arm")
        per_seed = [run_mean(h, key) for h in results[name]]
        kept = [x for x in per_seed if x is not None]
        if not kept:
            return "not recorded"
        mean = fmt.format(sum(kept) / len(kept))
        if len(kept) == len(per_seed):
            return mean
        labels = (seeds or {}).get(name) or range(len(per_seed))
        which = ", ".join(str(s) for s, x in zip(labels, per_seed) if x is not None)
        return f"{mean} on seed{'s' if len(kept) > 1 else ''} {which} (the others' summaries keep none)"

    return _PLACEHOLDER.sub(sub, template)


def load_timing(finding: dict[str, Any], root: Path) -> dict[str, Any] | None:
    """The controlled timing result (``creditrl compare GRID --timing``'s timing.json) a finding's
    ``timing`` key names, relative to the repository ``root``; None when it names none or the file
    is not committed yet."""
    f = root / finding["timing"] if finding.get("timing") else None
    return json.loads(f.read_text()) if f is not None and f.is_file() else None


def _side(d: dict[str, Any]) -> str:
    """Where an interval puts the first of two things against the second: the words the numbers decide."""
    return "above" if d["lo"] > 0 else "below" if d["hi"] < 0 else "not shown different from"


def _other_finding(kind: str | None) -> bool:
    """Whether a placeholder's kind names another finding (``C1-long:``), not a word (``diff:``)."""
    return bool(kind) and kind[0].isupper()


def names_only(template: str, arms: list[str]) -> bool:
    """Whether every placeholder of ``template`` names only arms among ``arms`` (by slug), so that
    it can be filled before the grid's other arms have run."""
    slugs = {slug(a) for a in arms}
    own = [
        m
        for m in _PLACEHOLDER.finditer(template)
        if not _other_finding(m.group(1)) and (m.group(1), m.group(2)) != (None, FAMILY)
    ]
    return all(m.group(2) in slugs and m.group(3) in (None, *slugs) for m in own)


def diff_text(d: dict[str, float], seeds: bool = False) -> str:
    """A paired difference in points with its interval: ``+2.3 points [-0.4, +5.0]`` at 95%, its
    level named otherwise (``+2.3 points [-1.1, +5.7] at 99.4%``, Holm-adjusted); ``seeds``: with
    the seeds it pairs (``... on 3 seeds``, where a grid's arms ran different seeds)."""
    level = d.get("level", 0.95)
    at = "" if level == 0.95 else f" at {level_text(level)}"
    on = f" on {d['seeds']} seeds" if seeds else ""
    return f"{100 * d['mean']:+.1f} points [{100 * d['lo']:+.1f}, {100 * d['hi']:+.1f}]{at}{on}"
