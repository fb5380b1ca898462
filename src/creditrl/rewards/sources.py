"""Reward sources and the scoring stage.

A reward source scores the spans of one response (the spans of a granularity's segmenter, see
:mod:`creditrl.rewards.placement`)::

    fn(task, problem, completion, spans) -> list[float | None]   # one score per span

A source may also carry a ``batch_fn(task, problems, completions, spans_list)`` that scores a
whole batch at once (a model-backed source such as a PRM runs one forward pass); the stage uses
it first and falls back to ``fn`` per response if it raises. A user's function (``user_fn``, same
signature, see :mod:`creditrl.rewards.functions`) is also called once per batch, but in the
bounded worker and without a fallback: when that call fails, every response of the batch has
failed. Sources that need options (a PRM's path) are built by a factory:
``register_source_factory`` / ``make_source(name, options)``; a name with a prefix
(``rm:PATH``, ``module:function``) by the resolver registered for it (``register_source_prefix``).

A score is a real number, a bool or ``None`` (numpy scalars included, :func:`score_value`);
``None`` is "no label" ("does not apply" in TRL's words): nothing is placed on that span, and at
``sequence`` granularity nothing from that source lands on the response. Each source declares
the granularities it can score and a default one; at ``sequence`` granularity there is one span.

The scoring stage runs a source over a batch under an explicit error policy: a source that
raises, returns NaN/inf, a score of another type, the wrong number of scores, or runs over
``reward.timeout_s`` is never silently used (``raise`` stops with one line naming it, ``zero``
scores it 0.0, ``skip`` drops the response from the loss); each such response is counted in
``reward/errors`` and per source in ``reward/errors/<source>`` / ``reward/timeouts/<source>``.
"""

from __future__ import annotations

import math
import numbers
import typing
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from creditrl.config.types import OnError
from creditrl.rewards.placement import GRANULARITIES
from creditrl.tasks.base import Problem, Task
from creditrl.tasks.bounded import Outcome, UserFunctionError, finite_number, shorten

SourceFn = Callable[[Task, Problem, str, Sequence[str]], list[float | None]]
BatchFn = Callable[[Task, Sequence[Problem], Sequence[str], Sequence[Sequence[str]]], list[list[float | None]]]
IdsFn = Callable[[Sequence[Sequence[int]], Sequence[Sequence[Sequence[int]]]], list[list[float | None]]]
ERROR_POLICIES = typing.get_args(OnError)


@dataclass(frozen=True)
class RewardSource:
    name: str
    granularities: frozenset[str]  # the granularities whose spans it can score
    default_granularity: str
    fn: SourceFn
    batch_fn: BatchFn | None = None
    # a source that learns during the run (the implicit PRM): ``observe(prompt_ids, response_ids,
    # outcome) -> stats`` before each scoring, ``state_dict`` / ``load_state_dict`` for checkpoints
    learner: Any = None
    # a model-backed source on the policy's own tokenizer scores the sampled token ids themselves:
    # ``ids_fn(prompt_ids, span_ids) -> scores`` (per response: its prompt's ids, each span's ids);
    # the stage uses it in place of ``batch_fn`` and falls back as for ``batch_fn`` if it raises
    ids_fn: IdsFn | None = None
    # a user's function scoring a whole batch: called once per batch in the bounded worker
    # (creditrl.tasks.bounded), never retried per response; ``fn`` is its one-response form
    user_fn: BatchFn | None = None

    def worker_fn(self) -> Callable[..., Any] | None:
        """What a bounded worker runs for this source, the task as its first argument: ``user_fn``
        (one call per batch), else ``fn`` (one per response); None for a model-backed source
        (``batch_fn``), which runs in the caller (a forked worker must not run torch)."""
        if self.user_fn is not None:
            return self.user_fn
        return self.fn if self.batch_fn is None else None

    def __post_init__(self) -> None:
        if self.default_granularity not in self.granularities:
            raise ValueError(
                f"reward source '{self.name}': default granularity '{self.default_granularity}' "
                f"is not among its granularities ({', '.join(sorted(self.granularities))})"
            )


