"""Reward functions with TRL's contract, named by import path or by file.

A reward function has GRPOTrainer's signature and is called the way TRL calls it::

    f(prompts, completions, completion_ids, **columns) -> list[float | None]   # one per completion

* **Once per batch**: one call scores every completion of an iteration that has tokens (with
  ``backend.score_workers``, every completion of a worker's share), and one call the held-out
  completions of an evaluation. ``reward.timeout_s`` bounds each call.
* **Formats**: for a problem with a conversation (TRL's conversational ``prompt`` column, a
  ``messages`` row, or ``task.args.system_prompt``), ``prompts[i]`` is the whole conversation
  as ``{"role", "content"}`` dicts, system turn included, and ``completions[i]`` is
  ``[{"role": "assistant", "content": text}]``; otherwise both are strings.
* **Columns**: every column of the problem's data row (its ``meta``, e.g. the user's own
  ``solution``) as a keyword list parallel to ``completions``, plus ``answer`` and ``solution``
  (the task's, where the row has no column of that name) and ``problem`` (the
  :class:`~creditrl.tasks.base.Problem`). ``completion_ids`` are the sampled token ids
  (``None`` where the caller has no ids, e.g. an evaluation).
* **Scores**: a real number, a bool or ``None`` per completion (numpy scalars too); ``None``
  means "does not apply": nothing from that function lands on the completion, so it is left out
  of that function's term of the weighted sum (``reward.weights``) as TRL's ``nansum`` leaves it
  out, and it is counted in ``reward/none/<name>``. Any other value is an error of that
  completion under ``reward.on_error``; a call that raises or returns a list of another length
  is an error of each completion of the call.
* ``async def`` functions are awaited.
* A function marked ``@reward_function(granularity="step")`` (or another dense granularity) is
  also given ``spans`` (each completion's span texts) and returns one list per completion, one
  score (or ``None``) per span.

A function is named ``module:function`` (importable, or a ``module.py`` in the config's folder or
the working directory: :func:`creditrl.rollout.segment.load_callable`) or
``path/to/file.py:function``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
from collections.abc import Callable, Sequence
from typing import Any

from creditrl.rewards.sources import RewardSource, register_source_prefix, score_list
from creditrl.rollout.segment import load_callable
from creditrl.tasks.base import Problem, Task

# keyword arguments of the call itself: a data column of one of these names is not passed
_CALL_ARGUMENTS = frozenset({"prompts", "completions", "completion_ids", "spans"})


def trl_prompt(problem: Problem) -> str | list[dict[str, str]]:
    """The prompt as TRL passes it: the conversation's turns as dicts, or the prompt text."""
    if problem.messages:  # TRL's conversational format
        return [{"role": role, "content": content} for role, content in problem.messages]
    return problem.prompt


def trl_completion(problem: Problem, completion: str) -> str | list[dict[str, str]]:
    """The completion as TRL passes it: one assistant message for a conversation, else the text."""
    return [{"role": "assistant", "content": completion}] if problem.messages else completion


def trl_columns(problems: Sequence[Problem]) -> dict[str, list[Any]]:
    """The keyword lists of a call: each data column (``meta``; a row without it gives ``None``),
    then ``answer`` and ``solution`` where no column has that name, and ``problem``."""
    names: dict[str, None] = {}
    for p in problems:
        names.update(dict.fromkeys(k for k in p.meta if k not in _CALL_ARGUMENTS))
    columns = {k: [p.meta.get(k) for p in problems] for k in names}
    columns.setdefault("answer", [p.answer for p in problems])
    columns.setdefault("solution", [p.solution for p in problems])
    columns["problem"] = list(problems)
    return columns


def _awaited(value: Any) -> Any:
    """``value``, or its result when it is awaitable (an ``async def`` function's coroutine); run
    in a thread of its own when this thread already runs an event loop (e.g. a notebook)."""
    if not inspect.isawaitable(value):
        return value

    async def wait() -> Any:
        return await value

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(wait())
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, wait()).result()


def call_reward_function(
    fn: Callable[..., Any],
    granularity: str,
    problems: Sequence[Problem],
    completions: Sequence[str],
    spans: Sequence[Sequence[str]],
    completion_ids: Sequence[Sequence[int]] | None = None,
) -> list[Any]:
    """One call of ``fn`` on a batch (module doc): per completion, its raw score (sequence) or
    its list of raw span scores; :func:`creditrl.rewards.sources.score_value` checks each later.

    Raises:
        ValueError: ``fn`` returned something that is not a list of ``len(completions)`` items.
    """
    columns = trl_columns(problems)
    if granularity != "sequence":
        columns["spans"] = [list(s) for s in spans]
    out = fn(
        prompts=[trl_prompt(p) for p in problems],
        completions=[trl_completion(p, c) for p, c in zip(problems, completions)],
        completion_ids=[None] * len(completions) if completion_ids is None else [list(i) for i in completion_ids],
        **columns,
    )
    scores = score_list(_awaited(out), len(completions), "score" if granularity == "sequence" else "span list")
    return [[x] for x in scores] if granularity == "sequence" else scores


def function_source(spec: str) -> RewardSource:
    """A reward source from the reward function named by ``spec`` (``module:function`` or
    ``path/to/file.py:function``), called with TRL's contract (module doc).

    Raises:
        ValueError: The function cannot be found (one line naming where it was looked for).
    """
    return callable_source(load_callable(spec), spec)


def callable_source(fn: Callable[..., Any], name: str) -> RewardSource:
    """A reward source named ``name`` that calls ``fn`` once per batch with TRL's contract (module
    doc); its granularity is the one :func:`~creditrl.rewards.sources.reward_function` marked,
    else ``sequence``."""
    granularity = getattr(fn, "granularity", "sequence")

    def call(
        task: Task,
        problems: Sequence[Problem],
        completions: Sequence[str],
        spans: Sequence[Sequence[str]],
        completion_ids: Sequence[Sequence[int]] | None = None,
    ) -> list[Any]:
        return call_reward_function(fn, granularity, problems, completions, spans, completion_ids)

    def one(task: Task, problem: Problem, completion: str, spans: Sequence[str]) -> list[Any]:
        return call(task, [problem], [completion], [spans])[0]

    return RewardSource(name, frozenset({granularity}), granularity, fn=one, user_fn=call)


register_source_prefix("")(function_source)
