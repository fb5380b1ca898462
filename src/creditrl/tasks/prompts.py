"""Prompts as conversations: TRL's dataset formats and system prompts, for every task.

A :class:`~creditrl.tasks.base.Problem` keeps its ``prompt`` as the task's own text (the question
the checkers read) and, in ``messages``, the conversation the model is shown before its
completion (no messages: one user turn holding the prompt). A tokenizer with a chat template
renders the conversation with it; one without gets the turns' contents joined by a blank line
(:func:`creditrl.policy.tokenizer.encode_prompt`).

Data files hold a prompt in TRL's formats (:func:`read_prompt`):

- a text cell: the prompt as it is;
- a list of ``{"role": ..., "content": ...}`` turns (TRL's conversational ``prompt`` column); a
  ``messages`` list that ends in an assistant turn gives that turn as the reference solution
  (TRL's conversational language-modelling rows, for supervised warm starts).

``task.args.system_prompt`` adds a system turn to every problem of any task
(:class:`SystemPrompted`, applied by :func:`~creditrl.tasks.base.make_task`); a conversation that
brings its own system turn keeps it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, NamedTuple

from creditrl.tasks.datafile import short_repr, type_name

__all__ = ["ROLES", "Turns", "Prompt", "SystemPrompted", "read_prompt", "read_turns", "with_system"]

ROLES = ("system", "user", "assistant")
Turns = tuple[tuple[str, str], ...]
"""A conversation: ``(role, content)`` pairs."""


def read_turns(value: Any) -> Turns:
    """``value`` as a conversation: a non-empty list of ``{"role", "content"}`` objects, roles in
    :data:`ROLES`, contents text.

    Raises:
        ValueError: What is wrong with which turn (counted from 1), in words for an error line.
    """
    if not isinstance(value, (list, tuple)) or not value:
        raise ValueError(f"expected text or a non-empty list of {{role, content}} turns, got {short_repr(value)}")
    turns = []
    for number, turn in enumerate(value, start=1):
        if not isinstance(turn, dict):
            raise ValueError(f"turn {number}: expected an object with 'role' and 'content', got {type_name(turn)}")
        role, content = turn.get("role"), turn.get("content")
        if role not in ROLES:
            raise ValueError(f"turn {number}: role {short_repr(role)} is not one of {', '.join(ROLES)}")
        if not isinstance(content, str):
            raise ValueError(f"turn {number}: content must be text, got {type_name(content)}")
        turns.append((role, content))
    return tuple(turns)


class Prompt(NamedTuple):
    """A prompt read from a data cell."""

    text: str  # the final user turn (a text cell: the cell)
    messages: Turns  # the conversation before the completion; () for a text cell
    solution: str | None  # a final assistant turn's content, else None


def read_prompt(value: Any) -> Prompt:
    """A prompt cell in TRL's formats (module docstring): text, or a list of turns whose last
    prompt turn is a user turn, optionally followed by the assistant's reply (the solution).

    Raises:
        ValueError: The cell is neither (empty text, a bad turn, no final user turn).
    """
    if isinstance(value, str):
        if not value.strip():
            raise ValueError("is empty")
        return Prompt(value, (), None)
    turns = read_turns(value)
    solution = None
    if turns[-1][0] == "assistant":
        turns, solution = turns[:-1], turns[-1][1]
    if not turns or turns[-1][0] != "user":
        raise ValueError("the conversation must end in a user turn (or a user turn and the assistant's reply)")
    if not turns[-1][1].strip():
        raise ValueError(f"turn {len(turns)}: the user turn is empty")
    return Prompt(turns[-1][1], turns, solution)


def with_system(problem: Any, text: str) -> Any:
    """``problem`` with a system turn ``text`` before its conversation, unless it has one."""
    turns = problem.messages or (("user", problem.prompt),)
    if turns[0][0] == "system":
        return problem
    return replace(problem, messages=(("system", text), *turns))


class SystemPrompted:
    """A task whose problems carry a system turn (``task.args.system_prompt``); everything else is
    the wrapped task's (attributes are looked up on it)."""

    def __init__(self, task: Any, system_prompt: str) -> None:
        if not isinstance(system_prompt, str) or not system_prompt.strip():
            raise ValueError(f"system_prompt must be non-empty text, got {short_repr(system_prompt)}")
        self.task, self.system_prompt = task, system_prompt

    def __getattr__(self, name: str) -> Any:
        if name == "task":  # not set yet (e.g. while unpickling)
            raise AttributeError(name)
        return getattr(self.task, name)

    def sample(self, n: int, *, split: str, seed: int) -> list[Any]:
        return [with_system(p, self.system_prompt) for p in self.task.sample(n, split=split, seed=seed)]
