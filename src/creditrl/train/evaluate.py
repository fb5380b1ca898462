"""Held-out evaluation: greedy decoding, exact match of the final answer and step accuracy.

The task's checkers run as in training (:mod:`creditrl.tasks.bounded`): bounded by the run's
``reward.timeout_s`` and under ``reward.on_error`` -- ``raise`` stops with one line, ``zero``
counts a failed check as wrong, ``skip`` leaves that problem out of the averages; the failures
are counted (``eval/errors``, ``eval/timeouts``)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from creditrl.policy.engines import SamplingParams, make_engine
from creditrl.policy.tokenizer import decode_response, encode_problem
from creditrl.tasks.base import Problem, Task
from creditrl.tasks.bounded import BoundedCalls, CallCounts, covered, finite_number, shorten, step_labels

EVAL_SEED = 12345  # the held-out problems are the same for every run of a config


@dataclass
class EvalResult:
    accuracy: float  # share of problems whose final answer is right
    step_accuracy: float  # mean over problems of the share of generated steps judged correct
    mean_length: float  # generated tokens per response
    completions: list[str]
    correct: list[bool]  # per problem: the final answer is right
    errors: int = 0  # checker calls that failed (timeouts included), under reward.on_error
    timeouts: int = 0


@torch.no_grad()
def evaluate(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    task: Task,
    problems: list[Problem],
    *,
    max_new_tokens: int,
    batch_size: int = 256,
    max_positions: int = 131_072,
    engine: str = "auto",
    precision: str = "fp32",
    kernels: str = "auto",
    calls: BoundedCalls | None = None,
    on_error: str = "raise",
) -> EvalResult:
    """Greedy exact match and step accuracy on ``problems`` (``engine``, ``precision``,
    ``kernels``: see ``policy.engine``, ``policy.precision``, ``policy.kernels``), decoded in
    chunks of at most ``batch_size`` problems and ``max_positions`` KV-cache positions (prompt +
    ``max_new_tokens`` per row), so long responses keep the cache bounded."""
    gen_engine = make_engine(
        model,
        eos_id=tokenizer.eos_token_id,
        pad_id=tokenizer.pad_token_id,
        kind=engine,
        precision=precision,
        kernels=kernels,
    )
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0)
    completions: list[str] = []
    lengths: list[int] = []
    prompts = [encode_problem(tokenizer, p) for p in problems]
    longest = max((len(x) for x in prompts), default=0) + max_new_tokens
    rows = max(1, min(batch_size, max_positions // max(1, longest)))
    for start in range(0, len(problems), rows):
        gen = gen_engine.generate(prompts[start : start + rows], 1, params)
        completions += [decode_response(tokenizer, t) for t in gen.tokens]
        lengths += [len(t) for t in gen.tokens]
    correct, step_acc, counted, counts = _checks(task, problems, completions, calls, on_error)
    n = max(1, len(counted))
    return EvalResult(
        accuracy=sum(correct[i] for i in counted) / n,
        step_accuracy=sum(step_acc[i] for i in counted) / n,
        mean_length=sum(lengths) / max(1, len(problems)),
        errors=sum(counts.errors.values()) + sum(counts.timeouts.values()),
        timeouts=sum(counts.timeouts.values()),
        completions=completions,
        correct=correct,
    )


def _checks(
    task: Task, problems: list[Problem], completions: list[str], calls: BoundedCalls | None, on_error: str
) -> tuple[list[bool], list[float], list[int], CallCounts]:
    """The outcome and step checks of every completion, bounded and under ``on_error``: per problem
    its outcome and step accuracy, the problems in the averages (all but those skipped under
    ``on_error=skip``), and the failed calls' counts."""
    if calls is None:  # a caller without a run (an SFT report): in process, unbounded
        calls = BoundedCalls(0)
        calls.register("check_outcome", task.check_outcome)
        if callable(getattr(task, "check_steps", None)):
            calls.register("check_steps", task.check_steps)
    counts = CallCounts()

    def describe(i: int) -> str:
        return f"held-out problem {i} ({shorten(completions[i])!r})"

    pairs = list(zip(problems, completions))
    outcome, ok = covered(
        "check_outcome", calls.map("check_outcome", pairs), on_error, counts, check=finite_number, describe=describe
    )
    correct = [bool(v) if good else False for v, good in zip(outcome, ok)]
    step_acc = [float(c) for c in correct]
    if task.step_separator is not None and "check_steps" in calls.names:
        items = [(p, c.split(task.step_separator)) for p, c in pairs]
        labels, steps_ok = covered(
            "check_steps", calls.map("check_steps", items), on_error, counts, check=step_labels, describe=describe
        )
        step_acc = [sum(lab) / len(lab) if lab else acc for lab, acc in zip((x or [] for x in labels), step_acc)]
        ok = [a and b for a, b in zip(ok, steps_ok)]
    counted = [i for i, good in enumerate(ok) if good or on_error != "skip"]
    return correct, step_acc, counted, counts
