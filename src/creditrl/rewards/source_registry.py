"""The reward-source registry: what a source is and how a config's name finds it.

Static sources are registered with ``register_source``, sources that need options (a PRM's path)
by a factory (``register_source_factory`` / ``make_source(name, options)``), and a name with a
prefix (``rm:PATH``, ``module:function``) by its prefix's resolver (``register_source_prefix``).
The contract of a source is in :mod:`creditrl.rewards.sources`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from creditrl.rewards.placement import GRANULARITIES
from creditrl.tasks.base import Problem, Task

SourceFn = Callable[[Task, Problem, str, Sequence[str]], list[float | None]]
BatchFn = Callable[[Task, Sequence[Problem], Sequence[str], Sequence[Sequence[str]]], list[list[float | None]]]
IdsFn = Callable[[Sequence[Sequence[int]], Sequence[Sequence[Sequence[int]]]], list[list[float | None]]]


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
