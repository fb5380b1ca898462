"""``creditrl eval``: greedy held-out exact match of checkpoints on one larger problem set, with
paired differences against a baseline.

Checkpoints (a checkpoint directory, a run directory's latest checkpoint, or an SFT cache entry)
are evaluated on the first ``--size`` problems of the held-out stream the runs evaluate on
(``task.sample(n, split="heldout", seed=EVAL_SEED)``). Against the baseline each row reports the
paired difference in exact match, ``mean(c_i - b_i)`` over the problems, with its standard error
``sd(c_i - b_i) / sqrt(n)``, and how many problems it newly solves and newly fails.

:func:`exposure_bias`: a model's teacher-forced against its free-running step accuracy (what
:mod:`creditrl.train.scheduled_sampling` targets).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from creditrl.config import ConfigError, load_config


@dataclass
class CheckpointEval:
    checkpoint: str
    accuracy: float
    accuracy_se: float  # binomial: sqrt(p (1 - p) / n)
    step_accuracy: float
    mean_length: float
    n: int
    diff: float | None = None  # paired difference in exact match against the baseline
    diff_se: float | None = None
    gained: int | None = None  # problems this checkpoint solves and the baseline does not
    lost: int | None = None
    errors: dict[str, int] | None = None  # problems per first-error kind (task.first_error), with --errors
    split: str = "heldout"  # the problems' split: "train" is the split RL samples its prompts from


def paired_difference(base: list[bool], other: list[bool]) -> tuple[float, float, int, int]:
    """``(mean(o - b), sd(o - b) / sqrt(n), gained, lost)`` over paired per-problem outcomes
    (sample sd, n - 1; 0 when n < 2)."""
    if len(base) != len(other) or not base:
        raise ValueError(f"paired outcomes need equal, non-zero lengths (got {len(base)} and {len(other)})")
    d = [int(o) - int(b) for b, o in zip(base, other)]
    n = len(d)
    mean = sum(d) / n
    var = sum((x - mean) ** 2 for x in d) / (n - 1) if n > 1 else 0.0
    return mean, math.sqrt(var / n), d.count(1), d.count(-1)


def resolve_checkpoint(path: str) -> Path:
    """A checkpoint directory as given, or a run directory's latest checkpoint."""
    from creditrl.train.checkpoint import latest_checkpoint

    p = Path(path)
    if (p / "config.json").exists():
        return p
    latest = latest_checkpoint(p / "checkpoints")
    if latest is not None:
        return latest
    raise FileNotFoundError(
        f"checkpoint '{path}': neither a model directory (config.json) nor a run directory with checkpoints/latest"
    )


def evaluate_checkpoints(
    config: str | None,
    checkpoints: list[str],
    *,
    size: int,
    baseline: str | None = None,
    overrides: list[str] | None = None,
    errors: bool = False,
    split: str = "heldout",
    log=print,
) -> list[CheckpointEval]:
    """Evaluate ``checkpoints`` (and ``baseline``, first, when given) on ``size`` problems of
    ``split`` (``"train"``: the prompts RL trains on, drawn as a run's evaluation draws, with
    repeats where the task draws them); with ``errors``, also count each checkpoint's problems by
    the task's ``first_error`` kind."""
    import torch

    from creditrl.policy.model import load_policy, policy_options
    from creditrl.train.build import EVAL_SEED
    from creditrl.train.evaluate import evaluate
    from creditrl.train.resolve import run_task

    if size < 1:
        raise ConfigError(f"--size: must be > 0, got {size}")
    cfg = load_config(config, overrides or [])
    paths = ([baseline] if baseline else []) + list(checkpoints)
    if not paths:
        raise ConfigError("give at least one checkpoint")
    resolved = [resolve_checkpoint(p) for p in paths]  # fail on a bad path before evaluating any
    task = run_task(cfg)
    if errors and not hasattr(task, "first_error"):
        raise ConfigError(f"--errors: task {cfg.task.name!r} has no first_error classifier (arithmetic has)")
    if split not in ("heldout", "train"):
        raise ConfigError(f"--split: must be heldout or train, got {split!r}")
    problems = task.sample(size, split=split, seed=EVAL_SEED)
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    rows: list[CheckpointEval] = []
    base_correct: list[bool] | None = None
    for given, path in zip(paths, resolved):
        model, tok = load_policy(str(path), **policy_options(cfg))
        model.eval()
        res = evaluate(
            model,
            tok,
            task,
            problems,
            max_new_tokens=cfg.rollout.max_new_tokens,
            engine=cfg.policy.engine,
            precision=cfg.policy.precision,
            kernels=cfg.policy.kernels,
        )
        p, n = res.accuracy, len(problems)
        row = CheckpointEval(given, p, math.sqrt(p * (1 - p) / n), res.step_accuracy, res.mean_length, n, split=split)
        if base_correct is None:
            base_correct = res.correct
        else:
            row.diff, row.diff_se, row.gained, row.lost = paired_difference(base_correct, res.correct)
        if errors:
            kinds = [task.first_error(q, c) for q, c in zip(problems, res.completions)]
            if stray := sorted(set(kinds) - set(task.error_kinds)):
                raise ConfigError(
                    f"--errors: task {cfg.task.name!r}'s first_error returned {stray}, "
                    f"not among its error_kinds {list(task.error_kinds)}"
                )
            row.errors = {k: kinds.count(k) for k in task.error_kinds}
        rows.append(row)
        log(f"[creditrl eval] {given}: exact match {100 * p:.1f}% +- {100 * row.accuracy_se:.1f}")
    return rows


