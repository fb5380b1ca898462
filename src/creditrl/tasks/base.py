"""The task interface: problems, outcome and step checkers, and a name registry.

A task generates :class:`Problem` instances and judges model completions at two
granularities: the whole completion (:meth:`Task.check_outcome`) and each step
segment (:meth:`Task.check_steps`). Tasks register a factory under a unique name
with :func:`register_task` and are built by name with :func:`make_task`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar, runtime_checkable

__all__ = ["Problem", "Task", "TASKS", "register_task", "make_task"]


@dataclass(frozen=True)
class Problem:
    """One task instance.

    Attributes:
        prompt: Text given to the model, e.g. ``"7+3*2-5="``.
        answer: Canonical final answer, e.g. ``"8"``.
        solution: Reference completion for supervised fine-tuning,
            e.g. ``"3*2=6;7+6=13;13-5=8;#8"``.
        meta: Free-form task-specific data, e.g. ``{"n_ops": 3}``. It takes part
            in equality but not in hashing, so problems can live in sets.
    """

    prompt: str
    answer: str
    solution: str
    meta: dict[str, Any] = field(default_factory=dict, hash=False)


@runtime_checkable
class Task(Protocol):
    """What every task provides.

    Attributes:
        name: Registry name of the task.
        step_separator: String that ends each reasoning step in a completion
            (``";"`` for arithmetic), or ``None`` when the task has no steps.
    """

    name: str
    step_separator: str | None

    def sample(self, n: int, *, split: str, seed: int) -> list[Problem]:
        """Return ``n`` problems of ``split`` (``"train"``/``"heldout"``), deterministic in ``seed``."""
        ...

    def check_outcome(self, problem: Problem, completion: str) -> bool:
        """Return whether ``completion`` ends in the correct final answer to ``problem``."""
        ...

    def check_steps(self, problem: Problem, segments: list[str]) -> list[bool]:
        """Return one correctness label per step segment of a completion of ``problem``."""
        ...


TaskFactory = TypeVar("TaskFactory", bound=Callable[..., Task])

TASKS: dict[str, Callable[..., Task]] = {}
"""Registered task factories by name. Fill it with :func:`register_task`."""

# Modules whose import registers the built-in tasks. make_task imports them on
# demand so that building a task by name never depends on import order.
_BUILTIN_TASK_MODULES: tuple[str, ...] = ("creditrl.tasks.arithmetic",)


def register_task(name: str) -> Callable[[TaskFactory], TaskFactory]:
    """Return a decorator that registers a task factory (usually a class) under ``name``.

    Raises:
        ValueError: At decoration time, if ``name`` is already registered.
    """

    def decorator(factory: TaskFactory) -> TaskFactory:
        if name in TASKS:
            raise ValueError(f"task {name!r} is already registered (by {TASKS[name]!r})")
        TASKS[name] = factory
        return factory

    return decorator


def make_task(name: str, **kwargs: Any) -> Task:
    """Build the task registered under ``name``, passing ``kwargs`` to its factory.

    Raises:
        ValueError: If no task is registered under ``name``; the message names
            it and lists the valid names, sorted.
    """
    for module in _BUILTIN_TASK_MODULES:
        importlib.import_module(module)
    if name not in TASKS:
        valid = ", ".join(sorted(TASKS))
        raise ValueError(f"unknown task {name!r}; valid tasks: {valid}")
    return TASKS[name](**kwargs)
