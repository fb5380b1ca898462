"""Held-out evaluation: greedy decoding, exact match of the final answer and step accuracy."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from creditrl.policy.engines import SamplingParams, make_engine
from creditrl.policy.tokenizer import decode_response, encode_prompt
from creditrl.tasks.base import Problem, Task


@dataclass
class EvalResult:
    accuracy: float  # share of problems whose final answer is right
    step_accuracy: float  # mean over problems of the share of generated steps judged correct
    mean_length: float  # generated tokens per response
    completions: list[str]
    correct: list[bool]  # per problem: the final answer is right


def step_labels(task: Task, problem: Problem, completion: str) -> list[bool]:
    """Step checker labels of a completion split at the task's separator."""
    if task.step_separator is None:
        return []
    return task.check_steps(problem, completion.split(task.step_separator))


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
    prompts = [encode_prompt(tokenizer, p.prompt) for p in problems]
    longest = max((len(x) for x in prompts), default=0) + max_new_tokens
    rows = max(1, min(batch_size, max_positions // max(1, longest)))
    for start in range(0, len(problems), rows):
        gen = gen_engine.generate(prompts[start : start + rows], 1, params)
        completions += [decode_response(tokenizer, t) for t in gen.tokens]
        lengths += [len(t) for t in gen.tokens]
    correct = [task.check_outcome(p, c) for p, c in zip(problems, completions)]
    step_acc = []
    for p, c in zip(problems, completions):
        labels = step_labels(task, p, c)
        step_acc.append(sum(labels) / len(labels) if labels else float(task.check_outcome(p, c)))
    n = max(1, len(problems))
    return EvalResult(
        accuracy=sum(correct) / n,
        step_accuracy=sum(step_acc) / n,
        mean_length=sum(lengths) / n,
        completions=completions,
        correct=correct,
    )
