"""Training a process reward model: binary cross-entropy at the labelled step ends.

For member m, step k of example i with label y_ik (None labels are skipped):

    loss_m = mean over labelled (i, k) in member m's batch of BCE(logit_m(end of step k), t_ik)

with ``t_ik = 1[y_ik >= 0.5]`` (hard) or ``t_ik = y_ik`` (``soft``: e.g. a Monte-Carlo
fraction of successful rollouts, Math-Shepherd, arXiv:2312.08935). Each member draws its
batches from its own seeded shuffle of the data (bagging-like diversity on top of the head
seeds) and is clipped on its own; AdamW with linear warm-up and cosine decay as in
:mod:`creditrl.train.sft`.

Shortcut defence: with ``max_step_tokens``, examples with any step longer than that are
dropped, not truncated: if wrong steps are longer on average (they often are: a policy that
goes astray rambles) the PRM could learn "long step = wrong" instead of checking the step.
"""

from __future__ import annotations

import json
import math
import random
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from tqdm import tqdm
from transformers import PreTrainedTokenizerBase

from creditrl.config import Config
from creditrl.credit.schedule import lr_at
from creditrl.policy.device import module_device, resolve_device
from creditrl.policy.model import load_policy
from creditrl.policy.tokenizer import encode_prompt
from creditrl.prm.model import ProcessRewardModel, encode, right_pad, step_positions

if TYPE_CHECKING:
    from creditrl.prm.data import StepwiseExample

__all__ = ["train_prm", "train_prm_from_examples"]

_CURVE_POINTS = 10


@dataclass
class _Encoded:
    ids: list[int]  # bos + prompt + steps that fit
    ends: list[int]  # positions of labelled step ends
    targets: list[float]  # one BCE target per entry of ``ends``
    index: list[int]  # step of each position (-1 for the prompt), for likelihood features


def _prepare(
    tokenizer: PreTrainedTokenizerBase,
    examples: Sequence[StepwiseExample],
    *,
    soft: bool,
    max_step_tokens: int | None,
    max_len: int,
) -> tuple[list[_Encoded], dict[str, int]]:
    """Encode the usable examples; count the dropped ones and the labelled steps cut by ``max_len``."""
    data: list[_Encoded] = []
    counts = {"dropped_long_step": 0, "dropped_unlabelled": 0, "steps_truncated": 0}
    for ex in examples:
        if max_step_tokens is not None and any(
            len(tokenizer(s, add_special_tokens=False)["input_ids"]) > max_step_tokens for s in ex.completions
        ):
            counts["dropped_long_step"] += 1
            continue
        ids, ends = encode(tokenizer, ex.prompt, ex.completions, max_len=max_len)
        counts["steps_truncated"] += sum(y is not None for y in ex.labels[len(ends) :])
        kept = [(pos, y) for pos, y in zip(ends, ex.labels) if y is not None]
        if not kept:
            counts["dropped_unlabelled"] += 1
            continue
        targets = [float(y) if soft else float(y >= 0.5) for _, y in kept]
        data.append(
            _Encoded(
                ids=ids,
                ends=[pos for pos, _ in kept],
                targets=targets,
                index=step_positions(ends, len(encode_prompt(tokenizer, ex.prompt)), len(ids)),
            )
        )
    return data, counts


def _batches(n: int, batch_size: int, rng: random.Random) -> Iterator[list[int]]:
    """Endless batches of indices into n items: a fresh shuffle every epoch, wrapping across epochs."""
    order: list[int] = []
    while True:
        while len(order) < batch_size:
            epoch = list(range(n))
            rng.shuffle(epoch)
            order.extend(epoch)
        yield order[:batch_size]
        order = order[batch_size:]


def _member_loss(model: ProcessRewardModel, member: int, rows: list[_Encoded], pad_id: int) -> torch.Tensor:
    device = module_device(model)
    ids, mask = (x.to(device) for x in right_pad([r.ids for r in rows], pad_id))
    index = torch.tensor([r.index + [-1] * (ids.shape[1] - len(r.index)) for r in rows], device=device)  # (B, L)
    logits = model.member_logits(member, ids, mask, index)  # (B, L)
    b = torch.tensor([i for i, r in enumerate(rows) for _ in r.ends], device=device)
    pos = torch.tensor([p for r in rows for p in r.ends], device=device)
    targets = torch.tensor([t for r in rows for t in r.targets], device=device)
    return F.binary_cross_entropy_with_logits(logits[b, pos], targets)


