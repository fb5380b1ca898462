"""User functions bounded in time and covered by one error policy.

Every function of the user's that the loop calls -- a task's ``check_outcome`` / ``check_steps``,
a reward source's ``fn``, a ``cut_fn`` or ``key_fn`` -- is called through :class:`BoundedCalls`:

* ``timeout_s > 0`` (``reward.timeout_s``): the calls run in a worker process forked from this
  one on first use (holding the task and every registered function as they are then), a batch
  of argument tuples at a time; each call has ``timeout_s`` from the previous answer. A call over
  it, or one that kills the worker, is an error of that call, and a fresh worker is forked for
  the rest of the batch. Functions must therefore not rely on changing this process's state, and
  one that runs torch ops may hang in a forked child: ``timeout_s = 0`` runs every call here,
  unbounded.
* :func:`covered` applies ``reward.on_error`` to the outcomes: ``raise`` stops with one line
  naming the function, the response and what went wrong (:class:`UserFunctionError`, which the
  command line prints without a traceback); ``zero`` and ``skip`` replace the value (the caller
  says by what) and count it, per function, in :class:`CallCounts` (``reward/errors/<name>``,
  ``reward/timeouts/<name>`` in ``metrics.jsonl``).

Model-backed sources (a PRM's ``batch_fn``) run here, under the error policy but not the timeout:
a forked child must not run torch.
"""

from __future__ import annotations

import ctypes
import math
import multiprocessing
import signal
import weakref
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from creditrl.errors import ConfigError

__all__ = [
    "BoundedCalls",
    "CallCounts",
    "Outcome",
    "UserFunctionError",
    "covered",
    "finite_number",
    "shorten",
    "step_labels",
]


class UserFunctionError(ConfigError):
    """A user function failed (raised, returned a bad value or timed out) under ``on_error=raise``."""


@dataclass(frozen=True)
class Outcome:
    """One call's result: ``value`` when it returned, else ``error`` (``timed_out`` when over time)."""

    value: Any = None
    error: str | None = None
    timed_out: bool = False


@dataclass
class CallCounts:
    """Errors and timeouts per function name, over a run (or one iteration)."""

    errors: Counter = field(default_factory=Counter)
    timeouts: Counter = field(default_factory=Counter)

    @classmethod
    def zeros(cls, names: Sequence[str]) -> CallCounts:
        """Counts of 0 for each of ``names``."""
        return cls(Counter(dict.fromkeys(names, 0)), Counter(dict.fromkeys(names, 0)))

    def add(self, name: str, outcome: Outcome) -> None:
        if outcome.timed_out:
            self.timeouts[name] += 1
        elif outcome.error is not None:
            self.errors[name] += 1


def shorten(text: str, limit: int = 60) -> str:
    """``text`` on one line, cut to ``limit`` characters."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def finite_number(value: Any) -> float:
    """``value`` as a float (bools and numbers); ValueError for anything else or NaN/inf."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"returned {shorten(repr(value), 40)}, expected a number or a bool") from None
    if not math.isfinite(number):
        raise ValueError(f"returned a non-finite value {number}")
    return number


def step_labels(value: Any) -> list[bool]:
    """A step checker's return value as a list of bools; ValueError for anything else."""
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise ValueError(f"returned {shorten(repr(value), 40)}, expected a list of bools (one per step)")
    out = []
    for x in value:
        if not isinstance(x, (bool, int, float)) or (isinstance(x, float) and not math.isfinite(x)):
            raise ValueError(f"returned a step label {shorten(repr(x), 20)}, expected a bool")
        out.append(bool(x))
    return out


def _die_with_parent() -> None:
    """Linux: SIGKILL this process when its parent dies (a killed run leaves no worker behind)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the closed pipe still ends the loop
        pass


def _serve(conn: Any, table: dict[str, Callable[..., Any]], parent_end: Any) -> None:
    """The worker's loop: ``(name, [args, ...])`` in, one ``(ok, value_or_message)`` per call out."""
    parent_end.close()  # so that the parent's end closing (its exit) is an EOF here
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and ends this process
    while True:
        try:
            job = conn.recv()
        except EOFError:
            return
        if job is None:
            return
        name, items = job
        for args in items:
            try:
                reply = (True, table[name](*args))
            except BaseException as exc:  # noqa: BLE001 - a user function's failure is reported, never fatal
                reply = (False, f"{type(exc).__name__}: {exc}")
            try:
                conn.send(reply)
            except Exception as exc:  # noqa: BLE001 - e.g. an unpicklable return value
                conn.send((False, f"returned a value that cannot be sent back ({type(exc).__name__}: {exc})"))


