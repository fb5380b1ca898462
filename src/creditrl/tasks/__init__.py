"""Tasks: prompts, an outcome checker and (optionally) a step checker and separator."""

from creditrl.tasks import arithmetic as _arithmetic  # noqa: F401  (registers "arithmetic")
from creditrl.tasks.base import TASKS, Problem, Task, TaskNameError, make_task, register_task

__all__ = ["TASKS", "Problem", "Task", "TaskNameError", "make_task", "register_task"]