REWARD_SOURCES: dict[str, RewardSource] = {}


def register_source(
    name: str, granularities: Iterable[str] = ("sequence",), default: str | None = None
) -> Callable[[SourceFn], SourceFn]:
    """Decorator registering ``fn`` as source ``name``; ``default`` may be omitted for one granularity."""
    grans = frozenset(granularities)
    if default is None:
        if len(grans) != 1:
            raise ValueError(f"reward source '{name}' scores several granularities; name its default")
        (default,) = grans

    def deco(fn: SourceFn) -> SourceFn:
        if name in REWARD_SOURCES:
            raise ValueError(f"reward source '{name}' is already registered")
        REWARD_SOURCES[name] = RewardSource(name, grans, default, fn)
        return fn

    return deco


@dataclass(frozen=True)
class SourceFactory:
    """A source built from options at run time (e.g. a trained model's path)."""

    name: str
    granularities: frozenset[str]
    default_granularity: str
    build: Callable[[dict[str, Any]], RewardSource]
    requires: tuple[str, ...] = ()  # ``reward.*`` config keys the build reads (must be set)


SOURCE_FACTORIES: dict[str, SourceFactory] = {}


def register_source_factory(
    name: str, granularities: Iterable[str], default: str, requires: Iterable[str] = ()
) -> Callable[[Callable[[dict[str, Any]], RewardSource]], Callable[[dict[str, Any]], RewardSource]]:
    """Decorator registering ``build(options) -> RewardSource`` under ``name``."""

    def deco(build: Callable[[dict[str, Any]], RewardSource]) -> Callable[[dict[str, Any]], RewardSource]:
        if name in REWARD_SOURCES or name in SOURCE_FACTORIES:
            raise ValueError(f"reward source '{name}' is already registered")
        SOURCE_FACTORIES[name] = SourceFactory(name, frozenset(granularities), default, build, tuple(requires))
        return build

    return deco


def source_names() -> list[str]:
    """Every source a config may name: the static ones and the factories."""
    return sorted({*REWARD_SOURCES, *SOURCE_FACTORIES})


# ``prefix -> resolve(name)`` for names ``prefix:REST``; "" resolves every other name with a ``:``
SOURCE_PREFIXES: dict[str, Callable[[str], RewardSource | SourceFactory]] = {}


def register_source_prefix(
    prefix: str,
) -> Callable[[Callable[[str], RewardSource | SourceFactory]], Callable[[str], RewardSource | SourceFactory]]:
    """Decorator registering ``resolve(name)`` for the source names ``prefix:...`` (``""``: any
    other name with a ``:``, the ``module:function`` names); duplicates rejected."""

    def deco(resolve: Callable[[str], RewardSource | SourceFactory]) -> Callable[[str], RewardSource | SourceFactory]:
        if prefix in SOURCE_PREFIXES:
            raise ValueError(f"reward source prefix '{prefix}:' is already registered")
        SOURCE_PREFIXES[prefix] = resolve
        return resolve

    return deco


def get_source(name: str) -> RewardSource | SourceFactory:
    """The static source ``name``, the factory of a source built from options, or, for a name
    with a prefix (``rm:PATH``, ``module:function``), what the prefix's resolver gives."""
    if name in REWARD_SOURCES:
        return REWARD_SOURCES[name]
    if name in SOURCE_FACTORIES:
        return SOURCE_FACTORIES[name]
    if ":" in name:
        prefix = name.partition(":")[0]
        resolve = SOURCE_PREFIXES.get(prefix) or SOURCE_PREFIXES.get("")
        if resolve is not None:
            return resolve(name)
    raise ValueError(
        f"unknown reward source '{name}'; valid: {', '.join(source_names())}, rm:PATH (a reward model) "
        "or module:function / path/to/file.py:function (a reward function)"
    )


