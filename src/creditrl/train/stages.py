"""The stages of one RL iteration: rollout -> score -> value -> credit -> update.

The trainer (:mod:`creditrl.train.rl`) only wires these together; each can be called on its own.
``rollout`` and ``credit`` live here; the score stage is :class:`creditrl.rewards.stage.Scorer`,
the value stage :class:`creditrl.values.stage.ValueStage`, the update :func:`creditrl.train.update.update`.
"""

from __future__ import annotations

import torch
from transformers import PreTrainedTokenizerBase

from creditrl.credit import credit_lengths, estimate_at, length_adaptive_lam, normalise, outcome_advantage
from creditrl.credit.estimators import EPS
from creditrl.distributed import ddp
from creditrl.policy.device import inference, module_device
from creditrl.policy.engines import GenerationEngine, SamplingParams
from creditrl.policy.tokenizer import decode_response, encode_problem
from creditrl.rewards.stage import Scored, Scorer, ScoreSettings
from creditrl.rollout.batch import TrajectoryBatch, batch_from_generation, chunked_response_logprobs
from creditrl.tasks.base import Problem
from creditrl.train.build import RunParts
from creditrl.train.plan import CreditSettings
from creditrl.train.update import CriticTarget, update
from creditrl.values.stage import ValueOut
from creditrl.values.tree import TreeShape, tree_rollout
from creditrl.values.tree import generated_tokens as tree_generated_tokens

__all__ = [
    "rollout",
    "reference_logprobs",
    "generated_tokens",
    "credit",
    "learn",
    "Scored",
    "Scorer",
    "ScoreSettings",
    "CriticTarget",
    "update",
]


def rollout(
    engine: GenerationEngine,
    tokenizer: PreTrainedTokenizerBase,
    problems: list[Problem],
    group_size: int,
    params: SamplingParams,
    generator: torch.Generator,
    *,
    tree: TreeShape | None = None,
    stop_ids: tuple[int, ...] = (),
) -> TrajectoryBatch:
    """G samples per problem; group id = the problem's index in ``problems``.

    With ``tree`` the group is instead the leaves of one tree per problem that branches at step
    ends (``stop_ids``), see :mod:`creditrl.values.tree`; the rows then carry their node paths
    and segment ends in ``extras["tree_paths"]`` / ``extras["tree_segment_ends"]``.
    """
    prompts = [encode_problem(tokenizer, p) for p in problems]
    extras = {}
    if tree is None:
        gen = engine.generate(prompts, group_size, params, generator=generator)
    else:
        out = tree_rollout(engine, prompts, tree, params, stop_ids, generator)
        gen = out.generation
        extras = {"tree_paths": out.paths, "tree_segment_ends": out.segment_ends}
    batch = batch_from_generation(gen, gen.prompt_index, tokenizer.pad_token_id)
    batch.extras["problems"] = [problems[i] for i in gen.prompt_index]
    batch.extras["completions"] = [decode_response(tokenizer, t) for t in gen.tokens]
    batch.extras.update(extras)
    return batch


def reference_logprobs(
    reference: torch.nn.Module | None,
    batch: TrajectoryBatch,
    precision: str,
    *,
    packed: bool = True,
    max_positions: int = 0,
) -> torch.Tensor | None:
    """The frozen reference policy's log-probs of the response tokens, float (B, T) on the CPU like
    the batch, 0 at padding (None without a reference: no KL term); ``packed``:
    ``policy.forward=auto``; computed in chunks of at most ``max_positions`` padded positions
    (``optim.inference_positions``; 0 = one pass)."""
    if reference is None:
        return None
    with inference(module_device(reference), precision):
        return chunked_response_logprobs(reference, batch, max_positions, packed=packed)


def generated_tokens(batch: TrajectoryBatch) -> int:
    """Tokens sampled for ``batch``: its response tokens, or for a tree each shared segment once."""
    if "tree_paths" in batch.extras:
        return tree_generated_tokens(batch.extras["tree_paths"], batch.extras["tree_segment_ends"])
    return int(batch.response_lengths.sum())


