"""The built-in reward sources: ``outcome``, ``oracle_steps`` and ``step_format``, registered on
import (:mod:`creditrl.rewards.sources` imports this module), and the step helpers they share
with the PRM pipeline (:func:`first_error_labels`, :func:`split_steps`)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import accumulate

from creditrl.rewards.source_registry import register_source
from creditrl.tasks.base import Problem, Task
from creditrl.tasks.bounded import finite_number


@register_source("outcome", granularities=("sequence",))
def outcome_reward(task: Task, problem: Problem, completion: str, spans: Sequence[str]) -> list[float]:
    """1.0 when the task's outcome checker accepts the completion, else 0.0."""
    return [1.0 if finite_number(task.check_outcome(problem, completion)) else 0.0]  # NaN is an error, not True


def first_error_labels(labels: Iterable[bool]) -> list[float | None]:
    """1.0 per correct step up to the first wrong one, 0.0 on it, ``None`` (unlabelled) after.

    The PRM800K / Math-Shepherd convention: steps after an error are no evidence about the
    policy's step quality, and labelling them all wrong would pile negative credit onto the
    correct steps before the error.
    """
    out: list[float | None] = []
    failed = False
    for ok in labels:
        out.append(None if failed else 1.0 if ok else 0.0)
        failed = failed or not ok
    return out


def split_steps(text: str, separator: str) -> list[str]:
    """Cut ``text`` after every ``separator``: each step keeps its separator and the text after
    the last separator is the final step, possibly empty (``"a;b;"`` -> ``["a;", "b;", ""]``).
    The steps concatenate to ``text``."""
    pieces = text.split(separator)
    return [p + separator for p in pieces[:-1]] + [pieces[-1]]


def _span_anchor(start: int, span: str) -> int:
    """The character of a span that decides its step: its last non-whitespace character (a
    token such as ``";\\n"`` belongs to the step its ``;`` ends), else its last character, and
    for an empty span (a special token) the character after it."""
    stripped = span.rstrip()
    return start + len(stripped if stripped else span) - 1 if span else start


@register_source("oracle_steps", granularities=("step", "segment", "token", "key_token"), default="step")
def oracle_step_reward(task: Task, problem: Problem, completion: str, spans: Sequence[str]) -> list[float | None]:
    """The task's step checker, first-error convention, mapped onto any spans.

    The spans' text is cut into steps after each ``task.step_separator`` and the steps labelled
    by :func:`first_error_labels` of the step checker. Each span takes the label of the step
    holding its last non-whitespace character (an empty span: the step of the character after
    it, so an empty last step "" is labelled only when such a span lies at the very end, e.g. an
    eos right after a separator, which the arithmetic checker calls wrong). At step granularity
    span k gets step k's label.
    """
    sep = task.step_separator
    if not sep:
        raise ValueError(f"task '{task.name}' has no step separator; oracle_steps needs steps")
    text = "".join(spans)
    starts = [0, *accumulate(len(span) for span in spans[:-1])]
    anchors = [_span_anchor(s, span) for s, span in zip(starts, spans)]
    steps = split_steps(text, sep)
    if steps[-1] == "" and not any(a == len(text) for a in anchors):
        steps.pop()  # a trailing separator with nothing after it: no final step to label
    labels = first_error_labels(task.check_steps(problem, steps))
    step_ends = list(accumulate(len(step) for step in steps))  # exclusive end offset of each step
    out: list[float | None] = []
    k = 0
    for a in anchors:  # anchors ascend, so the step index only moves forward
        while k < len(steps) - 1 and a >= step_ends[k]:
            k += 1
        out.append(labels[k])
    return out


@register_source("step_format", granularities=("step",))
def step_format_reward(task: Task, problem: Problem, completion: str, spans: Sequence[str]) -> list[float | None]:
    """A deliberately naive dense reward: 1.0 for every step that is *well formed*, right or wrong.

    A step is well formed when its text, stripped of whitespace and one trailing
    ``task.step_separator``, fully matches ``task.step_pattern`` (arithmetic: ``a{op}b=c`` with
    integers, whether or not ``c`` is right or the step is the next one). The answer span (it
    starts with ``task.answer_marker``, arithmetic ``#``) and empty spans get no reward (None).
    It exists to measure reward hacking (FINDINGS F4): the policy can raise it by writing more
    steps, without solving anything.
    """
    pattern = getattr(task, "step_pattern", None)
    if pattern is None or not task.step_separator:
        raise ValueError(f"task '{task.name}' has no step_pattern and step separator; step_format needs both")
    marker = getattr(task, "answer_marker", None)
    out: list[float | None] = []
    for span in spans:
        text = span.strip().removesuffix(task.step_separator).strip()
        if not text or (marker and text.startswith(marker)):
            out.append(None)
        else:
            out.append(1.0 if pattern.fullmatch(text) else 0.0)
    return out