def reward_function(granularity: str = "sequence") -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Declare the granularity of a TRL-style reward function (:mod:`creditrl.rewards.functions`): with
    ``step``, ``segment``, ``token`` or ``key_token`` it is also given ``spans`` (each completion's
    span texts) and returns one list of scores per completion, one score (or None) per span."""
    if granularity not in GRANULARITIES:
        raise ValueError(f"unknown granularity '{granularity}'; valid: {', '.join(GRANULARITIES)}")

    def mark(fn: Callable[..., Any]) -> Callable[..., Any]:
        fn.granularity = granularity  # type: ignore[attr-defined]
        return fn

    return mark


def make_source(name: str, options: dict[str, Any] | None = None) -> RewardSource:
    """A ready source: the static one, or the factory's build with ``options``."""
    found = get_source(name)
    return found.build(dict(options or {})) if isinstance(found, SourceFactory) else found


def check_granularity(source: RewardSource | SourceFactory, granularity: str) -> None:
    """Raise ValueError unless ``granularity`` exists and ``source`` can score it."""
    if granularity not in GRANULARITIES:
        raise ValueError(f"unknown granularity '{granularity}'; valid: {', '.join(sorted(GRANULARITIES))}")
    if granularity not in source.granularities:
        valid = ", ".join(sorted(source.granularities))
        what = "whole sequences only" if source.granularities == {"sequence"} else "spans"
        raise ValueError(
            f"reward source '{source.name}' scores {what} (granularities: {valid}); "
            f"it cannot be used at granularity '{granularity}'"
        )


# ----------------------------------------------------------------------------- built-in sources


@register_source("outcome", granularities=("sequence",))
def outcome_reward(task: Task, problem: Problem, completion: str, spans: Sequence[str]) -> list[float]:
    """1.0 when the task's outcome checker accepts the completion, else 0.0."""
    return [1.0 if finite_number(task.check_outcome(problem, completion)) else 0.0]  # NaN is an error, not True


def first_error_labels(labels: Iterable[bool]) -> list[float | None]:
    """1.0 per correct step up to the first wrong one, 0.0 on it, ``None`` (unlabelled) after.

    This is the PRM800K / Math-Shepherd convention: once a solution has gone wrong, later steps
    are not evidence about the policy's step quality, and labelling the whole cascade wrong
    would pile negative credit onto the correct steps before the error.
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

    The text of the spans (they concatenate to the completion) is cut into steps after each
    ``task.step_separator``; the step checker labels the steps, 1.0 up to the first wrong step,
    0.0 on it and ``None`` after (:func:`first_error_labels`). Each span then takes the label of
    the step holding its last non-whitespace character (an empty span: the step of the
    character after it; an empty last step "" is only labelled when such a span lies at the
    very end, e.g. an eos right after a separator, which the arithmetic checker calls wrong).
    At step granularity the spans ARE the steps, so span k gets step k's label; at token
    granularity every token gets its step's label; at key_token granularity the key token of a
    step (the first character of its result) gets that step's label.
    """
    sep = task.step_separator
    if not sep:
        raise ValueError(f"task '{task.name}' has no step separator; oracle_steps needs steps")
    text = "".join(spans)
    starts = [0]
    for span in spans[:-1]:
        starts.append(starts[-1] + len(span))
    anchors = [_span_anchor(s, span) for s, span in zip(starts, spans)]
    steps = split_steps(text, sep)
    if steps[-1] == "" and not any(a == len(text) for a in anchors):
        steps.pop()  # a trailing separator with nothing after it: no final step to label
    labels = first_error_labels(task.check_steps(problem, steps))
    step_ends: list[int] = []  # exclusive end offset of each step
    for step in steps:
        step_ends.append((step_ends[-1] if step_ends else 0) + len(step))
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


# ----------------------------------------------------------------------------- scoring stage


