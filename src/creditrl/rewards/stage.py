"""The score stage: outcome, [hybrid filter], reward sources placed by granularity, [mix], shaping.

It reads :class:`ScoreSettings`, taken from a resolved config (:mod:`creditrl.train.resolve`)
once: the granularities and the step separator are the ones the run resolved.

    outcome checker ─► filter (hybrid) ─► source at its granularity ─┐
                                       └► dense source (hybrid) ─────┴► mix (schedule x calibration)
                                                                        ─► shaping ─► Scored

Every piece is a function of :mod:`creditrl.rewards`; :class:`Scorer` only holds what is fixed
for a run (sources, segmenters, the calibrator's running state) and wires them.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from creditrl.config import Config, HybridConfig, RewardConfig, ShapingConfig
from creditrl.rewards.hybrid import Calibrator, apply_filter, dense_verdict, mix_rewards, mix_weights
from creditrl.rewards.placement import get_granularity, make_segmenter, place
from creditrl.rewards.shaping import add_shaping, kl_penalty, length_penalty, overlong_penalty
from creditrl.rewards.sources import RewardSource, ScoreResult, get_source, make_source, score_batch
from creditrl.rollout.batch import TrajectoryBatch
from creditrl.rollout.segment import Segmentation, SegmentFn, TokenTexts, segment
from creditrl.tasks.base import Problem, Task
from creditrl.tasks.bounded import BoundedCalls, CallCounts, covered, finite_number, shorten, step_labels


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
    counts: CallCounts = field(default_factory=CallCounts)  # failed user-function calls, per function


@dataclass(frozen=True)
class ScoreSettings:
    """What the score stage reads of a resolved config: the ``reward``, ``hybrid`` and ``shaping``
    sections, the options a model-backed source is built with, and ``rollout.max_new_tokens``
    (the overlong penalty's limit)."""

    reward: RewardConfig
    hybrid: HybridConfig
    shaping: ShapingConfig
    source_options: dict[str, Any]  # make_source's options: the PRM, its format, device, start policy, seed
    max_new_tokens: int

    @classmethod
    def of(cls, cfg: Config) -> ScoreSettings:
        rc = cfg.reward
        options = {"prm": rc.prm, "prm_format": cfg.prm.format, "device": cfg.policy.device, "init": cfg.train.init}
        options |= {k: getattr(rc, k) for k in ("implicit_beta", "implicit_lr", "implicit_steps", "implicit_center")}
        options["init_seed"] = cfg.policy.init_seed
        return cls(rc, cfg.hybrid, cfg.shaping, options, cfg.rollout.max_new_tokens)


class _Placed:
    """One reward source at one granularity: segment, score the kept rows, place."""

    def __init__(self, source: RewardSource, granularity: str, segmenter: SegmentFn, calls: BoundedCalls) -> None:
        self.source, self.granularity, self.segmenter, self.calls = source, granularity, segmenter, calls
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
    ) -> tuple[torch.Tensor, torch.Tensor, list[bool], ScoreResult, Segmentation]:
        seg = segment(batch.response_ids, batch.response_lengths, texts_of, self.segmenter)
        problems, completions = batch.extras["problems"], batch.extras["completions"]
        rows = [i for i, k in enumerate(keep) if k]
        # a source's fn runs in a bounded worker, except a model-backed one (batch_fn): its fn, the
        # fallback when batch_fn fails, runs here (see creditrl.tasks.bounded)
        plain = self.score_fn is score_batch and self.source.batch_fn is None and self.source.ids_fn is None
        bounded = {"run": functools.partial(self.calls.map, self.source.name)} if plain else {}
        source = self.source
        if source.user_fn is not None and self.score_fn is score_batch:  # TRL's completion_ids
            sampled = token_rows(batch)[1]
            bounded["completion_ids"] = [sampled[i] for i in rows]
        if source.ids_fn is not None:  # the sampled ids, not a re-tokenization of the span texts
            prompts, responses = token_rows(batch)
            span_ids = [
                [responses[i][s : e + 1] for s, e in zip([0, *[e + 1 for e in seg.ends[i]]], seg.ends[i])] for i in rows
            ]
            ids_fn = source.ids_fn
            source = dataclasses.replace(source, batch_fn=lambda *_: ids_fn([prompts[i] for i in rows], span_ids))
        result = self.score_fn(
            source,
            task,
            [problems[i] for i in rows],
            [completions[i] for i in rows],
            [seg.texts[i] for i in rows],
            granularity=self.granularity,
            on_error=on_error,
            **bounded,
        )
        scores: list[list[float | None]] = [[None] * len(t) for t in seg.texts]  # dropped rows: nothing placed
        ok = list(keep)
        for i, s, k in zip(rows, result.scores, result.keep):
            scores[i], ok[i] = s, k
        fallback = outcome.tolist() if get_granularity(self.granularity).uses_fallback else None
        rewards, reward_mask = place(
            scores, end_mask=seg.end_mask, response_mask=batch.response_mask, fallback=fallback
        )
        return rewards, reward_mask, ok, result, seg


