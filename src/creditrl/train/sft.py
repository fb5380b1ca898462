"""Supervised warm start: teach the policy the task's solution format before RL.

Trains on ``bos + prompt + solution + eos`` with the loss on the solution and eos only, AdamW
with linear warm-up and cosine decay. Results are cached by a hash of everything that determines
them (policy, SFT settings, task), so a second ``creditrl demo`` skips straight to RL.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import time
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any, Iterator

import torch
from tqdm import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from creditrl.config import Config, config_hash
from creditrl.policy.device import autocast, grad_scaler, resolve_device
from creditrl.policy.model import load_policy
from creditrl.tasks import make_task
from creditrl.tasks.base import Problem
from creditrl.train.checkpoint import save_checkpoint
from creditrl.train.evaluate import encode_prompt, evaluate

CACHE_VERSION = 1


def cache_root() -> Path:
    """``$CREDITRL_CACHE`` or ``~/.cache/creditrl``."""
    return Path(os.environ.get("CREDITRL_CACHE", Path.home() / ".cache" / "creditrl"))


@contextmanager
def cache_lock(path: Path) -> Iterator[None]:
    """An exclusive lock (``<path>.lock``, ``flock``) held while a cache entry is looked up and,
    if missing, built: processes that need the same entry build it once."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


# Fields the SFT checkpoint does not depend on (generation engine, RL-only switches), and fields
# added later that enter the key only when set (so existing caches keep their keys).
_NOT_IN_SFT_KEY = ("engine", "kernels", "lora_r", "lora_alpha", "lora_dropout", "lora_targets", "gradient_checkpointing")
_KEY_WHEN_SET = {"dtype": "float32", "local_files_only": True, "chat_template": "auto", "device": "cpu", "precision": "fp32"}


def sft_policy_fields(cfg: Config) -> dict:
    return {
        k: v for k, v in asdict(cfg.policy).items()
        if k not in _NOT_IN_SFT_KEY and not (k in _KEY_WHEN_SET and v == _KEY_WHEN_SET[k])
    }


def policy_options(cfg: Config) -> dict:
    """The ``load_policy`` keyword arguments a config sets."""
    p = cfg.policy
    return {"dtype": p.dtype, "local_files_only": p.local_files_only, "chat_template": p.chat_template}


def sft_key(cfg: Config) -> str:
    return config_hash(
        {
            "v": CACHE_VERSION,
            # the generation engine does not change the checkpoint (greedy evaluation agrees)
            "policy": sft_policy_fields(cfg),
            "sft": asdict(cfg.sft),
            "task": asdict(cfg.task),  # the held-out report is on the RL task
            "eval": [cfg.train.eval_size, cfg.rollout.max_new_tokens],
        }
    )


def sft_batch(
    tokenizer: PreTrainedTokenizerBase, problems: list[Problem]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded (ids, attention_mask, labels) with labels = -100 outside solution + eos."""
    rows, targets = [], []
    for p in problems:
        prompt = encode_prompt(tokenizer, p.prompt)
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


def lr_at(step: int, total: int, warmup: int, peak: float) -> float:
    """Linear warm-up to ``peak`` then cosine decay to 10% of it."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def train_sft(
    cfg: Config, out_dir: Path, *, progress: bool = True
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase, dict[str, Any]]:
    """Run SFT and save the model to ``out_dir``; returns (model, tokenizer, metrics)."""
    s = cfg.sft
    torch.manual_seed(s.seed)
    model, tokenizer = load_policy(cfg.policy.model, seed=cfg.policy.init_seed, **policy_options(cfg))
    device, precision = resolve_device(cfg.policy.device), cfg.policy.precision
    model.to(device)
    scaler = grad_scaler(device, precision)
    task = make_task(cfg.task.name, **(s.task_args or cfg.task.args))  # empty: the RL task's own args
    opt = torch.optim.AdamW(model.parameters(), lr=s.lr, weight_decay=s.weight_decay, betas=(0.9, 0.98))
    model.train()
    start = time.time()
    bar = tqdm(range(s.steps), desc="sft", disable=not progress, dynamic_ncols=True)
    loss_ema = None
    for step in bar:
        problems = task.sample(s.batch_size, split="train", seed=s.seed * 1_000_003 + step)
        ids, mask, labels = (x.to(device) for x in sft_batch(tokenizer, problems))
        for g in opt.param_groups:
            g["lr"] = lr_at(step, s.steps, s.warmup_steps, s.lr)
        with autocast(device, precision):
            loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        if scaler is None:
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
        else:  # fp16: scaled loss, unscaled gradients for the clip, overflowing steps skipped
            scaler.scale(loss).backward()
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(opt)
            scaler.update()
        loss_value = float(loss.detach())
        loss_ema = loss_value if loss_ema is None else 0.95 * loss_ema + 0.05 * loss_value
        bar.set_postfix(loss=f"{loss_ema:.3f}")
    elapsed = time.time() - start
    eval_task = make_task(cfg.task.name, **cfg.task.args)
    heldout = eval_task.sample(cfg.train.eval_size, split="heldout", seed=12345)
    res = evaluate(model, tokenizer, eval_task, heldout, max_new_tokens=cfg.rollout.max_new_tokens,
                   engine=cfg.policy.engine, precision=precision, kernels=cfg.policy.kernels)
    metrics = {
        "sft/steps": s.steps,
        "sft/final_loss": loss_ema,
        "sft/time_s": elapsed,
        "eval/accuracy": res.accuracy,
        "eval/step_accuracy": res.step_accuracy,
    }
    save_checkpoint(out_dir, model, tokenizer, None, {"sft": asdict(s), "metrics": metrics})
    return model, tokenizer, metrics


def cached_sft(cfg: Config, *, progress: bool = True) -> tuple[Path, dict[str, Any]]:
    """Path of the SFT checkpoint for ``cfg`` (trained now if not cached) and its metrics."""
    path = cache_root() / "sft" / sft_key(cfg)
    state_file = path / "trainer_state.json"
    with cache_lock(path):  # parallel runs needing the same checkpoint: the first trains it, the others wait
        if state_file.exists():
            return path, json.loads(state_file.read_text())["metrics"]
        _, _, metrics = train_sft(cfg, path, progress=progress)
    return path, metrics