def score_value(value: Any) -> float | None:
    """One score as a float (``None`` stays ``None``): a real number or a bool, numpy scalars
    included. Anything else, text such as ``"1"`` included, is an error naming its type.

    Raises:
        ValueError: ``value`` is of another type (the message names it) or is NaN/inf.
    """
    if value is None:
        return None
    if isinstance(value, (bool, np.bool_, numbers.Real)) and not isinstance(value, np.ndarray):
        number = float(value)
        if not math.isfinite(number):
            raise ValueError(f"returned a non-finite score {number}")
        return number
    raise ValueError(
        f"returned a score of type {type(value).__name__} ({shorten(repr(value), 30)}); "
        "a score is a real number, a bool or None"
    )


def score_list(value: Any, expected: int, what: str) -> list[Any]:
    """``value`` as a list of ``expected`` items (a list, a tuple, or a 1-d numpy array or torch
    tensor, as TRL takes them); ``what`` names one item for the message (``"score"``, ``"span list"``).

    Raises:
        ValueError: ``value`` is of another type (the message names it) or of another length.
    """
    if getattr(value, "ndim", None) == 1 and callable(getattr(value, "tolist", None)):
        value = value.tolist()
    plural = what if expected == 1 else f"{what}s"
    if not isinstance(value, (list, tuple)):
        raise ValueError(
            f"returned a {type(value).__name__} ({shorten(repr(value), 30)}), expected a list of {expected} {plural}"
        )
    if len(value) != expected:
        raise ValueError(f"returned {len(value)} {what}s, expected {expected}")
    return list(value)


@dataclass
class ScoreResult:
    scores: list[list[float | None]]  # per response, ready for placement
    keep: list[bool]  # False for responses dropped by the ``skip`` policy
    errors: int  # failed responses, timeouts included
    first_error: str | None
    timeouts: int = 0  # of ``errors``, the calls over ``reward.timeout_s``
    nones: int = 0  # ``None`` scores ("does not apply": nothing placed) of responses that did not fail


# runs ``fn(problem, completion, spans)`` of a source on each argument tuple (a bounded worker), or
# a user source's ``user_fn(problems, completions, spans_list[, completion_ids])`` on one tuple
CallRunner = Callable[[Sequence[tuple[Any, ...]]], list[Outcome]]


def _check_arguments(
    source: RewardSource,
    granularity: str,
    on_error: str,
    problems: Sequence[Problem],
    completions: Sequence[str],
    spans: Sequence[Sequence[str]],
) -> None:
    """The errors of a call of :func:`score_batch` itself (whatever the policy)."""
    check_granularity(source, granularity)
    if on_error not in ERROR_POLICIES:
        raise ValueError(f"unknown reward error policy '{on_error}'; valid: {', '.join(ERROR_POLICIES)}")
    if not len(problems) == len(completions) == len(spans):
        raise ValueError(f"got {len(problems)} problems, {len(completions)} completions and {len(spans)} span lists")
    if granularity == "sequence":
        for i, row_spans in enumerate(spans):
            if len(row_spans) > 1:
                raise ValueError(
                    f"sequence granularity has one span per response (the last_token segmenter); "
                    f"response {i} has {len(row_spans)}"
                )


def _batch_scores(
    source: RewardSource,
    task: Task,
    problems: Sequence[Problem],
    completions: Sequence[str],
    spans: Sequence[Sequence[str]],
) -> list[list[float | None]] | None:
    """The source's ``batch_fn`` scores, or None (no batch_fn, or it failed: ``fn`` per response then)."""
    if source.batch_fn is None:
        return None
    try:
        batched = source.batch_fn(task, problems, completions, spans)
    except Exception:  # noqa: BLE001 - fall back to fn per response, under the error policy
        return None
    return batched if len(batched) == len(problems) else None