def markdown_table(rows: list[CheckpointEval]) -> str:
    lines = [
        f"Greedy {'held-out' if rows[0].split == 'heldout' else 'train-split'} exact match on {rows[0].n:,} problems; "
        "differences are paired against "
        f"the first row ({rows[0].checkpoint}).",
        "",
        "| checkpoint | exact match | step accuracy | difference (points) | newly solved / newly failed |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        diff = "-" if r.diff is None else f"{100 * r.diff:+.1f} +- {100 * r.diff_se:.1f}"
        flips = "-" if r.gained is None else f"{r.gained} / {r.lost}"
        lines.append(
            f"| {r.checkpoint} | {100 * r.accuracy:.1f}% +- {100 * r.accuracy_se:.1f} | "
            f"{100 * r.step_accuracy:.1f}% | {diff} | {flips} |"
        )
    return "\n".join(lines)


def errors_table(rows: list[CheckpointEval]) -> str:
    """Share of the problems per first-error kind (see ``ArithmeticTask.first_error``), one row per checkpoint."""
    kinds = list(rows[0].errors or {})
    lines = [
        f"Where greedy solutions first go wrong (share of the {rows[0].n:,} problems):",
        "",
        "| checkpoint | " + " | ".join(k.replace("_", " ") for k in kinds) + " |",
        "|---" * (len(kinds) + 1) + "|",
    ]
    for r in rows:
        counts = r.errors or {}
        lines.append(f"| {r.checkpoint} | " + " | ".join(f"{100 * counts.get(k, 0) / r.n:.1f}%" for k in kinds) + " |")
    return "\n".join(lines)


def exposure_bias(
    model: Any,
    tokenizer: Any,
    task: Any,
    problems: list,
    *,
    max_new_tokens: int,
    engine: str = "auto",
) -> dict[str, float]:
    """Teacher-forced against free-running step accuracy of ``model`` on ``problems``.

    ``tf_step_accuracy``: the mean over problems of the share of the reference solution's steps
    (the answer segment included) whose every token is the model's argmax given the reference
    prefix. ``free_step_accuracy``: the mean share of the reference's steps that the model's own
    greedy solution gets right (``task.label_completion``), with ``accuracy`` its exact match.
    ``gap`` = teacher-forced minus free-running."""
    import torch

    from creditrl.train.evaluate import evaluate
    from creditrl.train.sft import sft_batch

    ids, mask, labels = sft_batch(tokenizer, problems)
    with torch.no_grad():
        pred = model(input_ids=ids, attention_mask=mask).logits.argmax(-1)
    sep = task.step_separator or ""
    tf_shares, free_shares = [], []
    res = evaluate(model, tokenizer, task, problems, max_new_tokens=max_new_tokens, engine=engine)
    for i, (problem, completion) in enumerate(zip(problems, res.completions)):
        where = (labels[i] != -100).nonzero().flatten()
        right = (pred[i, where - 1] == labels[i, where]).tolist()[:-1]  # the eos left out
        steps = _step_tokens(tokenizer, problem.solution, sep)
        tf_shares.append(sum(all(right[a:b]) for a, b in steps) / len(steps))
        free = task.label_completion(problem, completion)
        free_shares.append(sum(free[: len(steps)]) / len(steps))
    tf, fr = sum(tf_shares) / len(problems), sum(free_shares) / len(problems)
    return {"tf_step_accuracy": tf, "free_step_accuracy": fr, "gap": tf - fr, "accuracy": res.accuracy}


def _step_tokens(tokenizer: Any, solution: str, sep: str) -> list[tuple[int, int]]:
    """Token spans of a solution's steps: a step ends after its separator, the answer segment (from
    the first ``#``) is the last, and a token belongs to the step its first character lies in."""
    bounds, start = [], 0
    hash_at = solution.find("#")
    head = solution if hash_at < 0 else solution[:hash_at]
    for i, ch in enumerate(head):
        if sep and ch == sep:
            bounds.append((start, i + 1))
            start = i + 1
    if start < len(solution):
        bounds.append((start, len(solution)))
    offsets = tokenizer(solution, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    firsts = [a for a, _ in offsets]
    spans = []
    for a, b in bounds:
        if toks := [j for j, f in enumerate(firsts) if a <= f < b]:
            spans.append((toks[0], toks[-1] + 1))
    return spans
