"""``creditrl exposure-report``: plain SFT against scheduled sampling, as exposure bias and as RL starts.

For each seed ``s`` and each SFT variant (:data:`VARIANTS`: plain teacher forcing, and scheduled
sampling with the inverse-sigmoid schedule up to 0.25), the warm start is trained with
``sft.seed=s`` (cached), its exposure bias is measured on held-out problems
(:func:`creditrl.train.scheduled_sampling.exposure_bias`: teacher-forced against free-running
step accuracy, and its greedy exact match, the RL start), and outcome GRPO and process GRPO
(oracle step rewards) train from it with ``train.seed=s``
(:func:`creditrl.experiments.launch.run_arms`, resumable; with ``summaries``, each finished run's
summary and each start's measurements are kept there, so a later call trains nothing it has).
Everything is reported as means with 95% Student-t intervals over the seeds, and as the paired
per-seed difference scheduled sampling minus plain.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from creditrl.config import load_config
from creditrl.experiments.grid import QUICK_SET
from creditrl.experiments.launch import run_arms
from creditrl.experiments.plan import slug
from creditrl.experiments.report import eval_rows
from creditrl.experiments.report_setup import base_config, step_task, task_phrase
from creditrl.experiments.seeds import mean_ci95
from creditrl.train.evaluate import evaluate
from creditrl.train.sft import sft_batch

__all__ = ["VARIANTS", "ARMS", "exposure_bias", "run_exposure_report", "exposure_markdown"]

VARIANTS: dict[str, list[str]] = {
    "plain SFT": [],
    "scheduled sampling": ["sft.scheduled_sampling=inverse_sigmoid", "sft.ss_max=0.25"],
}
ARMS: dict[str, list[str]] = {
    "outcome GRPO": ["reward.source=outcome", "credit.estimator=grpo"],
    "process GRPO": [
        "reward.source=oracle_steps",
        "reward.granularity=step",
        "credit.estimator=grpo_process",
        "credit.normaliser=batch",
    ],
}
FULL = {
    "seeds": [0, 1, 2],
    "samples": 19_200,  # 150 iterations x 16 prompts x 8 samples, the arith config's budget
    "problems": 1024,
    "common": ["train.eval_every=30", "train.eval_size=1024", "train.checkpoint_every=100000", "train.inspect_every=0"],
}
QUICK = {"seeds": [0, 1], "samples": 32, "problems": 8, "common": [*QUICK_SET, "train.inspect_every=0"]}
MEASURES = ("tf_step_accuracy", "free_step_accuracy", "gap", "accuracy")


def _measure_start(cfg, init: str, problems: int, where: Path) -> dict[str, float]:
    """The exposure-bias measurements of the start at ``init``, with ``init`` (kept in ``where``,
    and read back from there when it exists)."""
    if where.is_file():
        return json.loads(where.read_text())
    from creditrl.policy.model import load_policy, policy_options

    task = step_task(cfg, "creditrl exposure-report")
    model, tokenizer = load_policy(init, seed=cfg.policy.init_seed, **policy_options(cfg))
    model.eval()
    held = task.sample(problems, split="heldout", seed=4242)
    out = {**exposure_bias(model, tokenizer, task, held, max_new_tokens=cfg.rollout.max_new_tokens), "init": init}
    where.parent.mkdir(parents=True, exist_ok=True)
    where.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    return out


def run_exposure_report(
    out: Path | None,
    *,
    quick: bool = False,
    config: str | Path | None = None,
    overrides: list[str] | None = None,
    seeds: int | None = None,
    jobs: int = 1,
    summaries: Path | None = None,
) -> dict[str, Any]:
    """Both SFT variants x both RL arms x the seeds (module docstring); returns the summary."""
    sizes = QUICK if quick else FULL
    base = base_config(config, quick)
    common = list(sizes["common"]) + list(overrides or [])
    step_task(load_config(base, common), "creditrl exposure-report")  # refuse a task without steps first
    out = Path(out or Path("runs") / f"exposure-{time.strftime('%Y%m%d-%H%M%S')}")
    out.mkdir(parents=True, exist_ok=True)
    seed_list = sizes["seeds"] if seeds is None else list(range(seeds))
    start = time.time()
    log = lambda msg: print(f"[creditrl exposure-report] {time.time() - start:6.0f} s  {msg}", flush=True)  # noqa: E731
    starts: dict[str, list[dict[str, float]]] = {v: [] for v in VARIANTS}
    finals: dict[str, dict[str, list[float]]] = {v: {a: [] for a in ARMS} for v in VARIANTS}
    for seed in seed_list:
        for variant, sft_sets in VARIANTS.items():
            sets = [*common, *sft_sets, f"sft.seed={seed}"]
            keep = (summaries or out) / slug(variant)
            measured = keep / f"start_seed{seed}.json"
            init = json.loads(measured.read_text())["init"] if measured.is_file() else _sft_start(base, sets)
            starts[variant].append(_measure_start(load_config(base, sets), init, sizes["problems"], measured))
            log(f"{variant}, seed {seed}: start {starts[variant][-1]['accuracy']:.3f}")
            results = run_arms(
                base,
                ARMS,
                [seed],
                sizes["samples"],
                out / slug(variant),
                init,
                sets,
                log,
                unit="samples",
                jobs=jobs,
                summaries=keep if summaries else None,
            )
            for arm, histories in results.items():
                finals[variant][arm].append(eval_rows(histories[0])[-1]["eval/accuracy"])
    cfg = load_config(base, common)
    summary = {"seeds": seed_list, "samples": sizes["samples"], "task": task_phrase(cfg), "starts": starts}
    summary["finals"] = finals
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    log(f"summary: {out / 'summary.json'}")
    return summary


def _sft_start(base: Path, sets: list[str]) -> str:
    from creditrl.train.build import start_policy

    cfg = load_config(base, [*sets, "train.init=sft"])
    return start_policy(cfg, progress=cfg.train.progress)


def exposure_markdown(summary: dict[str, Any]) -> str:
    """The per-variant table and the paired differences, means ± 95% t-intervals over the seeds."""
    pct = lambda xs: "{:.1f} ± {:.1f}%".format(*(100 * v for v in mean_ci95(xs)))  # noqa: E731
    pts = lambda xs: "{:+.1f} ± {:.1f} points".format(*(100 * v for v in mean_ci95(xs)))  # noqa: E731
    head = (
        "| SFT | teacher-forced step accuracy | free-running step accuracy | gap | RL start (greedy exact match) "
        + "".join(f"| after {arm} " for arm in ARMS)
        + "|\n"
        + "|---" * (5 + len(ARMS))
        + "|\n"
    )
    rows = ""
    for variant, starts in summary["starts"].items():
        cells = [pct([s[m] for s in starts]) for m in MEASURES]
        cells += [pct(summary["finals"][variant][arm]) for arm in ARMS]
        rows += f"| {variant} | " + " | ".join(cells) + " |\n"
    plain, mixed = summary["starts"]["plain SFT"], summary["starts"]["scheduled sampling"]
    diff = [pts([b[m] - a[m] for a, b in zip(plain, mixed)]) for m in MEASURES]
    diff += [
        pts([b - a for a, b in zip(summary["finals"]["plain SFT"][arm], summary["finals"]["scheduled sampling"][arm])])
        for arm in ARMS
    ]
    rows += "| scheduled sampling - plain, paired by seed | " + " | ".join(diff) + " |\n"
    return head + rows


def exposure_bias(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    task: Any,
    problems: list,
    *,
    max_new_tokens: int,
    engine: str = "auto",
) -> dict[str, float]:
    """Teacher-forced against free-running step accuracy of ``model`` on ``problems``.

    ``tf_step_accuracy``: the mean over problems of the share of the reference solution's steps
    (split at ``task.step_separator``, the answer segment included) whose every token is the
    model's argmax given the reference prefix. ``free_step_accuracy``: the mean share of the
    reference's steps that the model's own greedy solution gets right (``task.label_completion``,
    stop at the first error), with ``accuracy`` its exact match. ``gap`` = teacher-forced minus
    free-running."""
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


def _step_tokens(tokenizer: PreTrainedTokenizerBase, solution: str, sep: str) -> list[tuple[int, int]]:
    """Token spans of a solution's steps (tokenized as SFT tokenizes it): a step ends after its
    separator; the answer segment (from the first ``#``) is the last. A token belongs to the step
    its first character lies in."""
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
        toks = [j for j, f in enumerate(firsts) if a <= f < b]
        if toks:
            spans.append((toks[0], toks[-1] + 1))
    return spans