class BoundedCalls:
    """Runs registered functions on batches of argument tuples, each call bounded by ``timeout_s``
    (module doc); ``timeout_s = 0`` runs them in this process."""

    def __init__(self, timeout_s: float) -> None:
        if timeout_s < 0:
            raise ValueError(f"timeout_s must be >= 0, got {timeout_s}")
        self.timeout_s = timeout_s
        self._table: dict[str, Callable[..., Any]] = {}
        self._worker: Any = None
        self._conn: Any = None
        self._forked_with: frozenset[str] = frozenset()
        weakref.finalize(self, BoundedCalls._stop, self.__dict__)

    @property
    def names(self) -> list[str]:
        """The registered functions' names."""
        return list(self._table)

    def register(self, name: str, fn: Callable[..., Any]) -> None:
        """Make ``fn`` callable as ``name`` (a worker forked before is replaced on the next call)."""
        self._table[name] = fn

    def map(self, name: str, items: Sequence[tuple[Any, ...]]) -> list[Outcome]:
        """``fn(*args)`` for each of ``items``, in order."""
        fn = self._table[name]
        if self.timeout_s == 0:
            return [self._here(fn, args) for args in items]
        out: list[Outcome] = []
        while len(out) < len(items):
            out += self._in_worker(name, items[len(out) :])
        return out

    @staticmethod
    def _here(fn: Callable[..., Any], args: tuple[Any, ...]) -> Outcome:
        try:
            return Outcome(value=fn(*args))
        except Exception as exc:  # noqa: BLE001 - a user function's failure goes to the policy
            return Outcome(error=f"{type(exc).__name__}: {exc}")

    def _in_worker(self, name: str, items: Sequence[tuple[Any, ...]]) -> list[Outcome]:
        """As many outcomes as the worker gives before a call times out or kills it (then that
        call's outcome is the last); the caller sends the rest to a fresh worker."""
        if self._worker is None or not self._worker.is_alive() or name not in self._forked_with:
            self._start()
        self._conn.send((name, list(items)))
        out: list[Outcome] = []
        for _ in items:
            if not self._conn.poll(self.timeout_s):
                self.close()
                return out + [Outcome(error=f"timed out after {self.timeout_s:g} s", timed_out=True)]
            try:
                ok, value = self._conn.recv()
            except (EOFError, OSError):
                code = None
                if self._worker is not None:  # the pipe closes a moment before the exit code is set
                    self._worker.join(timeout=5)
                    code = self._worker.exitcode
                self.close()
                return out + [Outcome(error=f"the call ended its worker process (exit code {code})")]
            out.append(Outcome(value=value) if ok else Outcome(error=value))
        return out

    def _start(self) -> None:
        self.close()
        ctx = multiprocessing.get_context("fork")
        parent, child = ctx.Pipe()
        self._worker = ctx.Process(target=_serve, args=(child, dict(self._table), parent), daemon=True)
        self._worker.start()
        child.close()
        self._conn, self._forked_with = parent, frozenset(self._table)

    @staticmethod
    def _stop(state: dict[str, Any]) -> None:
        worker, conn = state.get("_worker"), state.get("_conn")
        if conn is not None:
            conn.close()
        if worker is not None:
            if worker.is_alive():
                worker.kill()
            worker.join()
        state["_worker"] = state["_conn"] = None

    def close(self) -> None:
        """End the worker process (a later call forks a new one)."""
        BoundedCalls._stop(self.__dict__)


def covered(
    name: str,
    outcomes: Sequence[Outcome],
    on_error: str,
    counts: CallCounts,
    *,
    check: Callable[[Any], Any] | None = None,
    describe: Callable[[int], str] = lambda i: f"call {i}",
) -> tuple[list[Any], list[bool]]:
    """The values of ``outcomes`` under ``on_error`` and which calls succeeded.

    ``check`` validates (and may convert) each returned value; a ValueError it raises makes the
    call an error. Under ``raise`` the first error is a :class:`UserFunctionError`, one line:
    ``"<name> failed on <describe(i)>: <what>"``; otherwise failed calls get the value ``None``
    and ``ok`` False (the caller applies ``zero`` or ``skip``), and are counted in ``counts``."""
    values: list[Any] = []
    ok: list[bool] = []
    for i, outcome in enumerate(outcomes):
        if outcome.error is None and check is not None:
            try:
                outcome = Outcome(value=check(outcome.value))
            except ValueError as exc:
                outcome = Outcome(error=str(exc))
        if outcome.error is not None:
            if on_error == "raise":
                hint = " (reward.timeout_s)" if outcome.timed_out else ""
                raise UserFunctionError(f"{name} failed on {describe(i)}: {outcome.error}{hint}")
            counts.add(name, outcome)
        values.append(outcome.value if outcome.error is None else None)
        ok.append(outcome.error is None)
    return values, ok
