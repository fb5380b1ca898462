"""Supervised warm start: teach the policy the task's solution format before RL.

Trains on ``bos + prompt + solution + eos`` with the loss on the solution and eos only, AdamW
with linear warm-up and cosine decay. Results are cached by a hash of everything that determines
them (policy, SFT settings, task), so a second ``creditrl demo`` skips straight to RL.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from creditrl.cache import cache_lock, cache_root
from creditrl.config import Config, config_hash
from creditrl.credit.schedule import lr_at
from creditrl.errors import ConfigError
from creditrl.policy.device import autocast, grad_scaler, resolve_device
from creditrl.policy.model import load_policy, policy_options
from creditrl.policy.tokenizer import encode_problem
from creditrl.tasks.base import Problem, Task
from creditrl.train.checkpoint import MANIFEST, save_checkpoint, verify_checkpoint, write_manifest
from creditrl.train.evaluate import EVAL_SEED, evaluate
from creditrl.train.optim import backward, clip_and_step
from creditrl.train.outcomes import pack_outcomes
from creditrl.train.resolve import run_task, task_args
from creditrl.train.scheduled_sampling import mix_inputs, sampling_probability

CACHE_VERSION = 1
ESTIMATE_AFTER = 10  # SFT steps timed before the log estimates the whole warm start
PLAIN_LINES = 20  # progress lines of a warm start off a terminal (in place of the bar)


# Fields the SFT checkpoint does not depend on, and fields added later that enter the key only
# when set (so existing caches keep their keys).
_NOT_IN_SFT_KEY = (
    "engine",
    "kernels",
    "forward",  # the RL update's and reference's forward pass; SFT runs the HF modules
    "lora_r",
    "lora_alpha",
    "lora_dropout",
    "lora_targets",
    "gradient_checkpointing",
)
_KEY_WHEN_SET = {
    "dtype": "float32",
    "local_files_only": True,
    "chat_template": "auto",
    "device": "cpu",
    "precision": "fp32",
}


def sft_policy_fields(cfg: Config) -> dict:
    return {
        k: v
        for k, v in cfg.policy.model_dump().items()
        if k not in _NOT_IN_SFT_KEY and not (k in _KEY_WHEN_SET and v == _KEY_WHEN_SET[k])
    }


# SFT fields added later, in the key only when set (a warm start cached before them keeps its key).
_SFT_KEY_WHEN_SET = {"scheduled_sampling": "none", "ss_max": 0.25, "ss_k": 0.0, "ss_greedy": False}


def sft_fields(cfg: Config) -> dict:
    return {k: v for k, v in cfg.sft.model_dump().items() if not (k in _SFT_KEY_WHEN_SET and v == _SFT_KEY_WHEN_SET[k])}


def sft_key(cfg: Config) -> str:
    return config_hash(
        {
            "v": CACHE_VERSION,
            # the generation engine does not change the checkpoint (greedy evaluation agrees)
            "policy": sft_policy_fields(cfg),
            # the task arguments as a run resolves them (checked or not, one key)
            "sft": {**sft_fields(cfg), "task_args": task_args(cfg, "sft.task_args") if cfg.sft.task_args else {}},
            "task": {"name": cfg.task.name, "args": task_args(cfg)},  # the held-out report is on the RL task
            "eval": [cfg.train.eval_size, cfg.rollout.max_new_tokens],
        }
    )


def sft_batch(
    tokenizer: PreTrainedTokenizerBase, problems: list[Problem]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded (ids, attention_mask, labels) with labels = -100 outside solution + eos."""
    rows, targets = [], []
    for p in problems:
        prompt = encode_problem(tokenizer, p)
        answer = tokenizer(p.solution, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        rows.append(prompt + answer)
        targets.append([-100] * len(prompt) + answer)
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (r, t) in enumerate(zip(rows, targets)):
        ids[i, : len(r)] = torch.as_tensor(r)
        labels[i, : len(t)] = torch.as_tensor(t)
        mask[i, : len(r)] = 1
    return ids, mask, labels


def heldout_report(
    cfg: Config, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, task: Task
) -> dict[str, float]:
    """Greedy accuracy and step accuracy of ``model`` on ``train.eval_size`` held-out problems of
    ``task``, and each problem's packed outcome (``eval/correct``: a start's fingerprint, kept in
    its state as ``heldout_correct``, not among its metrics)."""

    res = evaluate(
        model,
        tokenizer,
        task,
        task.sample(cfg.train.eval_size, split="heldout", seed=EVAL_SEED),
        max_new_tokens=cfg.rollout.max_new_tokens,
        engine=cfg.policy.engine,
        precision=cfg.policy.precision,
        kernels=cfg.policy.kernels,
    )
    return {
        "eval/accuracy": res.accuracy,
        "eval/step_accuracy": res.step_accuracy,
        "eval/correct": pack_outcomes(res.correct),
    }


def _metrics_of(report: dict[str, Any]) -> dict[str, Any]:
    """A :func:`heldout_report`'s metrics: all but the outcomes."""
    return {k: v for k, v in report.items() if k != "eval/correct"}


def start_outcomes(cfg: Config, path: Path, *, fresh: bool = False) -> str:
    """The packed held-out outcomes of the SFT checkpoint at ``path`` on ``cfg``'s RL task: read
    from its state, or evaluated now and stored there when the entry predates them or ``fresh``."""
    state = json.loads((path / "trainer_state.json").read_text())
    if fresh or "heldout_correct" not in state:
        with cache_lock(path):  # grids sharing this start evaluate it one at a time
            _report_on(cfg, path, None)
        state = json.loads((path / "trainer_state.json").read_text())
    return state["heldout_correct"]


def train_sft(
    cfg: Config, out_dir: Path, *, progress: bool = True, task: Task | None = None, sft_task: Task | None = None
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase, dict[str, Any]]:
    """Run SFT and save the model to ``out_dir``; returns (model, tokenizer, metrics). ``sft_task``
    draws the SFT problems (default: built from ``sft.task_args``), ``task`` the held-out report
    (default: built from ``task.args``)."""
    s = cfg.sft
    torch.manual_seed(s.seed)
    model, tokenizer = load_policy(cfg.policy.model, seed=cfg.policy.init_seed, **policy_options(cfg))
    device, precision = resolve_device(cfg.policy.device), cfg.policy.precision
    model.to(device)
    scaler = grad_scaler(device, precision)
    task = task or run_task(cfg)
    sft_task = sft_task or (run_task(cfg, "sft.task_args") if s.task_args else task)
    opt = torch.optim.AdamW(model.parameters(), lr=s.lr, weight_decay=s.weight_decay, betas=(0.9, 0.98))
    model.train()
    start = time.time()
    plain = progress and not sys.stderr.isatty()  # a log file: plain lines, not a bar's carriage returns
    bar = tqdm(range(s.steps), desc="sft", disable=not progress or plain, dynamic_ncols=True)
    loss_ema, replaced = None, []
    mixing = torch.Generator(device=device).manual_seed(s.seed + 7)  # scheduled sampling's draws
    for step in bar:
        problems = sft_task.sample(s.batch_size, split="train", seed=s.seed * 1_000_003 + step)
        ids, mask, labels = (x.to(device) for x in sft_batch(tokenizer, problems))
        for g in opt.param_groups:
            g["lr"] = lr_at(step, s.steps, s.warmup_steps, s.lr)
        p = sampling_probability(s.scheduled_sampling, step, s.steps, s.ss_max, s.ss_k)
        if p > 0:
            with autocast(device, precision):
                ids, share = mix_inputs(model, ids, mask, labels, p, mixing, greedy=s.ss_greedy)
            replaced.append(share)
        with autocast(device, precision):
            loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        backward(loss, scaler)
        clip_and_step(model, opt, 1.0, scaler)
        if scaler is not None:
            scaler.update()
        loss_value = float(loss.detach())
        loss_ema = loss_value if loss_ema is None else 0.95 * loss_ema + 0.05 * loss_value
        bar.set_postfix(loss=f"{loss_ema:.3f}")
        if plain and ((step + 1) % max(1, s.steps // PLAIN_LINES) == 0 or step + 1 == s.steps):
            line = f"creditrl: sft step {step + 1}/{s.steps}, loss {loss_ema:.3f}, {time.time() - start:.0f} s"
            print(line, file=sys.stderr, flush=True)
        if progress and step + 1 == min(ESTIMATE_AFTER, s.steps) < s.steps:
            per_step = (time.time() - start) / (step + 1)
            print(
                f"creditrl: sft: {per_step:.2f} s per step, about {per_step * s.steps / 60:.1f} min for "
                f"{s.steps} steps (sft.steps)",
                flush=True,
            )
    elapsed = time.time() - start
    metrics = {"sft/steps": s.steps, "sft/final_loss": loss_ema, "sft/time_s": elapsed}
    if s.scheduled_sampling != "none":  # the share of response tokens fed from the model, over SFT
        metrics["sft/ss_replaced"] = sum(replaced) / len(replaced) if replaced else 0.0
    report = heldout_report(cfg, model, tokenizer, task)
    metrics.update(_metrics_of(report))
    state = {"sft": s.model_dump(), "metrics": metrics, "heldout_correct": report["eval/correct"]}
    save_checkpoint(out_dir, model, tokenizer, None, state)
    return model, tokenizer, metrics


def recipe_key(cfg: Config) -> str:
    """What the SFT weights depend on: the policy, the SFT settings and the SFT problems' task. Configs
    that differ only in their RL task share the weights (see :func:`cached_sft`)."""
    return config_hash(
        {
            "v": CACHE_VERSION,
            "policy": sft_policy_fields(cfg),
            "sft": sft_fields(cfg),
            "sft_task": [cfg.task.name, dict(cfg.sft.task_args or cfg.task.args)],
        }
    )


def _link_entry(
    source: Path,
    path: Path,
    *,
    link: bool = True,
    drop: tuple[str, ...] = (),
    cfg: Config | None = None,
    task: Task | None = None,
) -> dict[str, Any] | None:
    """A new checkpoint at ``path`` holding ``source``'s files but ``drop`` (hard links where asked
    and the file system allows, copies otherwise), its state file and manifest written anew. With
    ``cfg``: its held-out report on ``cfg``'s RL task (``task``), written before the entry appears
    at ``path`` and returned, so that a process stopped midway leaves no entry holding ``source``'s
    report on another task as its own."""
    tmp = path.with_name(path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for f in source.iterdir():
        if f.is_file() and f.name not in ("trainer_state.json", MANIFEST, *drop):
            if link:
                try:
                    os.link(f, tmp / f.name)
                    continue
                except OSError:
                    pass
            shutil.copy2(f, tmp / f.name)
    _write_state(tmp, json.loads((source / "trainer_state.json").read_text()))
    metrics = None if cfg is None else _report_on(cfg, tmp, task)
    shutil.rmtree(path, ignore_errors=True)
    tmp.rename(path)
    return metrics


def _write_state(path: Path, state: dict[str, Any]) -> None:
    """Checkpoint ``path``'s state file, rewritten, and its manifest with it (a new file: a linked
    entry's manifest is not its source's)."""
    tmp = path / "trainer_state.json.tmp"  # renamed into place: a reader never sees a half-written state
    tmp.write_text(json.dumps(state))
    os.replace(tmp, path / "trainer_state.json")
    write_manifest(path)


def _weights_sha(path: Path) -> str | None:
    """The SHA-256 of checkpoint ``path``'s weights, as its manifest records it (None: no manifest)."""
    try:
        return json.loads((path / MANIFEST).read_text())["files"]["model.safetensors"]["sha256"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def keep_start(path: Path, dest: Path) -> None:
    """Copy SFT checkpoint ``path`` (all but its RNG state) to ``dest`` with a manifest of its own: a
    start a repository keeps, for ``cached_sft(weights=dest)`` on another machine."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    _link_entry(path, dest, link=False, drop=("rng.pt",))


def _report_on(cfg: Config, path: Path, task: Task | None) -> dict[str, Any]:
    """The held-out report of the SFT checkpoint at ``path`` on ``cfg``'s RL task, written into its state."""
    model, tokenizer = load_policy(str(path), **policy_options(cfg))
    model.to(resolve_device(cfg.policy.device))
    state = json.loads((path / "trainer_state.json").read_text())
    metrics = {k: v for k, v in state["metrics"].items() if k.startswith("sft/")}
    report = heldout_report(cfg, model, tokenizer, task or run_task(cfg))
    metrics.update(_metrics_of(report))
    state["metrics"], state["heldout_correct"] = metrics, report["eval/correct"]
    _write_state(path, state)
    return metrics


def cached_sft(
    cfg: Config,
    *,
    progress: bool = True,
    task: Task | None = None,
    sft_task: Task | None = None,
    weights: Path | None = None,
) -> tuple[Path, dict[str, Any]]:
    """Path of the SFT checkpoint for ``cfg`` (trained now if not cached) and its metrics; ``task``
    and ``sft_task`` as in :func:`train_sft` (built there only when SFT runs).

    An entry is keyed by :func:`sft_key` (weights and the held-out report on the RL task). When it
    is missing but an entry with the same :func:`recipe_key` exists, the new entry links that one's
    weights and only the report is computed. ``weights``: a start of this recipe kept elsewhere
    (:func:`keep_start`): the entry holds its files, whatever was cached or could be trained here."""
    root = cache_root() / "sft"
    path = root / sft_key(cfg)
    state_file = path / "trainer_state.json"
    recipe = cache_root() / "sft-recipes" / recipe_key(cfg)  # outside sft/: every entry there is a checkpoint
    with cache_lock(path):  # parallel runs needing the same checkpoint: the first trains it, the others wait
        if state_file.exists() and (weights is None or _weights_sha(path) == _weights_sha(weights)):
            return path, json.loads(state_file.read_text())["metrics"]
        with cache_lock(recipe):
            if weights is not None:
                problem = verify_checkpoint(weights)
                if problem is not None:
                    raise ConfigError(f"kept start {weights}: {problem}")
                # drop: the kept start's notes on other tasks
                metrics = _link_entry(weights, path, drop=("heldout.json",), cfg=cfg, task=task)
                recipe.parent.mkdir(parents=True, exist_ok=True)
                recipe.write_text(path.name)
                return path, metrics
            source = root / recipe.read_text().strip() if recipe.exists() else None
            if source is not None and (source / "trainer_state.json").exists():
                return path, _link_entry(source, path, cfg=cfg, task=task)
            if progress:
                print(
                    f"creditrl: supervised warm start of {cfg.policy.model}, {cfg.sft.steps} steps "
                    f"(train.init={cfg.train.init}; train.init=policy starts RL from the model as it is)",
                    flush=True,
                )
            _, _, metrics = train_sft(cfg, path, progress=progress, task=task, sft_task=sft_task)
            recipe.parent.mkdir(parents=True, exist_ok=True)
            recipe.write_text(path.name)
    return path, metrics