def token_rows(batch: TrajectoryBatch) -> tuple[list[list[int]], list[list[int]]]:
    """Per response, the prompt's ids (left padding dropped) and the sampled response ids."""
    prompts = [
        [i for i, m in zip(ids, mask) if m] for ids, mask in zip(batch.prompt_ids.tolist(), batch.prompt_mask.tolist())
    ]
    lengths = batch.response_lengths.tolist()
    return prompts, [ids[:n] for ids, n in zip(batch.response_ids.tolist(), lengths)]


class _BoundedSegmenter:
    """A segmenter built on the user's ``cut_fn`` / ``key_fn``, each response's call bounded by
    ``reward.timeout_s`` and under ``reward.on_error``: ``raise`` stops with one line; ``zero``
    and ``skip`` both leave a failed response without spans (nothing is placed on it, or the
    granularity's fallback), counted under ``name``."""

    def __init__(self, calls: BoundedCalls, name: str, segmenter: SegmentFn, on_error: str) -> None:
        self.calls, self.name, self.on_error = calls, name, on_error
        self.counts = CallCounts()  # the Scorer sets each iteration's
        calls.register(name, segmenter)

    def __call__(self, texts: list[str]) -> list[int]:
        ends, _ = covered(
            self.name,
            self.calls.map(self.name, [(list(texts),)]),
            self.on_error,
            self.counts,
            check=_span_ends,
            describe=lambda _: f"a response ({shorten(''.join(texts))!r})",
        )
        return ends[0] or []


def _span_ends(value: object) -> list[int]:
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise ValueError(f"returned {shorten(repr(value), 40)}, expected a list of token indices")
    try:
        return [int(i) for i in value]
    except (TypeError, ValueError):
        raise ValueError(f"returned {shorten(repr(value), 40)}, expected a list of token indices") from None


