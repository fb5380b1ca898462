"""The PRM life cycle as functions: sample policy solutions, label their steps, train, evaluate.

    policy ─► sample_solutions ─► label_samples (oracle | outcome_heuristic | mc | vote)
           ─► StepwiseExample JSONL ─► train_prm ─► ProcessRewardModel ─► step_auroc / probe

Steps are the policy's text cut after every separator (each step keeps its ``;``; empty pieces
are dropped), so they concatenate to the completion the policy wrote. Every example carries
``meta = {"outcome": 0/1, "oracle": [...]}`` -- the task's own verdicts -- so that labels from any
labeler can be scored against the truth later.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from creditrl.policy.engines import SamplingParams, make_engine
from creditrl.policy.tokenizer import decode_response, encode_problem, encode_prompt
from creditrl.prm.data import StepwiseExample
from creditrl.prm.labels import mc_labels, oracle_labels, outcome_heuristic_labels, vote_labels
from creditrl.prm.metrics import auroc, false_positive_rate
from creditrl.prm.model import ProcessRewardModel
from creditrl.prm.probe import ShortcutReport, StepRecord, shortcut_probe
from creditrl.rewards.sources import split_steps
from creditrl.tasks.base import Problem, Task

LABELER_NAMES = ("oracle", "outcome_heuristic", "mc", "vote")


def to_steps(completion: str, separator: str) -> list[str]:
    """The completion cut after every separator, empty pieces dropped (they concatenate back)."""
    return [s for s in split_steps(completion, separator) if s]


@dataclass
class Sample:
    problem: Problem
    completion: str
    steps: list[str]
    outcome: bool
    oracle: list[float | None]  # first-error step labels from the task's checker
    tokens: int = 0  # the tokens generated for it


@torch.no_grad()
def sample_solutions(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    task: Task,
    problems: Sequence[Problem],
    *,
    samples: int,
    params: SamplingParams,
    seed: int,
) -> list[Sample]:
    """``samples`` policy solutions per problem (prompt-major), with their true verdicts."""
    if task.step_separator is None:
        raise ValueError(f"task '{task.name}' has no step separator; a PRM needs steps")
    engine = make_engine(model, eos_id=tokenizer.eos_token_id, pad_id=tokenizer.pad_token_id)
    gen = engine.generate(
        [encode_problem(tokenizer, p) for p in problems],
        samples,
        params,
        generator=torch.Generator().manual_seed(seed),
    )
    out = []
    for i, toks in zip(gen.prompt_index, gen.tokens):
        problem = problems[i]
        completion = decode_response(tokenizer, toks)
        steps = to_steps(completion, task.step_separator)
        out.append(
            Sample(
                problem,
                completion,
                steps,
                task.check_outcome(problem, completion),
                oracle_labels(task, problem, steps),
                len(toks),
            )
        )
    return out


def label_samples(
    samples: Sequence[Sample],
    labeler: str,
    *,
    task: Task,
    model: PreTrainedModel | None = None,
    tokenizer: PreTrainedTokenizerBase | None = None,
    mc_n: int = 8,
    mc_mode: str = "hard",
    mc_params: SamplingParams | None = None,
    mc_max_rows: int | None = None,
    mc_max_positions: int | None = None,
    vote_labelers: Sequence[str] = ("outcome_heuristic", "mc"),
    vote_threshold: float = 1.0,
    seed: int = 0,
) -> tuple[list[StepwiseExample], dict[str, Any]]:
    """Stepwise examples labelled by ``labeler``; the info dict counts cost and dropped labels.

    ``mc`` (and ``vote`` with ``mc`` among its labelers) continues every step prefix ``mc_n``
    times with ``model`` (the completer policy) at ``mc_params``, at most ``mc_max_rows``
    continuations and ``mc_max_positions`` padded cache positions per engine call (memory bounds
    that leave the samples unchanged).
    """
    if labeler not in LABELER_NAMES:
        raise ValueError(f"unknown labeler '{labeler}'; valid: {', '.join(LABELER_NAMES)}")
    info: dict[str, Any] = {"labeler": labeler, "prm/sample_tokens": sum(s.tokens for s in samples)}
    rng = random.Random(seed)

    def one(name: str) -> list[list[float | None]]:
        if name == "oracle":
            return [list(s.oracle) for s in samples]
        if name == "outcome_heuristic":
            return [outcome_heuristic_labels(task, s.problem, s.steps, s.completion, rng) for s in samples]
        if name == "mc":
            if model is None or tokenizer is None or mc_params is None:
                raise ValueError("the mc labeler needs the completer model, its tokenizer and mc_params")
            engine = make_engine(model, eos_id=tokenizer.eos_token_id, pad_id=tokenizer.pad_token_id)
            res = mc_labels(
                engine,
                tokenizer,
                task,
                [(s.problem, s.steps) for s in samples],
                n=mc_n,
                params=mc_params,
                generator=torch.Generator().manual_seed(seed),
                mode=mc_mode,
                max_rows=mc_max_rows,
                max_positions=mc_max_positions,
            )
            info.update(
                {"mc/prefixes": res.n_prefixes, "mc/continuations": res.n_continuations, "mc/tokens": res.n_tokens}
            )
            return [list(x) for x in res.labels]
        raise ValueError(f"labeler '{name}' cannot be voted on (valid: oracle, outcome_heuristic, mc)")

    if labeler == "vote":
        per = [one(name) for name in vote_labelers]
        votes = [vote_labels(list(row), threshold=vote_threshold) for row in zip(*per)]
        labels = [lab for lab, _ in votes]
        info["vote/dropped"] = sum(d for _, d in votes)
    else:
        labels = one(labeler)
    examples = [
        StepwiseExample(
            prompt=s.problem.prompt,
            completions=list(s.steps),
            labels=list(lab),
            meta={"outcome": float(s.outcome), "oracle": list(s.oracle), "completion": s.completion},
        )
        for s, lab in zip(samples, labels)
        if s.steps
    ]
    return examples, info


def label_quality(examples: Sequence[StepwiseExample]) -> dict[str, float]:
    """How the labels of ``examples`` compare with their ``meta["oracle"]`` verdicts: coverage
    (share of oracle-labelled steps that got a label), false-positive rate, agreement."""
    pred, true = [], []
    for ex in examples:
        for p, t in zip(ex.labels, ex.meta["oracle"]):
            if t is not None:
                pred.append(p)
                true.append(t)
    labelled = [(p, t) for p, t in zip(pred, true) if p is not None]
    agree = sum((p >= 0.5) == (t >= 0.5) for p, t in labelled)
    return {
        "steps": float(len(true)),
        "coverage": len(labelled) / max(1, len(true)),
        "false_positive_rate": false_positive_rate(pred, true) if any(t < 0.5 for t in true) else 0.0,
        "agreement": agree / max(1, len(labelled)),
    }


def step_records(
    prm: ProcessRewardModel,
    tokenizer: PreTrainedTokenizerBase,
    examples: Sequence[StepwiseExample],
    *,
    batch_size: int = 64,
) -> list[StepRecord]:
    """(step text, PRM probability, true label) for every step with an oracle label."""
    scores = prm.score(tokenizer, [(ex.prompt, ex.completions) for ex in examples], batch_size=batch_size)
    out = []
    for ex, row in zip(examples, scores):
        for text, score, label in zip(ex.completions, row, ex.meta["oracle"]):
            if label is not None and not math.isnan(score):
                out.append(StepRecord(text, float(score), float(label)))
    return out


def reference_likelihood_auroc(
    prm: ProcessRewardModel, tokenizer: PreTrainedTokenizerBase, examples: Sequence[StepwiseExample]
) -> float | None:
    """AUROC of the untrained baseline inside a likelihood PRM: the step's summed token
    log-probability under the frozen reference policy alone (None without likelihood features)."""
    if not prm.likelihood:
        return None
    from creditrl.prm.model import encode, step_positions

    scores, labels = [], []
    for ex in examples:
        ids, ends = encode(tokenizer, ex.prompt, ex.completions, max_len=prm.max_positions)
        x = torch.tensor([ids])
        lp = prm.token_logprobs(x, torch.ones_like(x))[0]
        index = step_positions(ends, len(encode_prompt(tokenizer, ex.prompt)), len(ids))
        for k, label in enumerate(ex.meta["oracle"][: len(ends)]):
            if label is not None:
                scores.append(float(sum(v for v, i in zip(lp.tolist(), index) if i == k)))
                labels.append(label)
    return auroc(scores, labels)


def evaluate_prm(
    prm: ProcessRewardModel, tokenizer: PreTrainedTokenizerBase, examples: Sequence[StepwiseExample]
) -> tuple[float, ShortcutReport]:
    """Step-level AUROC against the oracle labels, and the shortcut probe on the same steps."""
    records = step_records(prm, tokenizer, examples)
    return auroc([r.score for r in records], [r.label for r in records]), shortcut_probe(records, tokenizer=tokenizer)
