"""The CPU time runs and PRM builds are charged in: user + system seconds, which a machine's load
does not inflate as it does wall time."""

from __future__ import annotations

import resource


def process_cpu_s() -> float:
    """User + system seconds of this process and of the children it has waited for (math-verify,
    sandboxes) so far."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime
