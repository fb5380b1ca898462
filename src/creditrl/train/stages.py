"""The stages of one RL iteration as plain functions: rollout -> score -> credit -> loss.

The trainer (:mod:`creditrl.train.rl`) only wires these together; each can be called on its own.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from creditrl.config import Config
from creditrl.credit import estimate, normalise
from creditrl.losses import aggregate, kl_estimate, ppo_clip_loss
from creditrl.policy.engine import GenerationEngine, SamplingParams
from creditrl.rewards.placement import place
from creditrl.rewards.sources import RewardSource, score_batch
from creditrl.rollout.batch import TrajectoryBatch, batch_from_generation, response_logits, token_entropy, token_logprobs
from creditrl.rollout.segment import SegmentFn, TokenTexts, segment
from creditrl.tasks.base import Problem, Task
from creditrl.train.evaluate import decode_response, encode_prompt


def rollout(
    engine: GenerationEngine,
    tokenizer: PreTrainedTokenizerBase,
    problems: list[Problem],
    group_size: int,
    params: SamplingParams,
    generator: torch.Generator,
) -> TrajectoryBatch:
    """G samples per problem; group id = the problem's index in ``problems``."""
    gen = engine.generate([encode_prompt(tokenizer, p.prompt) for p in problems], group_size, params, generator=generator)
    batch = batch_from_generation(gen, gen.prompt_index, tokenizer.pad_token_id)
    batch.extras["problems"] = [problems[i] for i in gen.prompt_index]
    batch.extras["completions"] = [decode_response(tokenizer, t) for t in gen.tokens]
    return batch


@dataclass
class Scored:
    rewards: torch.Tensor  # float (B, T)
    reward_mask: torch.Tensor  # bool (B, T)
    step_ends: torch.Tensor  # bool (B, T)
    outcome: torch.Tensor  # float (B,), 1.0 where the task's outcome checker accepts the response
    step_correct: torch.Tensor  # float (B,), share of the response's steps the step checker accepts
    keep: torch.Tensor  # bool (B,), False for responses dropped by the reward error policy
    errors: int


def score(
    batch: TrajectoryBatch,
    task: Task,
    source: RewardSource,
    texts_of: TokenTexts,
    segment_fn: SegmentFn | None,
    on_error: str,
) -> Scored:
    """Segment responses into steps, score them with ``source`` and place the scores."""
    seg = segment(batch.response_ids, batch.response_lengths, texts_of, segment_fn or (lambda texts: []))
    problems, completions = batch.extras["problems"], batch.extras["completions"]
    result = score_batch(source, task, problems, completions, seg.texts, on_error=on_error)
    rewards, reward_mask = place(
        source.granularity, result.scores, response_mask=batch.response_mask, step_ends=seg.step_ends
    )
    outcome = torch.tensor([float(task.check_outcome(p, c)) for p, c in zip(problems, completions)])
    if segment_fn is not None:
        labels = [task.check_steps(p, texts) for p, texts in zip(problems, seg.texts)]
        step_correct = torch.tensor([sum(lab) / len(lab) if lab else 0.0 for lab in labels])
    else:
        step_correct = outcome.clone()
    return Scored(
        rewards=rewards,
        reward_mask=reward_mask,
        step_ends=seg.step_ends,
        outcome=outcome,
        step_correct=step_correct,
        keep=torch.tensor(result.keep, dtype=torch.bool),
        errors=result.errors,
    )


def credit(batch: TrajectoryBatch, scored: Scored, cfg: Config) -> tuple[torch.Tensor, torch.Tensor]:
    """Advantages and returns through the estimator registry, then the normaliser."""
    mask = batch.response_mask & scored.keep[:, None]
    adv, ret = estimate(
        cfg.credit.estimator,
        scored.rewards,
        scored.reward_mask,
        mask,
        group_ids=batch.group_ids,
        gamma=cfg.credit.gamma,
        lam=cfg.credit.lam,
    )
    adv = normalise(cfg.credit.normaliser, adv, mask, group_ids=batch.group_ids)
    return adv, ret


def update(
    model: PreTrainedModel,
    ref_model: PreTrainedModel | None,
    optimizer: torch.optim.Optimizer,
    batch: TrajectoryBatch,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    cfg: Config,
    generator: torch.Generator,
) -> dict[str, float]:
    """PPO epochs x minibatches of clipped policy loss (+ KL to the reference, - entropy bonus)."""
    lc, oc = cfg.loss, cfg.optim
    ref_logp = None
    if ref_model is not None and lc.kl_coef > 0:
        with torch.no_grad():
            ref_logp = token_logprobs(response_logits(ref_model, batch), batch.response_ids)
    model.train()
    sums: dict[str, float] = {}
    steps = 0
    for _ in range(oc.ppo_epochs):
        order = torch.randperm(batch.size, generator=generator)
        for rows in order.chunk(oc.minibatches):
            mb = batch.select(rows)
            m = mask[rows]
            logits = response_logits(model, mb)  # (b, T, V)
            logp = token_logprobs(logits, mb.response_ids)
            pg, stats = ppo_clip_loss(
                logp,
                mb.old_logprobs,
                advantages[rows],
                m,
                clip_eps=lc.clip_eps,
                clip_eps_high=lc.clip_eps_high,
                dual_clip=lc.dual_clip,
            )
            loss = aggregate(lc.aggregation, pg, m)
            # logged always, differentiated only when it is in the loss
            entropy_logits = logits if lc.entropy_coef > 0 else logits.detach()
            entropy = aggregate(lc.aggregation, token_entropy(entropy_logits), m)
            if lc.entropy_coef > 0:
                loss = loss - lc.entropy_coef * entropy
            kl = torch.zeros(())
            if ref_logp is not None:
                kl = aggregate(lc.aggregation, kl_estimate(logp, ref_logp[rows], lc.kl_estimator), m)
                loss = loss + lc.kl_coef * kl
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), oc.grad_clip)
            optimizer.step()
            for k, v in (
                ("loss/policy", float(aggregate(lc.aggregation, pg.detach(), m))),
                ("loss/total", float(loss.detach())),
                ("kl/ref", float(kl.detach())),
                ("policy/entropy", float(entropy.detach())),
                ("policy/clipfrac", stats.clipfrac),
                ("policy/approx_kl", stats.approx_kl),
                ("grad/norm", float(grad_norm)),
            ):
                sums[k] = sums.get(k, 0.0) + v
            steps += 1
    return {k: v / steps for k, v in sums.items()}