def _user_call(
    source: RewardSource,
    task: Task,
    rows: list[int],
    args: tuple[Any, ...],
    run: CallRunner | None,
) -> dict[int, Outcome]:
    """One call of a user source's ``user_fn`` on the ``rows`` that have spans (``args``: their
    problems, completions, spans and completion ids): each row's outcome, the call's error for
    every row when the call failed or returned a list of another length."""
    if not rows:
        return {}
    if run is not None:
        (outcome,) = run([args])
    else:
        try:
            outcome = Outcome(value=source.user_fn(task, *args))  # type: ignore[misc]
        except Exception as exc:  # noqa: BLE001 - under the error policy, like a bounded call's
            outcome = Outcome(error=f"{type(exc).__name__}: {exc}")
    if outcome.error is None:
        try:
            values = score_list(outcome.value, len(rows), "score")
        except ValueError as exc:
            outcome = Outcome(error=str(exc))
        else:
            return {i: Outcome(value=v) for i, v in zip(rows, values)}
    return dict.fromkeys(rows, outcome)


def score_batch(
    source: RewardSource,
    task: Task,
    problems: Sequence[Problem],
    completions: Sequence[str],
    spans: Sequence[Sequence[str]],
    *,
    granularity: str | None = None,
    on_error: str = "raise",
    first_index: int = 0,
    run: CallRunner | None = None,
    completion_ids: Sequence[Sequence[int]] | None = None,
) -> ScoreResult:
    """Score every response's spans with ``source`` under the ``on_error`` policy (module doc).

    ``granularity`` (default: the source's default) must be one the source supports
    (ValueError otherwise, whatever the policy). Every response needs ``len(spans[i])`` scores,
    each checked by :func:`score_value`. A response without spans (empty) has nothing to place:
    its score list is empty and the source is not called for it. ``first_index``: the index of
    ``problems[0]`` in a larger batch split among workers (error messages name the response by
    its index in that batch). ``run``: where the user's calls run (a
    :class:`~creditrl.tasks.bounded.BoundedCalls` worker bounded by ``reward.timeout_s``: a call
    over it is an error of its responses); default here, unbounded. A user source
    (``user_fn``) is called once for all responses with spans, with their ``completion_ids``
    when given; its failure is an error of each of them.
    """
    granularity = granularity or source.default_granularity
    _check_arguments(source, granularity, on_error, problems, completions, spans)
    rows = [i for i, row_spans in enumerate(spans) if len(row_spans)]
    called: dict[int, Outcome] = {}
    batched = None
    if source.user_fn is not None:
        ids = None if completion_ids is None else [list(completion_ids[i]) for i in rows]
        picked = ([problems[i] for i in rows], [completions[i] for i in rows], [list(spans[i]) for i in rows], ids)
        called = _user_call(source, task, rows, picked, run)
    else:
        batched = _batch_scores(source, task, problems, completions, spans)
        if batched is None and run is not None:
            called = dict(zip(rows, run([(problems[i], completions[i], spans[i]) for i in rows])))
    scores: list[list[float | None]] = []
    keep: list[bool] = []
    errors, timeouts, nones, first = 0, 0, 0, None
    for i, (prob, comp, row_spans) in enumerate(zip(problems, completions, spans)):
        expected = len(row_spans)
        if expected == 0:
            scores.append([])
            keep.append(True)
            continue
        timed_out = i in called and called[i].timed_out
        try:
            if i in called and called[i].error is not None:
                raise ValueError(called[i].error + (" (reward.timeout_s)" if timed_out else ""))
            raw = (
                batched[i]
                if batched is not None
                else called[i].value
                if i in called
                else source.fn(task, prob, comp, row_spans)
            )
            out = [score_value(x) for x in score_list(raw, expected, "score")]
        except Exception as exc:  # noqa: BLE001 - any failure of user code is subject to the policy
            msg = (
                f"reward source '{source.name}' failed on response {first_index + i} "
                f"({shorten(comp)!r}, prompt {shorten(prob.prompt)!r}): {exc}"
            )
            if on_error == "raise":
                raise UserFunctionError(msg) from exc
            errors += 1
            timeouts += int(timed_out)
            first = first or msg
            out = [0.0] * expected
            keep.append(on_error != "skip")
        else:
            nones += out.count(None)
            keep.append(True)
        scores.append(out)
    return ScoreResult(scores=scores, keep=keep, errors=errors, first_error=first, timeouts=timeouts, nones=nones)