class Scorer:
    """The score stage of a run; call it once per iteration."""

    def __init__(self, settings: ScoreSettings, task: Task, tokenizer: PreTrainedTokenizerBase) -> None:
        if not isinstance(settings, ScoreSettings):
            raise TypeError(f"Scorer takes ScoreSettings.of(config), got {type(settings).__name__}")
        self.settings, self.task = settings, task
        self.texts_of = TokenTexts(tokenizer)
        rc = settings.reward
        separator = rc.step_separator
        # every user function this stage calls, bounded by reward.timeout_s (creditrl.tasks.bounded)
        self.calls = BoundedCalls(rc.timeout_s)
        self.bounded_segmenters: list[_BoundedSegmenter] = []

        def segmenter(granularity: str) -> SegmentFn:
            made = make_segmenter(
                granularity,
                step_separator=separator,
                cut_fn=rc.cut_fn,
                segment_tokens=rc.segment_tokens,
                key_after=rc.key_after,
                key_fn=rc.key_fn,
            )
            user = "key_fn" if granularity == "key_token" and rc.key_fn else "cut_fn" if rc.cut_fn else None
            if user is None or granularity not in ("step", "segment", "key_token"):
                return made
            bounded = _BoundedSegmenter(self.calls, f"{user}:{granularity}", made, rc.on_error)
            self.bounded_segmenters.append(bounded)
            return bounded

        self.calls.register("check_outcome", task.check_outcome)
        if callable(getattr(task, "check_steps", None)):
            self.calls.register("check_steps", task.check_steps)

        def placed(source: str, granularity: str) -> _Placed:
            made = make_source(source, dict(settings.source_options))
            worker = made.worker_fn()  # None: a model-backed source (batch_fn) runs here (creditrl.tasks.bounded)
            if worker is not None:
                self.calls.register(made.name, functools.partial(worker, task))
            return _Placed(made, granularity, segmenter(granularity), self.calls)

        self.primary = placed(rc.source, rc.granularity)
        self.extra = [placed(name, get_source(name).default_granularity) for name in rc.sources]
        self.weights = list(rc.weights) or [1.0] * (1 + len(self.extra))
        h = settings.hybrid
        self.dense = placed(h.dense_source, h.dense_granularity) if h.dense_source else None
        self.steps = segmenter("step") if separator or rc.cut_fn else None
        self.calibrator = Calibrator(momentum=h.calibration_momentum) if h.calibrate else None
        every = [self.primary, *self.extra, *([self.dense] if self.dense else [])]
        self.learners = [placed.source.learner for placed in every if placed.source.learner is not None]

    def state_dict(self) -> dict[str, Any]:
        """The state of the sources that learn, for a checkpoint ({} when none does)."""
        return {f"learner{i}": learner.state_dict() for i, learner in enumerate(self.learners)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for i, learner in enumerate(self.learners):
            learner.load_state_dict(state[f"learner{i}"])

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
        task, h, on_error = self.task, self.settings.hybrid, self.settings.reward.on_error
        problems, completions = batch.extras["problems"], batch.extras["completions"]
        counts = CallCounts.zeros(self.calls.names)  # every function's count in every row, 0 or not
        for bounded in self.bounded_segmenters:
            bounded.counts = counts
        outcome, checked = self._outcomes(problems, completions, counts)
        stats: dict[str, float] = {}
        for learner in self.learners:  # a source that learns (the implicit PRM) sees the outcomes first
            stats.update(learner.observe(*token_rows(batch), outcome))
        passed = apply_filter(
            h.filter, outcome, batch.group_ids, q=h.filter_q, lo=h.filter_lo, hi=h.filter_hi, generator=generator
        )
        keep = [p and (c or on_error != "skip") for p, c in zip(passed.tolist(), checked)]
        rewards, reward_mask, keep, result, primary_seg = self.primary(
            batch, task, self.texts_of, keep, on_error, outcome
        )
        errors = self._count(self.primary, result, counts, stats)
        if self.extra:
            rewards, reward_mask, keep, extra_errors = self._sum(
                batch, rewards, reward_mask, keep, outcome, counts, stats
            )
            errors += extra_errors
        if self.dense is not None:
            d_rewards, d_mask, keep, d_result, _ = self.dense(batch, task, self.texts_of, keep, on_error, outcome)
            errors += self._count(self.dense, d_result, counts, stats)
            w_seq, w_dense = mix_weights(h.schedule, progress, switch_at=h.switch_at, weight=h.dense_weight)
            if self.calibrator is not None:
                verdict, valid = dense_verdict(d_rewards, d_mask, batch.response_mask)
                kept = torch.tensor(keep, dtype=torch.bool)
                stats["hybrid/agreement"] = self.calibrator.update(verdict, outcome > 0.5, valid & kept)
                w_dense *= self.calibrator.weight
            rewards, reward_mask = mix_rewards(rewards, reward_mask, d_rewards, d_mask, w_seq, w_dense)
            stats.update({"hybrid/w_seq": w_seq, "hybrid/w_dense": w_dense})
        rewards, reward_mask = add_shaping(rewards, reward_mask, self._shaping(batch, ref_logprobs))
        step_ends, step_correct, steps_ok = self._steps(batch, primary_seg, outcome, counts)
        if on_error == "skip":
            keep = [k and s for k, s in zip(keep, steps_ok)]
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
            counts=counts,
        )

    def _outcomes(
        self, problems: list[Problem], completions: list[str], counts: CallCounts
    ) -> tuple[torch.Tensor, list[bool]]:
        """The task's outcome checker on every response (1.0 accepted, 0.0 not, 0.0 where it failed
        under ``zero``/``skip``: see :func:`creditrl.tasks.bounded.covered`) and which calls succeeded."""
        values, ok = covered(
            "check_outcome",
            self.calls.map("check_outcome", list(zip(problems, completions))),
            self.settings.reward.on_error,
            counts,
            check=finite_number,
            describe=lambda i: f"response {i} ({shorten(completions[i])!r})",
        )
        return torch.tensor([v if good else 0.0 for v, good in zip(values, ok)]), ok

    def _sum(
        self,
        batch: TrajectoryBatch,
        rewards: torch.Tensor,
        reward_mask: torch.Tensor,
        keep: list[bool],
        outcome: torch.Tensor,
        counts: CallCounts,
        stats: dict[str, float],
    ) -> tuple[torch.Tensor, torch.Tensor, list[bool], int]:
        """``weights[0] * source + sum_i weights[i] * sources[i]`` (``reward.sources``), each source
        placed at its own granularity; its mean summed reward per response is logged by name
        (into ``stats``). A source that placed nothing on a response (a ``None`` score) adds 0 to
        it: its term is left out, as TRL's ``nansum`` leaves it out."""
        mask = batch.response_mask
        stats[f"reward/by_source/{self.primary.source.name}"] = float((rewards * mask).sum(-1).mean())
        total, total_mask, errors = self.weights[0] * rewards, reward_mask.clone(), 0
        for placed, weight in zip(self.extra, self.weights[1:]):
            r, m, keep, result, _ = placed(
                batch, self.task, self.texts_of, keep, self.settings.reward.on_error, outcome
            )
            errors += self._count(placed, result, counts, stats)
            stats[f"reward/by_source/{placed.source.name}"] = float((r * mask).sum(-1).mean())
            total, total_mask = total + weight * r, total_mask | m
        return total, total_mask, keep, errors

    @staticmethod
    def _count(placed: _Placed, result: ScoreResult, counts: CallCounts, stats: dict[str, float]) -> int:
        """Add a source's failed responses to ``counts`` under its name, and a user function's
        ``None`` scores to ``stats`` (``reward/none/<name>``); returns the failed responses."""
        name = placed.source.name
        counts.timeouts[name] += result.timeouts
        counts.errors[name] += result.errors - result.timeouts
        if placed.source.user_fn is not None:
            stats[f"reward/none/{name}"] = stats.get(f"reward/none/{name}", 0) + result.nones
        return result.errors

    def eval_reward(self, problems: list[Problem], completions: list[str]) -> float | None:
        """The primary source's mean sequence score over held-out ``completions`` (``eval/reward``:
        the reward's own measure, e.g. BLEU where exact match is rare), its calls bounded as in
        training and failures scored 0; ``None`` scores ("does not apply") are left out. None when
        the source scores spans only."""
        source = self.primary.source
        if "sequence" not in source.granularities:
            return None
        worker = source.worker_fn() is not None and source.name in self.calls.names
        bounded = {"run": functools.partial(self.calls.map, source.name)} if worker else {}
        result = score_batch(
            source,
            self.task,
            problems,
            completions,
            [[c] for c in completions],
            granularity="sequence",
            on_error="zero",
            **bounded,
        )
        applied = [s[0] for s in result.scores if s[0] is not None]
        return sum(applied) / max(1, len(applied))

    def close(self) -> None:
        """End the worker process of the bounded calls."""
        self.calls.close()

    def _shaping(self, batch: TrajectoryBatch, ref_logprobs: torch.Tensor | None) -> list:
        """The shaping terms (``shaping.*``) to add onto the placed rewards, each (rewards, mask) (B, T)."""
        sh, terms = self.settings.shaping, []
        if sh.length_coef > 0:
            terms.append(length_penalty(batch.response_mask, budget=sh.length_budget, coef=sh.length_coef))
        if sh.overlong_cache > 0:
            max_len = self.settings.max_new_tokens
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
        self, batch: TrajectoryBatch, primary_seg: Segmentation, outcome: torch.Tensor, counts: CallCounts
    ) -> tuple[torch.Tensor, torch.Tensor, list[bool]]:
        """The task's step ends (B, T), each response's share of steps the step checker accepts
        (B,; 0 where it failed) and which checks succeeded; without steps, no ends and the outcome;
        for a task without a step checker (no separator of its own: steps cut by ``cut_fn``), the
        ends and the outcome."""
        if self.steps is None:
            return torch.zeros_like(batch.response_mask), outcome.clone(), [True] * batch.size
        # the primary source's spans are the steps when it scores at step granularity: reuse them
        seg = (
            primary_seg
            if self.primary.granularity == "step"
            else segment(batch.response_ids, batch.response_lengths, self.texts_of, self.steps)
        )
        if getattr(self.task, "step_separator", None) is None:
            return seg.end_mask & batch.response_mask, outcome.clone(), [True] * batch.size
        completions = batch.extras["completions"]
        labels, ok = covered(
            "check_steps",
            self.calls.map("check_steps", list(zip(batch.extras["problems"], seg.texts))),
            self.settings.reward.on_error,
            counts,
            check=step_labels,
            describe=lambda i: f"response {i} ({shorten(completions[i])!r})",
        )
        step_correct = torch.tensor([sum(lab) / len(lab) if lab else 0.0 for lab in (x or [] for x in labels)])
        return seg.end_mask & batch.response_mask, step_correct, ok