def credit(
    batch: TrajectoryBatch,
    scored: Scored,
    settings: CreditSettings,
    *,
    values: torch.Tensor | None = None,
    lam: float | None = None,
    step_ends: torch.Tensor | None = None,
    lam_critic: float | None = None,
    lam_alpha: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Advantages and returns (B, T) through the estimator registry
    (:func:`creditrl.credit.estimate_at`), then the normaliser.

    Only the kept responses enter (``scored.keep``): a dropped response neither receives credit nor
    counts in its group's statistics. ``settings``: the run's ``credit.*``. ``lam``, ``lam_critic``
    and ``lam_alpha`` (None: the settings') override ``credit.lam`` (the lambda schedule),
    ``credit.lam_critic`` and ``credit.lam_alpha`` (value pretraining asks for Monte-Carlo returns);
    ``credit.outcome_coef`` adds the outcome's own leave-one-out advantage before the normaliser
    (:mod:`creditrl.credit.outcome`); ``step_ends`` (B, T) overrides the scored step ends as the
    time steps (a tree's segments). Under a data-parallel launch the ``batch`` normaliser whitens
    over every rank's kept rows (:func:`creditrl.distributed.ddp.batch_whitening`).
    """
    rows = scored.keep.nonzero().squeeze(-1)
    adv = torch.zeros(batch.response_mask.shape)
    ret = torch.zeros(batch.response_mask.shape)
    c = settings
    global_batch = c.normaliser == "batch" and ddp.world_size() > 1
    if rows.numel() == 0:
        if global_batch:  # the collective runs on every rank, also one without kept rows
            ddp.batch_whitening(adv[:0], batch.response_mask[:0], EPS)
        return adv, ret
    mask = batch.response_mask[rows]
    a, r = estimate_at(
        c.resolution,
        c.estimator,
        scored.rewards[rows],
        scored.reward_mask[rows],
        mask,
        step_ends=(scored.step_ends if step_ends is None else step_ends)[rows],
        group_ids=batch.group_ids[rows],
        values=None if values is None else values[rows],
        gamma=c.gamma,
        lam=c.lam if lam is None else lam,
        lam_alpha=c.lam_alpha if lam_alpha is None else lam_alpha,
        lam_critic=c.lam_critic if lam_critic is None else lam_critic,
    )
    if c.outcome_coef:  # the verifiable outcome as a channel of its own (creditrl.credit.outcome)
        outcome = scored.outcome[rows].to(a.dtype)  # (kept B,)
        a = a + c.outcome_coef * outcome_advantage(outcome, mask, batch.group_ids[rows])
    if global_batch:
        adv[rows] = ddp.batch_whitening(a, mask, EPS)
    else:
        adv[rows] = normalise(c.normaliser, a, mask, group_ids=batch.group_ids[rows])
    ret[rows] = r
    return adv, ret


def policy_lam_mean(
    batch: TrajectoryBatch, scored: Scored, settings: CreditSettings, step_ends: torch.Tensor | None = None
) -> float:
    """The mean over the kept responses of the advantages' lambda under ``credit.lam_alpha`` (VAPO's
    per-response ``clamp(1 - 1/(alpha l), 0, 1)``, l in credit time steps); ``step_ends`` as in
    :func:`credit`. Logged as ``credit/lam_policy_mean``."""
    rows = scored.keep
    if not bool(rows.any()):
        return 0.0
    ends = (scored.step_ends if step_ends is None else step_ends)[rows]
    lengths = credit_lengths(settings.resolution, batch.response_mask[rows], ends)
    return float(length_adaptive_lam(lengths, settings.lam_alpha).mean())


def learn(
    parts: RunParts,
    batch: TrajectoryBatch,
    scored: Scored,
    advantages: torch.Tensor,
    returns: torch.Tensor,
    values: ValueOut,
    ref_logprobs: torch.Tensor | None,
    generator: torch.Generator,
    *,
    train_policy: bool,
) -> dict[str, float]:
    """The update stage: the policy (and a learned critic, toward ``returns``) step on the kept
    responses; then the copies that generate follow (FSDP's gathered weights, the Ray workers).
    Returns the update's metrics."""
    mask = batch.response_mask & scored.keep[:, None]
    policy, critic_module = parts.learners.get(parts.model, parts.value_stage.critic)
    critic = None
    if critic_module is not None:
        critic = CriticTarget(critic_module, parts.value_stage.optimizer, returns, values.member_values)
    out = update(
        policy,
        parts.optimizer,
        batch,
        advantages,
        mask,
        parts.plan.update,
        generator,
        ref_logprobs=ref_logprobs,
        critic=critic,
        train_policy=train_policy,
        scaler=parts.scaler,
    )
    if parts.learners.sharded:  # every rank gathers the updated shards into its generation copy
        parts.model.load_state_dict(ddp.full_state_dict(policy))
    if parts.plan.ray:  # broadcast the new weights to the rollout workers
        parts.engine.sync(parts.model)
    return out
