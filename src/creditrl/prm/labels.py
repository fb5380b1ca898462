"""Labelers: functions that give each step of a policy sample a PRM training label.

A label is 1.0 (the step is right / can still lead to the right answer), 0.0 (wrong), a soft
value in [0, 1], or ``None`` (unlabelled: the PRM learns nothing on that step). The labelers
differ in what they need and what they cost:

* ``oracle`` -- the task's own step checker (exact; only synthetic tasks have one).
* ``outcome_heuristic`` -- from the final answer alone (free, noisy).
* ``mc`` -- Monte-Carlo continuations from every step prefix (Math-Shepherd; costs samples).
* ``vote`` -- agreement of several labelers' labels for the same steps.

Their signatures differ, so :data:`LABELERS` records name, one-line doc and function for a
caller (the CLI) to dispatch on, not a common call signature.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from creditrl.credit.registry import lookup
from creditrl.policy.engines import GenerationEngine, SamplingParams
from creditrl.policy.tokenizer import decode_response, encode_problem
from creditrl.rewards.sources import first_error_labels
from creditrl.rollout.continuations import PrefixSet, continue_prefixes
from creditrl.tasks.base import Problem, Task

__all__ = [
    "Labeler",
    "LABELERS",
    "MC_MODES",
    "MCLabels",
    "get_labeler",
    "register_labeler",
    "oracle_labels",
    "outcome_heuristic_labels",
    "mc_labels",
    "vote_labels",
]


@dataclass(frozen=True)
class Labeler:
    """A registered labeler: its name, a one-line description and the function."""

    name: str
    doc: str
    fn: Callable[..., Any]


LABELERS: dict[str, Labeler] = {}
"""Labelers by name; fill with :func:`register_labeler`, look up with :func:`get_labeler`."""


def register_labeler(name: str, doc: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator registering a labeler under ``name``; a second registration of a name fails."""

    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        if name in LABELERS:
            raise ValueError(f"labeler '{name}' is already registered")
        LABELERS[name] = Labeler(name, doc, fn)
        return fn

    return deco


def get_labeler(name: str) -> Labeler:
    """The labeler registered as ``name``; ValueError lists the valid names otherwise."""
    return lookup(LABELERS, "labeler", name)


@register_labeler("oracle", "the task's step checker: 1.0 up to the first wrong step, 0.0 on it, None after")
def oracle_labels(task: Task, problem: Problem, steps: Sequence[str]) -> list[float | None]:
    """Label ``steps`` with ``task.check_steps``: 1.0 up to the first wrong step, 0.0 on it and
    ``None`` after (:func:`creditrl.rewards.sources.first_error_labels`): steps after an error
    continue a wrong solution and are no evidence about step quality (PRM800K)."""
    return first_error_labels(task.check_steps(problem, list(steps)))


@register_labeler(
    "outcome_heuristic", "a correct solution labels every step 1.0; a wrong one labels one random step 0.0"
)
def outcome_heuristic_labels(
    task: Task, problem: Problem, steps: Sequence[str], completion: str, rng: random.Random
) -> list[float | None]:
    """Label steps from the outcome alone: a correct solution (``task.check_outcome(problem,
    completion)``) labels every step 1.0; a wrong one has at least one wrong step, but which is
    unknown, so one step drawn uniformly with ``rng`` is labelled 0.0 and the others ``None``."""
    if not steps:
        return []
    if task.check_outcome(problem, completion):
        return [1.0] * len(steps)
    labels: list[float | None] = [None] * len(steps)
    labels[rng.randrange(len(steps))] = 0.0
    return labels


MC_MODES: dict[str, Callable[[float], float]] = {
    "hard": lambda fraction: 1.0 if fraction > 0 else 0.0,
    "soft": lambda fraction: fraction,
}
"""How the share of correct continuations becomes a label: ``hard`` = any correct (1.0/0.0),
``soft`` = the share itself (Wang et al., 2024, section 3.3)."""


@dataclass
class MCLabels:
    """Result of :func:`mc_labels`; ``labels`` and ``fractions`` are per item, per step."""

    labels: list[list[float]]  # MC_MODES[mode] of ``fractions``
    fractions: list[list[float]]  # share of continuations that reached the right answer
    outcomes: list[list[list[int]]]  # per item, per step: each continuation's 0/1 in sampling order
    n_prefixes: int  # distinct prefixes sampled (each once, however many items share it)
    n_continuations: int  # continuations sampled: n_prefixes * n
    n_tokens: int  # tokens the engine generated for them


