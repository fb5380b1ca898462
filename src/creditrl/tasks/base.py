"""The task interface: problems, outcome and step checkers, and a name registry.

A task generates :class:`Problem` instances and judges model completions at two granularities: the
whole completion (:meth:`Task.check_outcome`) and each step segment (:meth:`Task.check_steps`).
Tasks register a factory under a unique name with :func:`register_task` and are built by name
with :func:`make_task`.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import random
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar, runtime_checkable

from creditrl.config.types import Split
from creditrl.errors import ConfigError, did_you_mean
from creditrl.tasks.prompts import SystemPrompted

__all__ = [
    "Problem",
    "Task",
    "TASKS",
    "TaskNameError",
    "register_task",
    "make_task",
    "task_factory",
    "takes_argument",
    "answer_of",
    "same_answer",
    "majority_note",
]


@dataclass(frozen=True)
class Problem:
    """One task instance.

    Attributes:
        prompt: Text given to the model, e.g. ``"7+3*2-5="``.
        answer: Canonical final answer, e.g. ``"8"``.
        solution: Reference completion for supervised fine-tuning, e.g. ``"3*2=6;7+6=13;13-5=8;#8"``.
        meta: Free-form task-specific data, e.g. ``{"n_ops": 3}``. It takes part in equality but
            not in hashing, so problems can live in sets.
        messages: The conversation shown to the model before its completion, as ``(role,
            content)`` turns ending in a user turn; empty means one user turn holding ``prompt``
            (:mod:`creditrl.tasks.prompts`).
    """

    prompt: str
    answer: str
    solution: str
    meta: dict[str, Any] = field(default_factory=dict, hash=False)
    messages: tuple[tuple[str, str], ...] = ()


@runtime_checkable
class Task(Protocol):
    """What every task provides.

    Attributes:
        name: Registry name of the task.
        step_separator: String that ends each reasoning step in a completion (``";"`` for
            arithmetic), or ``None`` when the task has no steps.
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


# Optional task hooks (not in the protocol): ``extract_answer(completion) -> str | None`` (the final
# answer a completion states) and ``same_answer(a, b) -> bool`` (e.g. math-verify equivalence).
# Majority votes and the reports go through :func:`answer_of` and :func:`same_answer`.


def answer_of(task: Task, completion: str) -> str | None:
    """The answer ``completion`` states: ``task.extract_answer(completion)`` when the task has the
    hook, else the whole completion with its whitespace normalised (None when empty), so a task
    without the hook is voted on whole completions."""
    extract = getattr(task, "extract_answer", None)
    return extract(completion) if extract is not None else " ".join(completion.split()) or None


def same_answer(task: Task, a: str, b: str) -> bool:
    """Whether two answers of :func:`answer_of` agree: ``task.same_answer`` when the task has the
    hook, else string equality."""
    same = getattr(task, "same_answer", None)
    return bool(same(a, b)) if same is not None else a == b


def majority_note(task: Task) -> str:
    """The sentence a result or report carries when a majority vote on ``task`` compares whole
    normalised completions (the task has no ``extract_answer``); ``""`` when it compares answers."""
    if getattr(task, "extract_answer", None) is not None:
        return ""
    return (
        f"majority voted on whole normalised completions: task '{task.name}' has no extract_answer, "
        "so only identical completions agree"
    )


SPLITS: tuple[str, ...] = typing.get_args(Split)  # the config's closed set (prm.split, search.split)


