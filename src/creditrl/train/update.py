"""The update stage: PPO epochs x minibatches of policy loss, KL, entropy and critic loss.

Per minibatch, with token-level importance ratios against the sampling policy::

    loss = agg(ppo_clip(A)) + kl_coef * agg(KL(pi || pi_ref)) - entropy_coef * agg(H)
           [+ value.coef * mean_m agg(clipped_value_loss(V_m, returns))   shared critic]

A separate critic takes its own optimizer step on its value loss in the same minibatch. During
the critic warm-up (``train_policy=False``) only the critic learns, and a shared critic's heads
read detached policy states so that the policy does not move.

Data-parallel (:mod:`creditrl.distributed.ddp`): ``model`` and ``critic.critic`` may be DDP
wrappers, each rank holding its own rows. Each minibatch's aggregation denominator is summed over
the ranks, the padded length of ``seq-mean-token-sum-norm`` is the largest over the ranks, and each
rank's loss is scaled by the world size W, so DDP's *average* of the ranks' gradients is exactly
the single-process gradient over the union of their rows (only the last micro-batch all-reduces).
With ``minibatches = k`` the i-th optimizer step uses the union of the ranks' i-th parts of their
own rows. FSDP2 learners (``ddp.wrap(..., strategy="fsdp")``) also run equal numbers of
micro-batch passes (zero-weight padding passes), since FSDP all-gathers in every forward.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
from transformers import PreTrainedModel

from creditrl.config import Config, LossConfig
from creditrl.distributed import ddp
from creditrl.losses import aggregate, aggregation_count, clipped_value_loss, kl_estimate, ppo_clip_loss
from creditrl.policy.device import autocast, inference, module_device
from creditrl.rollout.batch import (
    TrajectoryBatch,
    chunked_response_logprobs,
    micro_batches,
    response_forward,
    token_entropy,
    token_logprobs,
)
from creditrl.train.optim import backward, clip_and_step
from creditrl.train.plan import UpdateSettings
from creditrl.values.critic import Critic


@dataclass
class CriticTarget:
    """What the critic learns this iteration."""

    critic: Critic  # or its DDP wrapper (creditrl.distributed.ddp.wrap)
    optimizer: torch.optim.Optimizer
    returns: torch.Tensor  # float (B, T), the estimator's returns (A + V for GAE)
    old_values: torch.Tensor  # float (M, B, T), each head's values at the value stage


# the token positions the update's passes forwarded and backpropagated (prompt and response, every
# PPO epoch and minibatch; a separate critic runs on the same positions): a cost no machine changes
POSITIONS = "update/positions"


def update(
    model: PreTrainedModel,
    optimizer: torch.optim.Optimizer,
    batch: TrajectoryBatch,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    settings: UpdateSettings | Config,
    generator: torch.Generator,
    *,
    ref_logprobs: torch.Tensor | None = None,
    critic: CriticTarget | None = None,
    train_policy: bool = True,
    scaler: torch.amp.GradScaler | None = None,
) -> dict[str, float]:
    """Run the update; returns the metrics averaged over minibatches (under a data-parallel launch,
    those of the union of the ranks' rows, the same on every rank).

    ``settings``: :class:`~creditrl.train.plan.UpdateSettings`, or a resolved config to take them
    from. advantages, mask, ref_logprobs: (B, T), on any device (they move to the policy's);
    ``ref_logprobs`` enables the KL loss term when ``loss.kl_coef > 0``. Each minibatch's gradient
    is accumulated over micro-batches of whole prompt groups (``optim.micro_batch_positions``), each
    weighted by its share of the aggregation's denominator, so the step equals the one over the
    whole minibatch. Forward passes run under ``policy.precision`` autocast; ``scaler`` (fp16)
    scales the losses and steps the optimizers. With ``loss.recompute_logprobs`` the old log-probs
    come from this model's own forward, not from the sampler.
    """
    if isinstance(settings, Config):
        settings = UpdateSettings.of(settings)
    device = module_device(ddp.unwrap(model))
    batch, advantages, mask = batch.to(device), advantages.to(device), mask.to(device)
    ref_logprobs = None if ref_logprobs is None else ref_logprobs.to(device)
    if critic is not None:
        critic = replace(critic, returns=critic.returns.to(device), old_values=critic.old_values.to(device))
    batch, gap = _old_logprobs(ddp.unwrap(model), batch, settings)
    # the largest padded length and row count over the ranks (the smallest, negated)
    width, most, fewest = ddp.all_reduce_max([float(mask.shape[1]), float(batch.size), -float(batch.size)])
    if most != -fewest:
        raise ValueError(
            f"data-parallel update: ranks hold {int(-fewest)} to {int(most)} rows; every rank must hold "
            "the same number (whole prompt groups of equal size)"
        )
    step = _Update(
        model, optimizer, batch, advantages, mask, settings, ref_logprobs, critic, train_policy, scaler, width
    )
    sums: dict[str, float] = {}
    steps = 0
    model.train()
    if critic is not None:
        critic.critic.train()
    for _ in range(settings.optim.ppo_epochs):
        order = torch.randperm(batch.size, generator=generator)
        for rows in order.chunk(settings.optim.minibatches):
            for k, v in step.minibatch(rows).items():
                sums[k] = sums.get(k, 0.0) + v
            steps += 1
    out = {k: v / steps for k, v in sums.items()}
    out[POSITIONS] = sums.get(POSITIONS, 0.0)  # a count: the update's total, not a mean over its steps
    if gap is not None:
        out["policy/sampler_logprob_gap"] = gap
    if ddp.world_size() > 1:  # each rank's weighted sums add up to W times the global metric
        keys = sorted(out)
        out = dict(zip(keys, ddp.all_reduce_mean([out[k] for k in keys])))
        out[POSITIONS] *= ddp.world_size()  # every rank's passes
    return out


@dataclass
class _Update:
    """One update's fixed inputs; :meth:`minibatch` takes one optimizer step on a set of rows."""

    model: PreTrainedModel
    optimizer: torch.optim.Optimizer
    batch: TrajectoryBatch
    advantages: torch.Tensor
    mask: torch.Tensor
    settings: UpdateSettings
    ref_logprobs: torch.Tensor | None
    critic: CriticTarget | None
    train_policy: bool
    scaler: torch.amp.GradScaler | None
    width: float  # the largest padded length over the ranks (seq-mean-token-sum-norm)

    def __post_init__(self) -> None:
        self.skippable = self._zero_advantage_rows()  # bool (B,) or None
        self.shared = self.critic is not None and self.critic.critic.shared

    @property
    def learners(self) -> list[torch.nn.Module]:
        return ([self.model] if self.train_policy else []) + ([self.critic.critic] if self.critic is not None else [])

    def minibatch(self, rows: torch.Tensor) -> dict[str, float]:
        """Accumulate the gradient of ``rows`` over micro-batches, clip and step; the step's metrics."""
        agg, oc, critic, scaler = self.settings.loss.aggregation, self.settings.optim, self.critic, self.scaler
        self.optimizer.zero_grad(set_to_none=True)
        if critic is not None:
            critic.optimizer.zero_grad(set_to_none=True)
        logs: dict[str, float] = {}
        total = ddp.all_reduce_sum(aggregation_count(agg, self.mask[rows]))  # over every rank's rows
        trained = rows if self.skippable is None else rows[~self.skippable[rows]]
        if self.skippable is not None:
            logs["update/skipped_rows"] = 1.0 - len(trained) / max(1, len(rows))
        empty = len(trained) == 0
        if empty:  # a zero-weight pass over one row keeps the step a zero-gradient step
            trained = rows[:1]
        self._accumulate(trained, total, empty, logs)
        if self.skippable is not None:  # the diagnostics describe the trained rows (the loss sums are exact)
            share = ddp.all_reduce_sum(aggregation_count(agg, self.mask[trained]) if not empty else 0.0)
            for k in ("policy/entropy", "policy/clipfrac", "policy/approx_kl", "kl/ref"):
                logs[k] = logs[k] * total / share if share > 0 else 0.0
        if self.train_policy:
            logs["grad/norm"] = clip_and_step(self.model, self.optimizer, oc.grad_clip, scaler)
        if critic is not None:
            logs["grad/value_norm"] = clip_and_step(critic.critic, critic.optimizer, oc.grad_clip, scaler)
        if scaler is not None:
            logs["optim/loss_scale"] = float(scaler.get_scale())
            scaler.update()
        return logs

    def _accumulate(self, trained: torch.Tensor, total: float, empty: bool, logs: dict[str, float]) -> None:
        """Backward of every micro-batch of ``trained``, each weighted by its share of ``total``."""
        agg, learners = self.settings.loss.aggregation, self.learners
        micros = micro_batches(self.batch, trained, self.settings.optim.micro_batch_positions)
        n = len(micros)
        if any(ddp.is_fsdp(m) for m in learners):  # FSDP all-gathers in every forward: equal pass counts
            n = int(ddp.all_reduce_max(float(n)))
        for i in range(n):
            micro = micros[min(i, len(micros) - 1)]  # past its own micro-batches: a zero-weight pass
            count = aggregation_count(agg, self.mask[micro]) if i < len(micros) and not empty else 0.0
            weight = ddp.world_size() * count / max(1.0, total)
            with ddp.no_sync(learners, enabled=i < n - 1):  # only the last one all-reduces
                part = self._micro_step(micro, weight)
            for k, v in part.items():
                logs[k] = logs.get(k, 0.0) + weight * v
            # what the pass forwarded and backpropagated: each row's real prompt and generated tokens
            positions = self.batch.prompt_mask[micro].sum() + self.batch.response_lengths[micro].sum()
            logs[POSITIONS] = logs.get(POSITIONS, 0.0) + float(positions)

    def _zero_advantage_rows(self) -> torch.Tensor | None:
        """Rows (B,) whose every response token has advantage 0, when leaving them out of the update
        is exact (``optim.skip_zero_advantage``); else None.

        The clipped policy loss of a token with A = 0 is 0 for every ratio, so with no KL term, no
        entropy bonus and no critic loss such a row adds nothing to the gradient; it still counts in
        the aggregation's denominator (computed over all rows), so the step is unchanged. In GRPO
        with 0/1 rewards every group whose samples all failed (or all succeeded) is such a row set.
        With a KL term skipping is no longer exact; ``optim.skip_zero_advantage_kl`` skips anyway,
        as a stated approximation.
        """
        lc, oc = self.settings.loss, self.settings.optim
        kl_on = self.ref_logprobs is not None and lc.kl_coef > 0
        allowed = (
            oc.skip_zero_advantage
            and self.train_policy
            and self.critic is None
            and lc.entropy_coef == 0
            and (not kl_on or oc.skip_zero_advantage_kl)
        )
        if not allowed:
            return None
        return (((self.advantages != 0) & self.mask).sum(-1) == 0).cpu()

    def _micro_step(self, rows: torch.Tensor, weight: float) -> dict[str, float]:
        """Forward (under ``policy.precision`` autocast) and backward of ``weight *`` the losses of
        ``rows`` (gradients accumulate); returns the micro-batch's unweighted metrics."""
        settings, critic, shared, train_policy = self.settings, self.critic, self.shared, self.train_policy
        mb = self.batch.select(rows).trimmed()
        with autocast(mb.response_ids.device, settings.precision):  # the backward runs outside it
            lc = settings.loss
            width = mb.response_ids.shape[1]
            m = self.mask[rows][:, :width]

            def agg(x: torch.Tensor) -> torch.Tensor:
                return aggregate(lc.aggregation, x, m, norm=self.width)

            logs: dict[str, float] = {}
            loss = torch.zeros((), device=m.device)
            states = None
            if train_policy:  # (b, T, V), (b, T, H)
                logits, states = response_forward(self.model, mb, hidden=shared, packed=settings.packed)
            elif shared:  # critic warm-up: the heads read the policy's states, the policy is not trained
                with torch.no_grad():
                    logits, states = response_forward(ddp.unwrap(self.model), mb, hidden=True)
            if train_policy:
                ref = None if self.ref_logprobs is None else self.ref_logprobs[rows][:, :width]
                loss, policy_logs = _policy_loss(logits, mb, self.advantages[rows][:, :width], ref, m, lc, agg)
                logs.update(policy_logs)
            value_loss = None
            if critic is not None:
                if states is not None and not train_policy:
                    states = states.detach()
                value_loss = _value_loss(critic, mb, states, rows, m, agg, settings.value_clip_eps)
                logs["loss/value"] = float(value_loss.detach())
            if shared and value_loss is not None:
                loss = loss + settings.value_coef * value_loss
        if not shared and value_loss is not None:
            backward(weight * value_loss, self.scaler)
        if loss.requires_grad:
            backward(weight * loss, self.scaler)
        logs["loss/total"] = float(loss.detach()) + (
            0.0 if shared or value_loss is None else float(value_loss.detach())
        )
        return logs


def _policy_loss(
    logits: torch.Tensor,
    mb: TrajectoryBatch,
    advantages: torch.Tensor,
    ref_logprobs: torch.Tensor | None,
    mask: torch.Tensor,
    lc: LossConfig,
    agg: Callable[[torch.Tensor], torch.Tensor],
) -> tuple[torch.Tensor, dict[str, float]]:
    """``agg(ppo_clip) - entropy_coef * agg(H) + kl_coef * agg(KL)`` of one micro-batch (b, T), and
    its metrics (the entropy is logged always, differentiated only when it is in the loss)."""
    logp = token_logprobs(logits, mb.response_ids)
    pg, stats = ppo_clip_loss(
        logp,
        mb.old_logprobs,
        advantages,
        mask,
        clip_eps=lc.clip_eps,
        clip_eps_high=lc.clip_eps_high,
        dual_clip=lc.dual_clip,
    )
    loss = agg(pg)
    entropy = agg(token_entropy(logits if lc.entropy_coef > 0 else logits.detach()))
    if lc.entropy_coef > 0:
        loss = loss - lc.entropy_coef * entropy
    kl = torch.zeros((), device=mask.device)
    if ref_logprobs is not None and lc.kl_coef > 0:
        kl = agg(kl_estimate(logp, ref_logprobs, lc.kl_estimator))
        loss = loss + lc.kl_coef * kl
    return loss, {
        "loss/policy": float(agg(pg.detach())),
        "kl/ref": float(kl.detach()),
        "policy/entropy": float(entropy.detach()),
        "policy/clipfrac": stats.clipfrac,
        "policy/approx_kl": stats.approx_kl,
    }


def _value_loss(
    critic: CriticTarget,
    mb: TrajectoryBatch,
    states: torch.Tensor | None,
    rows: torch.Tensor,
    mask: torch.Tensor,
    agg: Callable[[torch.Tensor], torch.Tensor],
    clip_eps: float | None,
) -> torch.Tensor:
    """The mean over the critic's heads of their aggregated clipped value losses on one micro-batch."""
    width = mask.shape[1]
    member = critic.critic(mb, states)  # (M, b, T): member_values, through DDP's forward
    returns = critic.returns[rows][:, :width]
    per_head = [
        agg(clipped_value_loss(member[i], critic.old_values[i][rows][:, :width], returns, mask, clip_eps=clip_eps))
        for i in range(member.shape[0])
    ]
    return torch.stack(per_head).mean()


def _old_logprobs(
    model: PreTrainedModel, batch: TrajectoryBatch, settings: UpdateSettings
) -> tuple[TrajectoryBatch, float | None]:
    """The batch with old log-probs recomputed by ``model`` (no gradient, under autocast, in
    chunks of ``optim.inference_positions``) when ``loss.recompute_logprobs`` asks for it, and the mean
    absolute gap to the sampler's over the response tokens; else ``(batch, None)``."""
    mode = settings.loss.recompute_logprobs
    if mode == "never" or (mode == "auto" and settings.precision == "fp32"):
        return batch, None
    was_training = model.training
    model.eval()
    with inference(batch.response_ids.device, settings.precision):
        fresh = chunked_response_logprobs(model, batch, settings.optim.inference_positions, packed=settings.packed)
    model.train(was_training)
    valid = batch.response_mask
    gap = float((fresh - batch.old_logprobs).abs()[valid].mean()) if bool(valid.any()) else 0.0
    return replace(batch, old_logprobs=fresh), gap
