"""The credit inspector's report: an HTML file and PNG figures of a run's saved groups.

:func:`build_report` (``creditrl inspect RUN_DIR``) writes into ``--out`` (default
``RUN_DIR/inspect_report``): ``index.html`` (self-contained: open it in any browser, offline),
``metrics.png`` and, for the shown iteration's first saved group (with ``only_spread``: its first
group with reward spread, when it has one), ``credit_iter_NNNNNN_<estimator>.png`` per estimator
(and ``_trained`` for the run's own advantages).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from creditrl.inspect.compare import TRAINED, parse_estimators
from creditrl.inspect.data import InspectError, load_iteration, saved_iterations, spread
from creditrl.inspect.html import CHARTS, page_data, render_page
from creditrl.inspect.scale import scale_max
from creditrl.inspect.spread import has_spread

MAX_ITERATIONS = 30  # iterations inlined into one page by default (evenly spaced when more were saved)


@dataclass
class Report:
    html: Path
    pngs: list[Path] = field(default_factory=list)
    iterations: list[int] = field(default_factory=list)  # inlined into the page
    shown: int = 0  # the iteration the page opens at and the PNGs show
    left_out: list[int] = field(default_factory=list)  # saved but not inlined (over max_iterations)


def build_report(
    run_dir: Path,
    *,
    iteration: int | None = None,
    estimators: str | None = None,
    out: Path | None = None,
    max_iterations: int = MAX_ITERATIONS,
    png: bool = True,
    only_spread: bool = False,
) -> Report:
    """Write the page (and the PNGs with ``png``) for ``run_dir``; ``iteration`` is the one the
    page opens at (default: the last saved; with ``only_spread`` the first saved one holding a
    group with reward spread), ``estimators`` a comma-separated list (default: every registered
    one); ``only_spread`` opens the page with its "only groups with reward spread" filter on, at
    that iteration's first group with spread, and draws that group's PNGs. InspectError for a run
    without inspector data, an unsaved iteration or an unknown estimator (listing the valid ones)."""
    run_dir = Path(run_dir)
    saved = saved_iterations(run_dir)
    shown = iteration if iteration is not None else first_with_spread(run_dir, saved) if only_spread else saved[-1]
    first = load_iteration(run_dir, shown)  # the error for an unsaved iteration lists the saved ones
    names = parse_estimators(estimators, first["settings"]["estimator"])
    if max_iterations < 1:
        raise InspectError(f"--max-iterations must be >= 1, got {max_iterations}")
    inlined = spread(saved, max_iterations, must=shown)
    out = Path(out) if out else run_dir / "inspect_report"
    out.mkdir(parents=True, exist_ok=True)
    data = page_data(run_dir, inlined, names, shown, only_spread=only_spread)
    report = Report(
        out / "index.html", iterations=inlined, shown=shown, left_out=[i for i in saved if i not in inlined]
    )
    report.html.write_text(render_page(data), encoding="utf-8")
    if png:
        report.pngs = _figures(data, out, only_spread)
    return report


def first_with_spread(run_dir: Path, saved: list[int]) -> int:
    """The first of the ``saved`` iterations holding a group with reward spread (the last saved
    when none holds one: the page then says that no group has spread)."""
    for it in saved:
        if any(has_spread(g) for g in load_iteration(run_dir, it)["groups"]):
            return it
    return saved[-1]


def _figures(data: dict, out: Path, only_spread: bool = False) -> list[Path]:
    from creditrl.inspect.figures import credit_figure, metrics_figure

    view = data["iterations"][data["initial"]]
    paths = [metrics_figure(data["metrics"], CHARTS, out / "metrics.png", [v["iteration"] for v in data["iterations"]])]
    if not view["groups"]:
        return paths
    with_spread = [i for i, g in enumerate(view["groups"]) if g["spread"]]
    gi = with_spread[0] if only_spread and with_spread else 0
    group = view["groups"][gi]
    available = [k for k in view["order"] if view["estimators"][k]["available"]]
    max_abs = scale_max(a for k in available for row in view["estimators"][k]["adv"][gi] for a in row)
    for key in available:
        e = view["estimators"][key]
        p = e["precision"]["groups"][gi]
        why = f" ({p['why']})" if p["why"] else ""
        title = (
            f"iteration {view['iteration']}, {group['prompt']} (group {group['group_id']}): "
            f"{e['label']}; credit precision {p['text']}{why}"
        )
        name = f"credit_iter_{view['iteration']:06d}_{'trained' if key == TRAINED else key}.png"
        paths.append(credit_figure(group, e["adv"][gi], title, out / name, max_abs))
    return paths
