"""The score stage: outcome, [hybrid filter], reward sources placed by granularity, [mix], shaping.

It reads a resolved config (:mod:`creditrl.train.resolve`): the granularities and the step
separator are the ones the run resolved.

    outcome checker ─► filter (hybrid) ─► source at its granularity ─┐
                                       └► dense source (hybrid) ─────┴► mix (schedule x calibration)
                                                                        ─► shaping ─► Scored

Every piece is a function of :mod:`creditrl.rewards`; :class:`Scorer` only holds what is fixed
for a run (sources, segmenters, the calibrator's running state) and wires them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers import PreTrainedTokenizerBase

from creditrl.config import Config
from creditrl.rewards.hybrid import Calibrator, apply_filter, dense_verdict, mix_rewards, mix_weights
from creditrl.rewards.placement import get_granularity, make_segmenter, place
from creditrl.rewards.shaping import add_shaping, kl_penalty, length_penalty, overlong_penalty
from creditrl.rewards.sources import RewardSource, make_source, score_batch
from creditrl.rollout.batch import TrajectoryBatch
from creditrl.rollout.segment import Segmentation, SegmentFn, TokenTexts, segment
from creditrl.tasks.base import Task


@dataclass
class Scored:
    rewards: torch.Tensor  # float (B, T), placed rewards plus shaping
    reward_mask: torch.Tensor  # bool (B, T)
    step_ends: torch.Tensor  # bool (B, T), the task's reasoning steps (all False when it has none)
    outcome: torch.Tensor  # float (B,), 1.0 where the task's outcome checker accepts the response
    step_correct: torch.Tensor  # float (B,), share of the response's steps the step checker accepts
    keep: torch.Tensor  # bool (B,), False for responses dropped by the error policy or the filter
    errors: int  # responses whose reward source failed (see reward.on_error)
    filtered: int = 0  # responses the hybrid filter dropped
    stats: dict[str, float] = field(default_factory=dict)  # mix weights, calibration


class _Placed:
    """One reward source at one granularity: segment, score the kept rows, place."""

    def __init__(self, source: RewardSource, granularity: str, segmenter: SegmentFn) -> None:
        self.source, self.granularity, self.segmenter = source, granularity, segmenter
        # with score_batch's signature; the Ray backend swaps in one that scores on its workers
        self.score_fn = score_batch

    def __call__(
        self,
        batch: TrajectoryBatch,
        task: Task,
        texts_of: TokenTexts,
        keep: list[bool],
        on_error: str,
        outcome: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, list[bool], int, Segmentation]:
        seg = segment(batch.response_ids, batch.response_lengths, texts_of, self.segmenter)
        problems, completions = batch.extras["problems"], batch.extras["completions"]
        rows = [i for i, k in enumerate(keep) if k]
        result = self.score_fn(
            self.source,
            task,
            [problems[i] for i in rows],
            [completions[i] for i in rows],
            [seg.texts[i] for i in rows],
            granularity=self.granularity,
            on_error=on_error,
        )
        scores: list[list[float | None]] = [[None] * len(t) for t in seg.texts]  # dropped rows: nothing placed
        ok = list(keep)
        for i, s, k in zip(rows, result.scores, result.keep):
            scores[i], ok[i] = s, k
        fallback = outcome.tolist() if get_granularity(self.granularity).uses_fallback else None
        rewards, reward_mask = place(
            scores, end_mask=seg.end_mask, response_mask=batch.response_mask, fallback=fallback
        )
        return rewards, reward_mask, ok, result.errors, seg


class Scorer:
    """The score stage of a run; call it once per iteration."""

    def __init__(self, cfg: Config, task: Task, tokenizer: PreTrainedTokenizerBase) -> None:
        self.cfg, self.task = cfg, task
        self.texts_of = TokenTexts(tokenizer)
        rc = cfg.reward
        separator = rc.step_separator

        def segmenter(granularity: str) -> SegmentFn:
            return make_segmenter(
                granularity,
                step_separator=separator,
                cut_fn=rc.cut_fn,
                segment_tokens=rc.segment_tokens,
                key_after=rc.key_after,
                key_fn=rc.key_fn,
            )

        def placed(source: str, granularity: str) -> _Placed:
            return _Placed(
                make_source(source, {"prm": rc.prm, "device": cfg.policy.device}), granularity, segmenter(granularity)
            )

        self.primary = placed(rc.source, rc.granularity)
        h = cfg.hybrid
        self.dense = placed(h.dense_source, h.dense_granularity) if h.dense_source else None
        self.steps = segmenter("step") if separator or rc.cut_fn else None
        self.calibrator = Calibrator(momentum=h.calibration_momentum) if h.calibrate else None

    def __call__(
        self,
        batch: TrajectoryBatch,
        *,
        progress: float,
        generator: torch.Generator,
        ref_logprobs: torch.Tensor | None = None,
    ) -> Scored:
        """Score one batch at training ``progress`` in [0, 1]; ``ref_logprobs`` (B, T) feed the
        KL-in-reward shaping term (required when ``shaping.kl_coef > 0``)."""
        cfg, task, h = self.cfg, self.task, self.cfg.hybrid
        problems, completions = batch.extras["problems"], batch.extras["completions"]
        outcome = torch.tensor([float(task.check_outcome(p, c)) for p, c in zip(problems, completions)])
        passed = apply_filter(
            h.filter, outcome, batch.group_ids, q=h.filter_q, lo=h.filter_lo, hi=h.filter_hi, generator=generator
        )
        keep = passed.tolist()
        rewards, reward_mask, keep, errors, primary_seg = self.primary(
            batch, task, self.texts_of, keep, cfg.reward.on_error, outcome
        )
        stats: dict[str, float] = {}
        if self.dense is not None:
            d_rewards, d_mask, keep, d_errors, _ = self.dense(
                batch, task, self.texts_of, keep, cfg.reward.on_error, outcome
            )
            errors += d_errors
            w_seq, w_dense = mix_weights(h.schedule, progress, switch_at=h.switch_at, weight=h.dense_weight)
            if self.calibrator is not None:
                verdict, valid = dense_verdict(d_rewards, d_mask, batch.response_mask)
                kept = torch.tensor(keep, dtype=torch.bool)
                stats["hybrid/agreement"] = self.calibrator.update(verdict, outcome > 0.5, valid & kept)
                w_dense *= self.calibrator.weight
            rewards, reward_mask = mix_rewards(rewards, reward_mask, d_rewards, d_mask, w_seq, w_dense)
            stats.update({"hybrid/w_seq": w_seq, "hybrid/w_dense": w_dense})
        terms = self._shaping(batch, ref_logprobs)
        if terms:
            rewards, reward_mask = add_shaping(rewards, reward_mask, terms)
        step_ends, step_correct = self._steps(batch, primary_seg, outcome)
        keep_t = torch.tensor(keep, dtype=torch.bool)
        rewards = torch.where(keep_t[:, None], rewards, 0.0)
        reward_mask = reward_mask & keep_t[:, None]
        return Scored(
            rewards=rewards,
            reward_mask=reward_mask,
            step_ends=step_ends,
            outcome=outcome,
            step_correct=step_correct,
            keep=keep_t,
            errors=errors,
            filtered=int((~passed).sum()),
            stats=stats,
        )

    def _shaping(self, batch: TrajectoryBatch, ref_logprobs: torch.Tensor | None) -> list:
        """The shaping terms (``shaping.*``) to add onto the placed rewards, each (rewards, mask) (B, T)."""
        sh, terms = self.cfg.shaping, []
        if sh.length_coef > 0:
            terms.append(length_penalty(batch.response_mask, budget=sh.length_budget, coef=sh.length_coef))
        if sh.overlong_cache > 0:
            max_len = self.cfg.rollout.max_new_tokens
            terms.append(
                overlong_penalty(batch.response_mask, max_len=max_len, cache=sh.overlong_cache, coef=sh.overlong_coef)
            )
        if sh.kl_coef > 0:
            if ref_logprobs is None:
                raise ValueError("shaping.kl_coef > 0 needs the reference policy's log-probs (ref_logprobs)")
            terms.append(
                kl_penalty(
                    batch.old_logprobs, ref_logprobs, batch.response_mask, beta=sh.kl_coef, estimator=sh.kl_estimator
                )
            )
        return terms

    def _steps(
        self, batch: TrajectoryBatch, primary_seg: Segmentation, outcome: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The task's step ends (B, T) and each response's share of steps the step checker accepts
        (B,); without steps, no ends and the outcome."""
        if self.steps is None:
            return torch.zeros_like(batch.response_mask), outcome.clone()
        # the primary source's spans are the steps when it scores at step granularity: reuse them
        seg = (
            primary_seg
            if self.primary.granularity == "step"
            else segment(batch.response_ids, batch.response_lengths, self.texts_of, self.steps)
        )
        labels = [self.task.check_steps(p, texts) for p, texts in zip(batch.extras["problems"], seg.texts)]
        step_correct = torch.tensor([sum(lab) / len(lab) if lab else 0.0 for lab in labels])
        return seg.end_mask & batch.response_mask, step_correct
