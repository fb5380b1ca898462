"""What the subcommands share: the config arguments, thread and run-directory options, the report arguments."""

from __future__ import annotations

import argparse
import time
from pathlib import Path


def quiet_libraries() -> None:
    """transformers at error verbosity and without progress bars; before transformers is imported,
    through the environment variables it reads at import, so that a command failing early does not
    pay for importing torch."""
    import os
    import sys
    import warnings

    warnings.filterwarnings("ignore", category=FutureWarning)
    if "transformers" not in sys.modules:
        os.environ["TRANSFORMERS_VERBOSITY"] = "error"
        os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
        return
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


def run_dir(given: str | None, kind: str) -> Path:
    """``--run-dir``, or ``runs/KIND-TIMESTAMP``."""
    return Path(given) if given else Path("runs") / f"{kind}-{time.strftime('%Y%m%d-%H%M%S')}"


def add_config_args(p: argparse.ArgumentParser, positional: bool = True) -> None:
    """``[CONFIG] --set KEY=VALUE ...``: the config every run-building command takes."""
    if positional:
        p.add_argument("config", nargs="?", help="YAML config file (defaults apply to missing keys)")
    p.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="override, e.g. credit.estimator=rloo"
    )


def add_threads_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")


def set_threads(n: int) -> None:
    if n:
        import torch

        torch.set_num_threads(n)


def add_report_args(
    p: argparse.ArgumentParser,
    *,
    out: str | None,
    quick: str = "tiny sizes (numbers meaningless)",
    seeds: str | None = None,
    results: str | None = None,
) -> None:
    """``--quick``, and for each help given ``--out``, ``--seeds N`` and ``--results PAGE``: the
    arguments every measuring command shares (``compare``, ``findings``, ``studies/``)."""
    p.add_argument("--quick", action="store_true", help=quick)
    if out is not None:
        p.add_argument("--out", help=out)
    if seeds is not None:
        p.add_argument("--seeds", type=int, default=None, help=seeds)
    if results is not None:
        p.add_argument("--results", metavar="PAGE", help=results)
