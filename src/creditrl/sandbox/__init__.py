"""Sandboxed execution of untrusted Python, a unit-test harness and the pass@k metric.

* :func:`run_python` runs a program with resource limits and isolation (:mod:`.process`);
* :func:`run_tests` unit-tests a candidate function, judged in the parent (:mod:`.harness`);
* :func:`pass_at_k` is the unbiased estimator of Chen et al. 2021 (:mod:`.passk`).
"""

from creditrl.sandbox.harness import TestReport, run_tests, same_value
from creditrl.sandbox.passk import mean_pass_at_k, pass_at_k
from creditrl.sandbox.process import Limits, SandboxResult, execute, run_python

__all__ = [
    "Limits",
    "SandboxResult",
    "TestReport",
    "execute",
    "mean_pass_at_k",
    "pass_at_k",
    "run_python",
    "run_tests",
    "same_value",
]
