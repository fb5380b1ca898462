"""Scoring workers of the Ray backend (``backend.score_workers > 0``).

Each worker is a Ray actor that builds the run's task and its reward sources by name
(``reward.source`` and ``hybrid.dense_source`` at start, any other registered source on first use)
and runs :func:`creditrl.rewards.sources.score_batch` on a contiguous chunk of the responses under
the run's ``reward.on_error`` policy. The driver joins the chunks: scores and keep flags in order,
errors added up, the first error message of the earliest chunk; under ``on_error=raise`` a source's
error is raised on the driver with the response's index in the whole batch. A source scores each
response on its own, so this equals driver-side scoring (a ``batch_fn`` runs per chunk, which
changes only the padding of its forward pass). The task's outcome check stays on the driver.

A worker that dies is replaced and its chunk re-scored (:class:`~creditrl.distributed.workers.WorkerPool`).
Scoring workers reserve no Ray CPUs: they mostly wait on the sandbox or run short forward passes,
and must not block the rollout workers' reservation on a small machine.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from typing import Any

import torch

from creditrl.config import Config
from creditrl.distributed.workers import WorkerPool, split_rows
from creditrl.rewards.sources import RewardSource, ScoreResult, make_source, score_batch
from creditrl.tasks.base import Problem, Task
from creditrl.tasks.bounded import BoundedCalls


def source_names(cfg: Config) -> list[str]:
    """The reward sources a run scores with (the workers build exactly these)."""
    return [n for n in (cfg.reward.source, cfg.hybrid.dense_source) if n]


class ScoreWorker:
    """A Ray actor (wrapped by :class:`ScorePool`): the task and the run's reward sources."""

    def __init__(self, cfg: Config, threads: int) -> None:
        from creditrl.tasks import make_task

        torch.set_num_threads(threads)
        self.task = make_task(cfg.task.name, **cfg.task.args)
        self.options = {"prm": cfg.reward.prm}
        self.sources: dict[str, RewardSource] = {}
        self.bounded = BoundedCalls(cfg.reward.timeout_s)  # each call of a source's fn, as in one process
        for name in source_names(cfg):
            self._add(name)
        self.calls = 0
        self.crash_at: int | None = None

    def score(
        self,
        name: str,
        problems: list[Problem],
        completions: list[str],
        spans: list[list[str]],
        granularity: str | None,
        on_error: str,
        first_index: int,
    ) -> ScoreResult:
        self.calls += 1
        if self.crash_at is not None and self.calls >= self.crash_at:
            os._exit(1)  # test hook
        if name not in self.sources:  # another registered source (the run's own are built at start)
            self._add(name)
        bounded = {"run": functools.partial(self.bounded.map, name)} if name in self.bounded.names else {}
        return score_batch(
            self.sources[name],
            self.task,
            problems,
            completions,
            spans,
            granularity=granularity,
            on_error=on_error,
            first_index=first_index,
            **bounded,
        )

    def _add(self, name: str) -> None:
        source = self.sources[name] = make_source(name, self.options)
        worker = source.worker_fn()  # None: a model-backed source runs here (creditrl.tasks.bounded)
        if worker is not None:
            self.bounded.register(name, functools.partial(worker, self.task))

    def crash_on_call(self, k: int) -> None:
        """Test hook: exit the process at the start of the k-th score call from now."""
        self.crash_at = self.calls + k

    def info(self) -> dict[str, int]:
        return {"pid": os.getpid(), "calls": self.calls}


class ScorePool:
    """``backend.score_workers`` scoring actors; :meth:`score` has ``score_batch``'s signature."""

    def __init__(self, ray, cfg: Config) -> None:
        b = cfg.backend
        worker = ray.remote(num_cpus=0, max_restarts=0)(ScoreWorker)
        self.pool = WorkerPool(
            ray, "scoring", lambda slot: worker.remote(cfg, b.worker_threads), b.score_workers, b.max_restarts
        )

    def attach(self, scorer) -> None:
        """Route a :class:`~creditrl.rewards.stage.Scorer`'s sources through the workers."""
        for placed in (scorer.primary, scorer.dense):
            if placed is not None:
                placed.score_fn = self.score

    def score(
        self,
        source: RewardSource,
        task: Task,
        problems: Sequence[Problem],
        completions: Sequence[str],
        spans: Sequence[Sequence[str]],
        *,
        granularity: str | None = None,
        on_error: str = "raise",
    ) -> ScoreResult:
        if not problems:  # nothing to send: score here (the same argument checks)
            return score_batch(source, task, problems, completions, spans, granularity=granularity, on_error=on_error)
        problems, completions, spans = list(problems), list(completions), [list(s) for s in spans]

        def call(a: int, b: int):
            return lambda actor: actor.score.remote(
                source.name, problems[a:b], completions[a:b], spans[a:b], granularity, on_error, a
            )

        chunks = split_rows(len(problems), len(self.pool.actors))
        parts: list[ScoreResult] = self.pool.run([(slot, call(a, b)) for slot, (a, b) in enumerate(chunks)])
        return ScoreResult(
            scores=[s for p in parts for s in p.scores],
            keep=[k for p in parts for k in p.keep],
            errors=sum(p.errors for p in parts),
            first_error=next((p.first_error for p in parts if p.first_error), None),
            timeouts=sum(p.timeouts for p in parts),
        )


def pool_info(pool: WorkerPool) -> list[dict[str, Any]]:
    """Each worker's ``info()`` (tests)."""
    return pool.ray.get([a.info.remote() for a in pool.actors])