def _check_request(n: int, split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; valid splits: {', '.join(SPLITS)}")
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")


def stream_rng(namespace: str, split: str, seed: int) -> random.Random:
    """The random stream of one ``(namespace, split, seed)``: seeded by a SHA-256 of the three,
    so each split has its own stream and the draws are the same in every process."""
    digest = hashlib.sha256(f"{namespace}/{split}/{seed}".encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def hash_split(prompt: str, heldout_mod: int) -> str:
    """``"heldout"`` iff ``int(sha256(prompt), 16) % heldout_mod == 0``, else ``"train"`` (the
    prompt UTF-8 encoded, its ``"="`` included): a prompt's split never depends on the draw."""
    digest = int(hashlib.sha256(prompt.encode()).hexdigest(), 16)
    return "heldout" if digest % heldout_mod == 0 else "train"


Drawn = tuple[str, Callable[[], Problem]]  # a drawn prompt, and how to make its problem


def draw_problems(
    n: int,
    *,
    split: str,
    seed: int,
    namespace: str,
    draw: Callable[[random.Random], Drawn | None],
    split_of: Callable[[str], str],
    max_misses: int,
    space: str = "",
    distinct: bool = False,
) -> list[Problem]:
    """``n`` problems of ``split`` from a generator, deterministic in ``(namespace, split, seed)``
    (duplicates may occur unless ``distinct``). ``draw(rng)`` draws one prompt from the stream,
    with a function that makes its problem, or None (a miss); a prompt not of ``split`` is a
    miss too, and so is a repeat when ``distinct``. Only kept prompts are made into problems. The
    first draws of a ``distinct`` request are those of a plain one up to the first repeat.

    Raises:
        ValueError: For an unknown ``split``, ``n < 0``, or ``max_misses`` consecutive misses (the
            generator's problem space, described by ``space``, has (almost) nothing in ``split``,
            or fewer than ``n`` distinct prompts).
    """
    _check_request(n, split)
    rng = stream_rng(namespace, split, seed)
    problems: list[Problem] = []
    seen: set[str] = set()
    misses = 0
    while len(problems) < n:
        drawn = draw(rng)
        if drawn is None or split_of(drawn[0]) != split or (distinct and drawn[0] in seen):
            misses += 1
            if misses >= max_misses:
                if distinct and seen:
                    raise ValueError(
                        f"only {len(seen)} distinct {split!r} problems found ({n} asked for; "
                        f"{misses} consecutive draws without a new one){space}"
                    )
                raise ValueError(f"no {split!r} problem in {misses} consecutive draws{space}")
            continue
        misses = 0
        seen.add(drawn[0])
        problems.append(drawn[1]())
    return problems


def draw_from_pool(pool: list[Problem], n: int, *, split: str, seed: int, namespace: str, empty: str) -> list[Problem]:
    """``n`` problems of a fixed ``pool`` (the problems of ``split``), drawn with replacement,
    deterministic in ``(namespace, split, seed)``; for tasks that read their problems from files.

    Raises:
        ValueError: For an unknown ``split`` or ``n < 0``.
        ConfigError: (a ValueError) For an empty pool, which the task's data and arguments made
            (``empty`` says why): the command line prints it as one line.
    """
    _check_request(n, split)
    if not pool and n:
        raise ConfigError(empty)
    rng = stream_rng(namespace, split, seed)
    return [rng.choice(pool) for _ in range(n)]


TaskFactory = TypeVar("TaskFactory", bound=Callable[..., Task])

TASKS: dict[str, Callable[..., Task]] = {}
"""Registered task factories by name. Fill it with :func:`register_task`."""

# Modules whose import registers the built-in tasks, imported on demand: no import order matters.
_BUILTIN_TASK_MODULES = ("arithmetic", "chain", "code", "math", "paths", "text")


def register_task(name: str) -> Callable[[TaskFactory], TaskFactory]:
    """A decorator that registers a task factory (usually a class) under ``name``; ValueError at
    decoration time if ``name`` is already registered."""

    def decorator(factory: TaskFactory) -> TaskFactory:
        if name in TASKS:
            raise ValueError(f"task {name!r} is already registered (by {TASKS[name]!r})")
        TASKS[name] = factory
        return factory

    return decorator


class TaskNameError(ValueError):
    """``task.name`` does not resolve to a task: an unknown registry name, an import path whose
    module or attribute is missing, or a factory whose result is not a :class:`Task`."""


_TASK_MEMBERS = ("name", "step_separator", "sample", "check_outcome", "check_steps")


def _missing_members(obj: object) -> list[str]:
    """The Task members ``obj`` lacks (or has but cannot call, for a method), in protocol order."""
    return [
        m
        for m in _TASK_MEMBERS
        if not hasattr(obj, m) or (callable(getattr(Task, m, None)) and not callable(getattr(obj, m)))
    ]


def _import_factory(path: str) -> Callable[..., Any]:
    """The callable named by ``"package.module:attribute"`` (the attribute may be dotted)."""
    module_name, _, attr_path = path.partition(":")
    if not module_name or not attr_path:
        raise TaskNameError(f"task {path!r}: an import path must read 'package.module:factory'")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise TaskNameError(
            f"task {path!r}: cannot import module {module_name!r} ({exc}); is its folder on "
            "PYTHONPATH (e.g. PYTHONPATH=examples)?"
        ) from exc
    for part in attr_path.split("."):
        if not hasattr(obj, part):
            raise TaskNameError(
                f"task {path!r}: module {module_name!r} has no attribute {attr_path!r}; expected a "
                "task class or a function returning a task"
            )
        obj = getattr(obj, part)
    if not callable(obj):
        raise TaskNameError(
            f"task {path!r}: {attr_path!r} is not callable (type {type(obj).__name__}); expected a task "
            "class or a function returning a task"
        )
    return obj


def task_factory(name: str) -> Callable[..., Any]:
    """The factory :func:`make_task` calls for ``name`` (a registered class, or an import path's
    callable); TaskNameError as there."""
    for module in _BUILTIN_TASK_MODULES:
        importlib.import_module(f"creditrl.tasks.{module}")
    if ":" in name:
        return _import_factory(name)
    if name not in TASKS:
        valid = ", ".join(sorted(TASKS))
        raise TaskNameError(f"unknown task {name!r}; valid tasks: {valid}{did_you_mean(name, TASKS)}")
    return TASKS[name]


def takes_argument(name: str, argument: str) -> bool:
    """Whether the factory of task ``name`` has a parameter ``argument``."""
    try:
        return argument in inspect.signature(task_factory(name)).parameters
    except (TypeError, ValueError):  # a callable without a signature
        return False


def make_task(name: str, **kwargs: Any) -> Task:
    """Build a task from a registry name or an import path, passing ``kwargs`` to its factory.

    Without ``":"``, ``name`` is a registry name (the built-in tasks, or any task whose module has
    been imported and called :func:`register_task`). With ``":"`` it is an import path
    ``"package.module:factory"``: the module is imported and its attribute ``factory`` (dotted
    for a nested one, e.g. ``"pkg.mod:Tasks.reverse"``), any callable returning a :class:`Task`,
    is called with ``kwargs``; the module must be importable, e.g. ``PYTHONPATH=examples`` for
    ``"custom_task:CountTask"`` (examples/custom_task.py). A task registered in a module that is
    not imported by default is named by the path of its class. The result of an import path is
    checked against the :class:`Task` protocol. A ``system_prompt`` argument is any task's: its
    problems get that system turn (:class:`~creditrl.tasks.prompts.SystemPrompted`).

    Raises:
        TaskNameError: (a ValueError) If an unregistered name is given (the message lists the
            valid names, sorted), or an import path's module cannot be imported, lacks the
            attribute or it is not callable, or the factory's result lacks a Task member (the
            message names the members missing).
        TypeError, ValueError: From the factory itself (e.g. an unexpected keyword argument).
    """
    own = "system_prompt" not in kwargs or takes_argument(name, "system_prompt")  # a task may render it itself
    system_prompt = None if own else kwargs.pop("system_prompt")
    task = task_factory(name)(**kwargs)
    if ":" in name and (missing := _missing_members(task)):
        raise TaskNameError(
            f"task {name!r}: the factory returned a {type(task).__name__} that does not implement the "
            f"Task protocol: missing {', '.join(missing)} (see creditrl.tasks.base.Task)"
        )
    return task if system_prompt is None else SystemPrompted(task, system_prompt)
