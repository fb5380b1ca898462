"""``creditrl inspect RUN_DIR``: the credit inspector as an HTML file and PNG figures."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def cmd_inspect(args: argparse.Namespace) -> int:
    from creditrl.inspect.data import InspectError  # imported here: parsing any command stays light
    from creditrl.inspect.report import MAX_ITERATIONS, build_report

    try:
        report = build_report(
            Path(args.run_dir),
            iteration=args.iteration,
            estimators=args.estimators,
            out=Path(args.out) if args.out else None,
            max_iterations=MAX_ITERATIONS if args.max_iterations is None else args.max_iterations,
            png=not args.no_png,
            only_spread=args.only_spread,
        )
    except InspectError as exc:
        print(f"creditrl inspect: error: {exc}", file=sys.stderr)
        return 2
    print(
        f"credit inspector: {report.html} (iterations {', '.join(map(str, report.iterations))}; "
        f"opens at {report.shown})"
    )
    if report.left_out:
        print(
            f"  {len(report.left_out)} saved iterations not inlined (raise --max-iterations, or pick one "
            f"with --iteration): {', '.join(map(str, report.left_out))}"
        )
    for p in report.pngs:
        print(f"  {p}")
    if args.screenshot:
        from creditrl.inspect.screenshot import screenshot

        try:
            print(f"  screenshot: {screenshot(report.html, Path(args.screenshot))}")
        except RuntimeError as exc:
            print(f"creditrl inspect: error: {exc}", file=sys.stderr)
            return 2
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("inspect", help="credit inspector: per-token credit of saved groups as HTML and PNGs")
    p.add_argument("run_dir", metavar="RUN_DIR", help="a training run directory (trained with train.inspect_every > 0)")
    p.add_argument(
        "--iteration", type=int, default=None, metavar="N", help="iteration to open at (default: the last saved)"
    )
    p.add_argument(
        "--estimators",
        default=None,
        metavar="A,B,...",
        help="estimators to recompute and compare (default: all registered)",
    )
    p.add_argument("--out", default=None, metavar="DIR", help="output folder (default RUN_DIR/inspect_report)")
    p.add_argument(
        "--max-iterations",
        type=int,
        default=None,
        metavar="K",
        help="saved iterations inlined into the page, evenly spaced (default 30)",
    )
    p.add_argument("--no-png", action="store_true", help="write only the HTML page")
    p.add_argument(
        "--only-spread",
        action="store_true",
        help="open the page showing only groups with reward spread (the PNGs: the first such group)",
    )
    p.add_argument("--screenshot", metavar="PNG", help="also save the page as headless Chromium renders it at 1280x800")
    p.set_defaults(func=cmd_inspect)