def train_prm(
    model: ProcessRewardModel,
    tokenizer: PreTrainedTokenizerBase,
    examples: Sequence[StepwiseExample],
    *,
    steps: int = 300,
    batch_size: int = 16,
    lr: float = 1e-3,
    soft: bool = False,
    max_step_tokens: int | None = None,
    seed: int = 0,
    progress: bool = True,
    warmup_steps: int | None = None,
    weight_decay: float = 0.0,
    max_len: int | None = None,
    train_backbone: bool = True,
) -> dict[str, Any]:
    """Train ``model`` in place on ``examples`` for ``steps`` optimizer steps; return metrics.

    Args:
        steps: optimizer steps; every member sees ``batch_size`` examples per step.
        soft: train on the float labels as targets instead of ``label >= 0.5``.
        max_step_tokens: drop (and count) examples with any step longer than this many tokens.
        seed: seeds each member's data order (member m: ``seed``, m).
        warmup_steps: linear warm-up length, default 10% of ``steps``.
        max_len: encoding length (default the backbone's maximum positions); labelled steps
            that do not fit are counted in ``prm/steps_truncated``.
        train_backbone: False trains only the heads (a probe on the frozen backbone, plus the
            likelihood-feature weights): far fewer parameters to overfit a small label set.

    Returns:
        ``prm/steps``, ``prm/loss_first``, ``prm/loss_final`` (EMA 0.95), ``prm/loss_curve``
        (mean loss over ``10`` equal windows of steps, averaged over members),
        ``prm/examples_used``, ``prm/examples_dropped_long_step``,
        ``prm/examples_dropped_unlabelled``, ``prm/steps_truncated``, ``prm/labelled_steps``,
        ``prm/positive_fraction`` (mean target), ``prm/time_s``, ``prm/trained_positions`` (the padded token
        positions every member's batches forwarded and backpropagated).
    """
    if steps < 1 or batch_size < 1:
        raise ValueError(f"steps and batch_size must be >= 1, got steps={steps}, batch_size={batch_size}")
    start = time.time()
    max_len = model.max_positions if max_len is None else max_len
    data, counts = _prepare(tokenizer, examples, soft=soft, max_step_tokens=max_step_tokens, max_len=max_len)
    if not data:
        raise ValueError(f"no usable PRM training example among {len(examples)}: {counts}")
    warmup = max(1, steps // 10) if warmup_steps is None else warmup_steps
    orders = [_batches(len(data), batch_size, random.Random(seed * 1_000_003 + m)) for m in range(model.members)]
    for backbone in model.backbones:  # before the groups are filtered, so each group holds what trains
        backbone.requires_grad_(train_backbone)
    # a member's own parameters, clipped on their own so one member's spike does not shrink another's step
    groups = (
        [list(model.parameters())]
        if model.share_backbone
        else [[*model.backbone_of(m).parameters(), *model.heads[m].parameters()] for m in range(model.members)]
    )
    groups = [[q for q in g if q.requires_grad] for g in groups]
    trainable = [q for q in model.parameters() if q.requires_grad]
    opt = torch.optim.AdamW(trainable, lr=lr, weight_decay=weight_decay, betas=(0.9, 0.98))
    model.train()
    history: list[float] = []
    loss_ema = None
    positions = 0
    bar = tqdm(range(steps), desc="prm", disable=not progress, dynamic_ncols=True)
    for step in bar:
        for g in opt.param_groups:
            g["lr"] = lr_at(step, steps, warmup, lr)
        opt.zero_grad(set_to_none=True)
        losses = []
        for m in range(model.members):
            rows = [data[j] for j in next(orders[m])]
            positions += len(rows) * max(len(r.ids) for r in rows)  # the padded batch, forward and backward
            loss = _member_loss(model, m, rows, tokenizer.pad_token_id)
            loss.backward()
            losses.append(float(loss.detach()))
        for params in groups:
            torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        history.append(sum(losses) / len(losses))
        loss_ema = history[-1] if loss_ema is None else 0.95 * loss_ema + 0.05 * history[-1]
        bar.set_postfix(loss=f"{loss_ema:.3f}")
    model.eval()
    window = math.ceil(len(history) / _CURVE_POINTS)
    curve = [sum(c) / len(c) for c in (history[i : i + window] for i in range(0, len(history), window))]
    targets = [t for d in data for t in d.targets]
    return {
        "prm/steps": steps,
        "prm/loss_first": history[0],
        "prm/loss_final": loss_ema,
        "prm/loss_curve": curve,
        "prm/examples_used": len(data),
        "prm/examples_dropped_long_step": counts["dropped_long_step"],
        "prm/examples_dropped_unlabelled": counts["dropped_unlabelled"],
        "prm/steps_truncated": counts["steps_truncated"],
        "prm/labelled_steps": len(targets),
        "prm/positive_fraction": sum(targets) / len(targets),
        "prm/time_s": time.time() - start,
        "prm/trained_positions": positions,
    }


def train_prm_from_examples(
    cfg: Config, init_path: str, examples: Sequence[StepwiseExample], out: Path, progress: bool
) -> dict[str, Any]:
    """Train a PRM (the ``prm.*`` settings) on ``examples`` from the policy at ``init_path`` and
    save it with its tokenizer and training metrics to ``out``; returns the metrics."""
    from creditrl.prm.augment import augment_negatives

    p, seed = cfg.prm, cfg.prm_seed
    policy, tok = load_policy(init_path)
    if p.augment_rate > 0:
        examples = augment_negatives(examples, rate=p.augment_rate, rng=random.Random(seed))
    prm = ProcessRewardModel.from_model(
        policy, members=p.members, combine=p.combine, seed=seed, likelihood=p.likelihood
    )
    prm.to(resolve_device(cfg.policy.device))  # trained where the policy trains
    metrics = train_prm(
        prm,
        tok,
        examples,
        steps=p.steps,
        batch_size=p.batch_size,
        lr=p.lr,
        soft=p.soft,
        max_step_tokens=p.max_step_tokens,
        seed=seed,
        progress=progress,
        train_backbone=p.train_backbone,
    )
    prm.to("cpu")  # saved from the CPU; a reader places it (reward.prm: on policy.device)
    out.mkdir(parents=True, exist_ok=True)
    prm.save(out)
    tok.save_pretrained(out)
    (out / "train_metrics.json").write_text(json.dumps(metrics, indent=2))
    return metrics
