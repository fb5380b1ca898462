"""The inspector page: one self-contained HTML file (data, CSS and JS inlined; no network).

``page_data`` gathers what the page shows (the saved groups of each iteration, every requested
estimator recomputed on them, the per-iteration metrics); ``render_page`` inlines it into
``static/template.html`` with ``static/inspector.css`` and ``static/inspector.js``. The page's
DOM carries stable hooks for tests and scripts: ``#iteration-select``, ``#group-select``,
``#estimator-select``, ``#compare-select``, ``#column-left`` / ``#column-right``
(``data-estimator``), ``.response`` (``data-response``, ``data-outcome``), ``.tok``
(``data-adv``, ``data-index``, ``data-reward`` on placed rewards, class ``step-end``),
``.step-label`` (``data-label`` 1/0), ``#credit-precision`` / ``#credit-precision-all``
(``-right`` for the compare column; ``data-value`` the number, the text ``percent(value)``),
``#legend-max`` (``data-value`` = the colour scale's max |A|, 0 when every advantage shown is
under the floor ``floor``, :mod:`creditrl.inspect.scale`). Reward spread
(:mod:`creditrl.inspect.spread`): ``#credit-why`` (``-right``) says why the group's credit
precision is undefined, ``#credit-note`` flags credit equal on every token, ``#spread-note`` the
group's missing spread, ``#spread-count`` (``data-none``, ``data-groups``) how many saved groups
lack it, ``#spread-filter`` (a checkbox) shows only groups with spread, and ``#group-select``'s
options carry ``data-spread`` (1/0).
"""

from __future__ import annotations

import html
import json
import re
from importlib import resources
from pathlib import Path
from typing import Any

from creditrl.inspect.compare import TRAINED, compare_iteration
from creditrl.inspect.data import load_iteration, load_metrics
from creditrl.inspect.scale import ADV_FLOOR
from creditrl.inspect.spread import has_spread, spread_counts, spread_note


# The per-iteration charts: title, the metrics.jsonl keys drawn, what shows when none exist.
def _chart(title: str, series: list[tuple[str, str]], empty: str) -> dict[str, Any]:
    return {"title": title, "series": [{"key": k, "label": label} for k, label in series], "empty": empty}


CHARTS: list[dict[str, Any]] = [
    _chart("reward (mean)", [("reward/mean", "train")], "no reward logged"),
    _chart("accuracy", [("train/accuracy", "train"), ("eval/accuracy", "held-out")], "no accuracy logged"),
    _chart("KL", [("policy/approx_kl", "to old policy"), ("kl/ref", "to reference")], "no KL logged"),
    _chart("response length", [("response/length", "tokens")], "no length logged"),
    _chart("explained variance", [("value/explained_variance", "critic")], "no values in this run (value.source=none)"),
]
# Response fields the page reads (the rest of a saved response stays out of the file).
_SHOWN = (
    "texts",
    "special",
    "masked",
    "rewards",
    "reward_mask",
    "step_ends",
    "steps",
    "labels",
    "values",
    "outcome",
    "kept",
    "finished",
    "completion",
)


def iteration_view(record: dict[str, Any], estimators: list[str]) -> dict[str, Any]:
    """One iteration as the page holds it: settings, groups (with their reward spread), how
    many lack spread, and every estimator's credit."""
    results = compare_iteration(record, estimators)
    return {
        "iteration": record["iteration"],
        "settings": record["settings"],
        "groups_in_batch": record["groups_in_batch"],
        "groups": [
            {
                "group_id": g["group_id"],
                "prompt": g["prompt"],
                "answer": g["answer"],
                "spread": has_spread(g),
                "spread_note": spread_note(g),
                "responses": [{k: r[k] for k in _SHOWN} for r in g["responses"]],
            }
            for g in record["groups"]
        ],
        "spread": spread_counts(record["groups"]),
        "order": [TRAINED] + estimators,
        "estimators": results,
    }


def page_data(
    run_dir: Path, iterations: list[int], estimators: list[str], initial: int, *, only_spread: bool = False
) -> dict[str, Any]:
    """Everything the page shows; ``initial`` is the iteration selected when it opens, and
    ``only_spread`` whether it opens showing only the groups with reward spread."""
    run_dir = Path(run_dir)
    keys = {"iteration"} | {s["key"] for c in CHARTS for s in c["series"]}
    metrics = [{k: v for k, v in row.items() if k in keys} for row in load_metrics(run_dir)]
    views = [iteration_view(load_iteration(run_dir, i), estimators) for i in iterations]
    return {
        "run": run_dir.resolve().name,
        "initial": iterations.index(initial),
        "only_spread": only_spread,
        "floor": ADV_FLOOR,  # advantages under it in size are drawn as 0 (creditrl.inspect.scale)
        "iterations": views,
        "spread": {k: sum(v["spread"][k] for v in views) for k in ("none", "groups")},
        "metrics": metrics,
        "charts": CHARTS,
    }


def _static(name: str) -> str:
    return resources.files("creditrl.inspect").joinpath("static", name).read_text(encoding="utf-8")


def render_page(data: dict[str, Any]) -> str:
    """The HTML text: the template with the CSS, JS and ``data`` (as JSON) inlined."""
    # "<" escaped so that no token text can close the <script> element that holds the data
    blob = json.dumps(data, separators=(",", ":"), allow_nan=False).replace("<", "\\u003c")
    parts = {
        "/*__CSS__*/": _static("inspector.css"),
        "/*__JS__*/": _static("inspector.js"),
        "__TITLE__": html.escape(f"credit inspector: {data['run']}"),
        "__DATA__": blob,
    }
    # one pass, so that inlined text that happens to contain a marker is never replaced again
    return re.sub("|".join(map(re.escape, parts)), lambda m: parts[m.group(0)], _static("template.html"))
