"""The credit inspector: where the credit lands, token by token, as a web page and figures.

Training saves a few whole groups every ``train.inspect_every`` iterations (:func:`record_iteration`);
``creditrl inspect RUN_DIR`` (:func:`build_report`) recomputes their credit under other estimators
(:func:`compare_iteration`), scores it against the task's oracle step labels
(:mod:`creditrl.inspect.precision`) and writes a self-contained HTML page and PNG figures.
"""

from creditrl.inspect.compare import compare_iteration, parse_estimators, recompute
from creditrl.inspect.data import InspectError, load_iteration, saved_iterations
from creditrl.inspect.precision import NegativeCredit, negative_credit, percent, pooled
from creditrl.inspect.record import MAX_TOKENS_PER_FILE, InspectSettings, record_iteration, should_record
from creditrl.inspect.report import Report, build_report

__all__ = [
    "MAX_TOKENS_PER_FILE",
    "InspectError",
    "InspectSettings",
    "NegativeCredit",
    "Report",
    "build_report",
    "compare_iteration",
    "load_iteration",
    "negative_credit",
    "parse_estimators",
    "percent",
    "pooled",
    "recompute",
    "record_iteration",
    "saved_iterations",
    "should_record",
]
