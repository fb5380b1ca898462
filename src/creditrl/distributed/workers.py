"""Ray workers' common ground: importing and connecting to Ray, and a pool of actors whose dead
members are replaced and their calls re-issued (used by the rollout and the scoring workers)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Sequence
from typing import Any

from creditrl.errors import ConfigError

INSTALL_HINT = "pip install 'creditrl[ray]'"


def import_ray():
    """The ``ray`` module, or a ConfigError that says how to install it."""
    try:
        import ray
    except ImportError as exc:
        raise ConfigError(f"backend.name=ray needs the 'ray' package, which is not installed: {INSTALL_HINT}") from exc
    return ray


def ensure_ray(backend) -> tuple[Any, bool]:
    """Connect to Ray (``backend.address``: "" starts a local instance, "auto" or host:port joins
    a cluster) unless already connected; returns ``(ray, started_here)``. Raises RuntimeError
    when the cluster has fewer CPUs than the rollout workers reserve (Ray would wait forever)."""
    ray = import_ray()
    need = backend.rollout_workers * backend.worker_threads
    started = False
    if not ray.is_initialized():
        if backend.address:
            ray.init(address=backend.address, include_dashboard=False)
        else:  # a local instance: at least the CPUs the workers reserve, even on a smaller machine
            ray.init(num_cpus=max(os.cpu_count() or 1, need), include_dashboard=False)
        started = True
    cpus = ray.cluster_resources().get("CPU", 0)
    if cpus < need:
        raise RuntimeError(
            f"backend: {backend.rollout_workers} rollout workers x {backend.worker_threads} threads reserve "
            f"{need} CPUs; the Ray cluster has {cpus:g}"
        )
    return ray, started


def split_rows(total: int, parts: int) -> list[tuple[int, int]]:
    """Contiguous ``[start, end)`` chunks of ``range(total)`` over at most ``parts`` workers,
    sizes differing by at most one (empty chunks are left out)."""
    base, extra = divmod(total, parts)
    out, start = [], 0
    for i in range(parts):
        end = start + base + (i < extra)
        if end > start:
            out.append((start, end))
        start = end
    return out


class WorkerPool:
    """Actors in numbered slots; :meth:`run` re-issues a call whose actor died on a replacement.

    ``make(slot)`` starts an actor; ``prepare(actor)`` (optional) brings a replacement up to date
    before its calls (actor methods run in submission order)."""

    def __init__(
        self,
        ray,
        name: str,
        make: Callable[[int], Any],
        size: int,
        max_restarts: int,
        prepare: Callable[[Any], None] | None = None,
    ) -> None:
        self.ray, self.name, self.make, self.max_restarts, self.prepare = ray, name, make, max_restarts, prepare
        self.actors = [make(i) for i in range(size)]
        self.slot_restarts = [0] * size
        self.restarts = 0  # since the last :meth:`pop_restarts`

    def run(self, calls: Sequence[tuple[int, Callable[[Any], Any]]]) -> list[Any]:
        """``calls[j] = (slot, submit)``, ``submit(actor) -> ObjectRef``; the results in order."""
        ray = self.ray
        sent = [self.actors[slot] for slot, _ in calls]
        refs = [submit(actor) for (_, submit), actor in zip(calls, sent)]
        results: list[Any] = [None] * len(calls)
        pending = list(range(len(calls)))
        while pending:
            again = []
            for j in pending:
                try:
                    results[j] = ray.get(refs[j])
                except ray.exceptions.RayActorError as exc:
                    slot, submit = calls[j]
                    if self.actors[slot] is sent[j]:  # not yet replaced (by an earlier call's failure)
                        self._replace(slot, exc)
                    sent[j] = self.actors[slot]
                    refs[j] = submit(sent[j])
                    again.append(j)
                except ray.exceptions.RayTaskError as exc:  # the worker raised: raise it here as itself
                    cause = getattr(exc, "cause", None)
                    if isinstance(cause, BaseException):
                        raise cause from None
                    raise
            pending = again
        return results

    def _replace(self, slot: int, exc: BaseException) -> None:
        if self.slot_restarts[slot] >= self.max_restarts:
            raise RuntimeError(
                f"{self.name} worker {slot} died and backend.max_restarts={self.max_restarts} replacements "
                f"are used up: {exc}"
            ) from exc
        with contextlib.suppress(Exception):  # already gone
            self.ray.kill(self.actors[slot], no_restart=True)
        actor = self.make(slot)
        if self.prepare is not None:
            self.prepare(actor)
        self.actors[slot] = actor
        self.slot_restarts[slot] += 1
        self.restarts += 1

    def pop_restarts(self) -> int:
        n, self.restarts = self.restarts, 0
        return n

    def shutdown(self) -> None:
        for actor in self.actors:
            with contextlib.suppress(Exception):
                self.ray.kill(actor, no_restart=True)
        self.actors = []