@register_labeler(
    "mc", "Monte-Carlo (Math-Shepherd): N continuations per step prefix; hard = any correct, soft = share"
)
def mc_labels(
    engine: GenerationEngine,
    tokenizer: PreTrainedTokenizerBase,
    task: Task,
    items: Sequence[tuple[Problem, Sequence[str]]],
    *,
    n: int,
    params: SamplingParams,
    generator: torch.Generator | None = None,
    mode: str = "hard",
    max_prefixes_per_call: int | None = None,
    max_rows: int | None = None,
    max_positions: int | None = None,
) -> MCLabels:
    """Monte-Carlo step labels (Math-Shepherd: Wang et al., 2024, arXiv:2312.08935).

    ``items`` are ``(problem, steps)`` pairs whose steps concatenate to the solution text, each
    keeping its separator (``["3*2=6;", "7+6=13;", "#13"]``, as
    :func:`creditrl.rewards.sources.split_steps` cuts them). For step k of a solution with
    steps 0..K-1, the prefix is the prompt plus the text through the end of step k::

        ids_k = encode_problem(tokenizer, problem) + tokenizer(steps[0] + ... + steps[k]).input_ids
        f_k   = (1/N) sum_{j=1..N} check_outcome(problem, decode(step tokens + c_j)),
        c_j ~ engine( . | ids_k),  N = n

    (each continuation is decoded with the step tokens before it, as a rollout's response would
    be). The label is ``MC_MODES[mode](f_k)``. Continuations get up to ``params.max_new_tokens``
    new tokens each.

    The last step (K-1) is not sampled: its prefix is the whole solution, so its label is the
    solution's own outcome ``check_outcome(problem, "".join(steps))`` (1.0/0.0 in both modes; 0.0
    for a solution cut at the length limit before its answer).

    Identical prefixes, keyed by (problem, prefix text), are sampled once and share their labels.
    All distinct prefixes go to ``engine.generate`` in one call (or in calls of at most
    ``max_prefixes_per_call`` prefixes); ``max_rows`` bounds the continuations an engine holds at
    once, and ``max_positions`` their padded cache positions (rows x (prefix + new tokens)), without
    changing what is sampled (:func:`creditrl.policy.engines.base.generate_chunked`).

    Raises:
        ValueError: On an unknown ``mode``, ``n < 1``, ``max_prefixes_per_call < 1`` or ``max_rows < 1``.
    """
    if mode not in MC_MODES:
        raise ValueError(f"unknown MC label mode '{mode}'; valid: {', '.join(MC_MODES)}")
    prefixes = PrefixSet()
    plans: list[tuple[list[int], list[float]]] = []  # per item: prefixes of steps 0..K-2, outcome of step K-1
    for problem, steps in items:
        prompt_ids = encode_problem(tokenizer, problem)
        sampled, text = [], ""
        for step in steps[:-1]:
            text += step
            step_ids = tokenizer(text, add_special_tokens=False)["input_ids"]
            sampled.append(prefixes.add((problem, text), prompt_ids, step_ids, problem))
        outcome = [1.0 if task.check_outcome(problem, "".join(steps)) else 0.0] if steps else []
        plans.append((sampled, outcome))
    out = continue_prefixes(
        engine,
        prefixes.prefixes,
        lambda problem, tokens: int(task.check_outcome(problem, decode_response(tokenizer, tokens))),
        n=n,
        params=params,
        generator=generator,
        max_prefixes_per_call=max_prefixes_per_call,
        max_rows=max_rows,
        max_positions=max_positions,
    )
    results = [[int(o) for o in row] for row in out.outcomes]
    to_label = MC_MODES[mode]
    outcomes = [[results[i] for i in sampled] + [[int(o)] * n for o in outcome] for sampled, outcome in plans]
    fractions = [[sum(r) / n for r in row] for row in outcomes]
    return MCLabels(
        labels=[[to_label(f) for f in row] for row in fractions],
        fractions=fractions,
        outcomes=outcomes,
        n_prefixes=len(prefixes),
        n_continuations=len(prefixes) * n,
        n_tokens=out.n_tokens,
    )


@register_labeler("vote", "several labelers' labels for the same steps; keep a label when agreement >= threshold")
def vote_labels(label_lists: Sequence[Sequence[float | None]], *, threshold: float) -> tuple[list[float | None], int]:
    """Combine several labelers' labels of the same steps by agreement.

    Each labeler's label of step k is made hard (``1.0`` if >= 0.5, else ``0.0``; ``None``
    stays out of the vote). Among the labelers that labelled step k, the majority value is
    kept when its share is >= ``threshold``; otherwise (a tie, too little agreement, no label)
    the result is ``None``. E.g. ``[1.0, 0.0, 1.0]`` at threshold 0.6 give 1.0 (2/3 agree);
    ``[1.0, 0.0, None]`` give ``None`` (a tie).

    Returns:
        ``(labels, dropped)``: one label per step, and the number of steps that had at least
        one label but got ``None``.

    Raises:
        ValueError: With no labelers, label lists of different lengths, or a threshold outside
            (0, 1].
    """
    if not label_lists:
        raise ValueError("vote_labels needs at least one labeler's labels")
    if not 0.0 < threshold <= 1.0:
        raise ValueError(f"threshold must be in (0, 1], got {threshold}")
    lengths = {len(labels) for labels in label_lists}
    if len(lengths) != 1:
        raise ValueError(f"every labeler must label the same steps; got label lists of lengths {sorted(lengths)}")
    out: list[float | None] = []
    dropped = 0
    for votes in zip(*label_lists):
        cast = [1.0 if v >= 0.5 else 0.0 for v in votes if v is not None]
        n_right = sum(1 for v in cast if v == 1.0)
        n_wrong = len(cast) - n_right
        label = None
        if cast and n_right != n_wrong:
            winner, count = (1.0, n_right) if n_right > n_wrong else (0.0, n_wrong)
            if count / len(cast) >= threshold:
                label = winner
        dropped += int(bool(cast) and label is None)
        out.append(label)
    return out, dropped
