"""The CPU time runs and PRM builds are charged in: user + system seconds, which a machine's load
does not inflate as it does wall time."""

from __future__ import annotations

import resource

_ELSEWHERE = [0.0]  # CPU seconds this process spent on work whose record is elsewhere (charge_elsewhere)


def process_cpu_s() -> float:
    """User + system seconds of this process and of the children it has waited for (math-verify,
    sandboxes) so far."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def charge_elsewhere(seconds: float) -> None:
    """Set aside ``seconds`` of this process's CPU time that another record carries, so that no run
    is charged them as its own: a PRM's build, which each run reading the PRM is charged whole as the
    PRM's ``prm/cpu_s``, whichever process built it."""
    _ELSEWHERE[0] += seconds


def charged_elsewhere_s() -> float:
    """The CPU seconds this process has set aside with :func:`charge_elsewhere` so far."""
    return _ELSEWHERE[0]


def run_cpu_s() -> float:
    """The clock a run's own CPU seconds are read on: :func:`process_cpu_s` less what this process
    set aside (:func:`charge_elsewhere`); only its differences mean something."""
    return process_cpu_s() - charged_elsewhere_s()
