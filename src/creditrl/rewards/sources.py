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

The code lives along the data flow: :mod:`creditrl.rewards.source_registry` (what a source is,
registration and name resolution), :mod:`creditrl.rewards.builtin_sources` (the built-in
sources, registered on import) and :mod:`creditrl.rewards.scoring` (score validation and the
scoring stage). This module imports them all and re-exports their names.
"""

from creditrl.rewards.builtin_sources import (
    first_error_labels,
    oracle_step_reward,
    outcome_reward,
    split_steps,
    step_format_reward,
)
from creditrl.rewards.scoring import (
    ERROR_POLICIES,
    CallRunner,
    ScoreResult,
    score_batch,
    score_list,
    score_value,
)
from creditrl.rewards.source_registry import (
    REWARD_SOURCES,
    SOURCE_FACTORIES,
    SOURCE_PREFIXES,
    BatchFn,
    IdsFn,
    RewardSource,
    SourceFactory,
    SourceFn,
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
    "SOURCE_PREFIXES",
    "BatchFn",
    "CallRunner",
    "IdsFn",
    "RewardSource",
    "ScoreResult",
    "SourceFactory",
    "SourceFn",
    "check_granularity",
    "first_error_labels",
    "get_source",
    "make_source",
    "oracle_step_reward",
    "outcome_reward",
    "register_source",
    "register_source_factory",
    "register_source_prefix",
    "reward_function",
    "score_batch",
    "score_list",
    "score_value",
    "source_names",
    "split_steps",
    "step_format_reward",
]
