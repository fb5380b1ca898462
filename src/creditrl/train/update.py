"""The update stage: PPO epochs x minibatches of policy loss, KL, entropy and critic loss.

Per minibatch, with token-level importance ratios against the sampling policy::

    loss = agg(ppo_clip(A)) + kl_coef * agg(KL(pi || pi_ref)) - entropy_coef * agg(H)
           [+ value.coef * mean_m agg(clipped_value_loss(V_m, returns))   shared critic]

A separate critic takes its own optimizer step on its value loss in the same minibatch. During
the critic warm-up (``train_policy=False``) only the critic learns, and a shared critic's heads
read detached policy states so that the policy does not move.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import PreTrainedModel

from creditrl.config import Config
from creditrl.losses import aggregate, chunk_weight, clipped_value_loss, kl_estimate, ppo_clip_loss
from creditrl.rollout.batch import TrajectoryBatch, micro_batches, response_forward, token_entropy, token_logprobs
from creditrl.values.critic import Critic


@dataclass
class CriticTarget:
    """What the critic learns this iteration."""

    critic: Critic
    optimizer: torch.optim.Optimizer
    returns: torch.Tensor  # float (B, T), the estimator's returns (A + V for GAE)
    old_values: torch.Tensor  # float (M, B, T), each head's values at the value stage


def update(
    model: PreTrainedModel,
    optimizer: torch.optim.Optimizer,
    batch: TrajectoryBatch,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    cfg: Config,
    generator: torch.Generator,
    *,
    ref_logprobs: torch.Tensor | None = None,
    critic: CriticTarget | None = None,
    train_policy: bool = True,
) -> dict[str, float]:
    """Run the update; returns the metrics averaged over minibatches.

    advantages, mask, ref_logprobs: (B, T); ``ref_logprobs`` enables the KL loss term when
    ``loss.kl_coef > 0``. Each minibatch's gradient is accumulated over micro-batches of whole
    prompt groups (``optim.micro_batch_positions``), each weighted by its share of the
    aggregation's denominator, so the step equals the one over the whole minibatch.
    """
    lc, oc = cfg.loss, cfg.optim
    shared = critic is not None and critic.critic.shared
    sums: dict[str, float] = {}
    steps = 0
    model.train()
    if critic is not None:
        critic.critic.train()
    for _ in range(oc.ppo_epochs):
        order = torch.randperm(batch.size, generator=generator)
        for rows in order.chunk(oc.minibatches):
            optimizer.zero_grad(set_to_none=True)
            if critic is not None:
                critic.optimizer.zero_grad(set_to_none=True)
            logs: dict[str, float] = {}
            for micro in micro_batches(batch, rows, oc.micro_batch_positions):
                weight = chunk_weight(lc.aggregation, mask[micro], mask[rows])
                part = _micro_step(
                    model, batch, micro, advantages, mask, cfg, ref_logprobs, critic, train_policy, shared,
                    norm=float(mask.shape[1]), weight=weight,
                )
                for k, v in part.items():
                    logs[k] = logs.get(k, 0.0) + weight * v
            if train_policy:
                logs["grad/norm"] = float(torch.nn.utils.clip_grad_norm_(model.parameters(), oc.grad_clip))
                optimizer.step()
            if critic is not None:
                logs["grad/value_norm"] = float(torch.nn.utils.clip_grad_norm_(critic.critic.parameters(), oc.grad_clip))
                critic.optimizer.step()
            for k, v in logs.items():
                sums[k] = sums.get(k, 0.0) + v
            steps += 1
    return {k: v / steps for k, v in sums.items()}


def _micro_step(
    model: PreTrainedModel,
    batch: TrajectoryBatch,
    rows: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    cfg: Config,
    ref_logprobs: torch.Tensor | None,
    critic: CriticTarget | None,
    train_policy: bool,
    shared: bool,
    *,
    norm: float,
    weight: float,
) -> dict[str, float]:
    """Forward and backward of ``weight *`` the losses of ``rows`` (gradients accumulate);
    returns the micro-batch's unweighted metrics."""
    lc = cfg.loss
    mb = batch.select(rows).trimmed()
    width = mb.response_ids.shape[1]
    m = mask[rows][:, :width]

    def agg(x: torch.Tensor) -> torch.Tensor:
        return aggregate(lc.aggregation, x, m, norm=norm)

    logs: dict[str, float] = {}
    loss = torch.zeros(())
    states = None
    if train_policy or shared:
        logits, states = response_forward(model, mb, hidden=shared)  # (b, T, V), (b, T, H)
    if train_policy:
        logp = token_logprobs(logits, mb.response_ids)
        pg, stats = ppo_clip_loss(
            logp, mb.old_logprobs, advantages[rows][:, :width], m,
            clip_eps=lc.clip_eps, clip_eps_high=lc.clip_eps_high, dual_clip=lc.dual_clip,
        )
        loss = agg(pg)
        # logged always, differentiated only when it is in the loss
        entropy = agg(token_entropy(logits if lc.entropy_coef > 0 else logits.detach()))
        if lc.entropy_coef > 0:
            loss = loss - lc.entropy_coef * entropy
        kl = torch.zeros(())
        if ref_logprobs is not None and lc.kl_coef > 0:
            kl = agg(kl_estimate(logp, ref_logprobs[rows][:, :width], lc.kl_estimator))
            loss = loss + lc.kl_coef * kl
        logs.update(
            {
                "loss/policy": float(agg(pg.detach())),
                "kl/ref": float(kl.detach()),
                "policy/entropy": float(entropy.detach()),
                "policy/clipfrac": stats.clipfrac,
                "policy/approx_kl": stats.approx_kl,
            }
        )
    value_loss = None
    if critic is not None:
        if states is not None and not train_policy:
            states = states.detach()
        member = critic.critic.member_values(mb, states)  # (M, b, T)
        returns = critic.returns[rows][:, :width]
        per_head = [
            agg(clipped_value_loss(member[i], critic.old_values[i][rows][:, :width], returns, m, clip_eps=cfg.value.clip_eps))
            for i in range(member.shape[0])
        ]
        value_loss = torch.stack(per_head).mean()
        logs["loss/value"] = float(value_loss.detach())
    if shared and value_loss is not None:
        loss = loss + cfg.value.coef * value_loss
    elif value_loss is not None:
        (weight * value_loss).backward()
    if loss.requires_grad:
        (weight * loss).backward()
    logs["loss/total"] = float(loss.detach()) + (0.0 if shared or value_loss is None else float(value_loss.detach()))
    return logs
