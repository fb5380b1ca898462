"""Reward sources and the scoring stage: the names of :mod:`.source_registry`,
:mod:`.builtin_sources` and :mod:`.scoring`, re-exported.

A reward source scores the spans of one response (the spans of a granularity's segmenter, see
:mod:`creditrl.rewards.placement`)::

    fn(task, problem, completion, spans) -> list[float | None]   # one score per span

A source may also carry a ``batch_fn(task, problems, completions, spans_list)`` that scores a
whole batch at once (a PRM runs one forward pass); the stage uses it first and falls back to
``fn`` per response if it raises. A user's function (``user_fn``, same signature, see
:mod:`creditrl.rewards.functions`) is called once per batch in the bounded worker, without a
fallback: when that call fails, every response of the batch has failed.

A score is a real number, a bool or ``None`` ("no label": nothing is placed on that span). Each
source declares the granularities it can score and a default one. The error policies and the
error counts are described in :mod:`creditrl.rewards.scoring`.
"""

from creditrl.rewards.builtin_sources import first_error_labels, split_steps
from creditrl.rewards.scoring import ERROR_POLICIES, ScoreResult, score_batch, score_list, score_value
from creditrl.rewards.source_registry import (
    REWARD_SOURCES,
    SOURCE_FACTORIES,
    RewardSource,
    SourceFactory,
    check_granularity,
    get_source,
    make_source,
    register_source,
    register_source_factory,
    register_source_prefix,
    reward_function,
    source_names,
)

__all__ = [
    "ERROR_POLICIES",
    "REWARD_SOURCES",
    "SOURCE_FACTORIES",
    "RewardSource",
    "ScoreResult",
    "SourceFactory",
    "check_granularity",
    "first_error_labels",
    "get_source",
    "make_source",
    "register_source",
    "register_source_factory",
    "register_source_prefix",
    "reward_function",
    "score_batch",
    "score_list",
    "score_value",
    "source_names",
    "split_steps",
]
