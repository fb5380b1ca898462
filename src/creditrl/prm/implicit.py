"""``reward.source=implicit_prm``: dense rewards without step labels (PRIME, Cui et al. 2025,
arXiv:2502.01456).

A reward model ``pi_rm``, initialised from the start policy, is trained online on outcome labels
alone, and its per-token log-ratio against the frozen start policy ``pi_ref`` is the process
reward::

    r_t = beta * (log pi_rm(y_t | y_<t) - log pi_ref(y_t | y_<t))

Every iteration, before scoring, :meth:`ImplicitPRM.observe` updates ``pi_rm`` on the fresh
rollouts (``reward.implicit_steps`` AdamW steps, ``reward.implicit_lr``) with the cross-entropy
of ``sigmoid(sum_t r_t)`` against each response's outcome; the rewards are then read from the
updated model. At ``token`` granularity each token's reward is its ``r_t``; at ``step`` (or
``segment``) the sum of a span's ``r_t``. With ``reward.implicit_center`` (the default) each
``r_t`` is first centered by a leave-one-out baseline, the mean token reward of the other
responses to the same prompt (:func:`loo_token_baseline`), as PRIME's RLOO does with its process
rewards. Both the update and the rewards read the token ids the policy sampled (the Scorer passes
them), never a re-tokenization of the text, which a BPE tokenizer may cut otherwise; special
tokens (eos) carry no reward. ``pi_rm``'s weights and optimizer are part of a checkpoint
(``extra.pt``), so a resumed run continues with the reward model it had. The PRIME recipe pairs
it with the outcome reward and RLOO: ``reward.source=outcome`` +
``hybrid.dense_source=implicit_prm``, ``credit.estimator=rloo``; any estimator takes it.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

from creditrl.policy.model import load_policy
from creditrl.policy.tokenizer import encode_problem
from creditrl.rewards.sources import RewardSource, register_source_factory
from creditrl.rollout.batch import TrajectoryBatch, response_logprobs
from creditrl.tasks import Problem, Task

__all__ = ["ImplicitPRM", "token_log_ratios"]


Row = tuple[list[int], list[int], list[int]]  # prompt ids, response ids, the span of each response token


def id_rows(
    prompts: Sequence[Sequence[int]], span_ids: Sequence[Sequence[Sequence[int]]], special: set[int]
) -> list[Row]:
    """Per response: its prompt ids, its response ids span after span, and the span index of each
    response token. Special tokens (eos) are left out: their text is empty, so no span's text
    holds them, and they carry no implicit reward."""
    out = []
    for prompt, spans in zip(prompts, span_ids):
        ids, owner = [], []
        for k, piece in enumerate(spans):
            kept = [int(i) for i in piece if int(i) not in special]
            ids += kept
            owner += [k] * len(kept)
        out.append((list(prompt), ids, owner))
    return out


def _rows(tokenizer, problems: Sequence[Problem], spans: Sequence[Sequence[str]]) -> list[Row]:
    """:func:`id_rows` of span texts, each span tokenized on its own: the text path, for a caller
    that has no token ids (:meth:`ImplicitPRM.token_rewards` reads the sampled ones)."""
    pieces = [[tokenizer(t, add_special_tokens=False)["input_ids"] if t else [] for t in row] for row in spans]
    prompts = [encode_problem(tokenizer, problem) for problem in problems]
    return id_rows(prompts, pieces, set(tokenizer.all_special_ids))


def _as_batch(rows: list[Row], pad_id: int) -> TrajectoryBatch:
    """The rows as a rollout batch (prompts left-padded, responses right-padded), so that the
    rollout's response forward (the packed pass where the model allows) serves both models."""
    n, width = len(rows), max(1, max(len(p) for p, _, _ in rows))
    t = max(1, max(len(r) for _, r, _ in rows))
    prompt_ids = torch.full((n, width), pad_id, dtype=torch.long)
    prompt_mask = torch.zeros((n, width), dtype=torch.long)
    response_ids = torch.full((n, t), pad_id, dtype=torch.long)
    for i, (p, r, _) in enumerate(rows):
        if p:
            prompt_ids[i, width - len(p) :], prompt_mask[i, width - len(p) :] = torch.tensor(p), 1
        response_ids[i, : len(r)] = torch.tensor(r, dtype=torch.long)
    lengths = torch.tensor([len(r) for _, r, _ in rows], dtype=torch.long)
    return TrajectoryBatch(
        prompt_ids=prompt_ids,
        prompt_mask=prompt_mask,
        response_ids=response_ids,
        response_lengths=lengths,
        response_mask=torch.arange(t)[None, :] < lengths[:, None],
        old_logprobs=torch.zeros((n, t)),
        group_ids=torch.arange(n),
        finished=torch.ones(n, dtype=torch.bool),
    )


def token_log_ratios(
    model, reference, rows: list[Row], pad_id: int, *, ref_logprobs: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, T) ``log pi_model(y_t | y_<t) - log pi_ref(y_t | y_<t)`` of every response token, and its
    mask; gradients flow through ``model`` only. ``ref_logprobs`` (B, T): the reference's, when
    already computed for these rows (:func:`reference_logprobs`)."""
    batch = _as_batch(rows, pad_id)
    ref = reference_logprobs(reference, rows, pad_id) if ref_logprobs is None else ref_logprobs
    return (response_logprobs(model, batch) - ref) * batch.response_mask, batch.response_mask


def reference_logprobs(reference, rows: list[Row], pad_id: int) -> torch.Tensor:
    """(B, T) ``log pi_ref(y_t | y_<t)`` of the rows' response tokens, 0 on padding."""
    batch = _as_batch(rows, pad_id)
    with torch.no_grad():
        return response_logprobs(reference, batch) * batch.response_mask


def loo_token_baseline(rewards: torch.Tensor, mask: torch.Tensor, groups: Sequence[Any]) -> torch.Tensor:
    """(B,) each response's leave-one-out baseline for its token rewards: the mean, over the other
    responses with the same ``groups`` key (the same prompt) that have tokens, of their mean token
    reward ``m_j = sum_t r[j, t] / L_j``; 0 for a response without such peers.

    ``rewards`` float (B, T), ``mask`` bool (B, T). Subtracting it from every token reward of
    response ``i`` is PRIME's RLOO on the process rewards (Cui et al. 2025, eq. 5): the reward-to-go
    of late tokens no longer carries the group's mean token reward, which a sequence-level
    baseline cannot remove (it grows with the tokens left). PRIME's implementation also scales
    each token's deviation from its own response's mean by K/(K-1); this baseline does not."""
    lengths = mask.sum(dim=1)
    means = torch.where(lengths > 0, (rewards * mask).sum(dim=1) / lengths.clamp(min=1), 0.0)
    baseline = torch.zeros(len(groups))
    for key in dict.fromkeys(groups):
        idx = [i for i, g in enumerate(groups) if g == key and lengths[i] > 0]
        if len(idx) < 2:
            continue
        total = means[idx].sum()
        baseline[idx] = (total - means[idx]) / (len(idx) - 1)
    return baseline


class ImplicitPRM:
    """The online implicit PRM of one run: ``pi_rm`` (trained), ``pi_ref`` (frozen), both from ``init``."""

    def __init__(self, init: str, *, beta: float, lr: float, steps: int, seed: int = 0, center: bool = True) -> None:
        self.reference, self.tokenizer = load_policy(init, seed=seed)
        self.reference.eval().requires_grad_(False)
        self.model = copy.deepcopy(self.reference).requires_grad_(True)
        self.model.eval()  # no dropout: the rewards it gives are deterministic
        self.beta, self.steps, self.center = beta, steps, center
        self.special = set(self.tokenizer.all_special_ids)
        self._ref: dict[tuple[tuple[int, ...], tuple[int, ...]], torch.Tensor] = {}  # the last observe's
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=lr, weight_decay=0.0)

    def rewards(self, problems: Sequence[Problem], spans: Sequence[Sequence[str]]) -> list[list[float | None]]:
        """Per response, per span: ``beta`` x the summed log-ratio of its tokens (None: a span
        without tokens), from the span texts (:func:`_rows`)."""
        return self._span_sums(_rows(self.tokenizer, problems, spans), [len(row) for row in spans])

    def token_rewards(
        self, prompts: Sequence[Sequence[int]], span_ids: Sequence[Sequence[Sequence[int]]]
    ) -> list[list[float | None]]:
        """:meth:`rewards` of the sampled token ids themselves: ``prompts[i]`` the prompt's ids,
        ``span_ids[i]`` each span's response ids (the source's ``ids_fn``)."""
        return self._span_sums(id_rows(prompts, span_ids, self.special), [len(row) for row in span_ids])

    def _span_sums(self, rows: list[Row], n_spans: list[int]) -> list[list[float | None]]:
        if not rows:  # every response filtered out or dropped
            return []
        with torch.no_grad():
            ratios, mask = token_log_ratios(
                self.model, self.reference, rows, self.tokenizer.pad_token_id, ref_logprobs=self._cached(rows)
            )
        rewards = self.beta * ratios
        if self.center:
            rewards = (rewards - loo_token_baseline(rewards, mask, [tuple(p) for p, _, _ in rows])[:, None]) * mask
        out = []
        for (_, _, owner), r, n in zip(rows, rewards.tolist(), n_spans):
            sums: list[float | None] = [None] * n
            for k, v in zip(owner, r):
                sums[k] = (sums[k] or 0.0) + v
            out.append(sums)
        return out

    def observe(
        self, prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]], outcome: torch.Tensor
    ) -> dict[str, float]:
        """``implicit_steps`` updates of ``pi_rm`` toward the outcomes (cross-entropy of
        ``sigmoid(beta * sum_t log-ratio)``) on the sampled ids (``prompts[i]``, ``responses[i]``);
        returns the loss and accuracy before the first step."""
        rows = id_rows(prompts, [[r] for r in responses], self.special)
        labels = outcome.float().clamp(0, 1)
        ref = reference_logprobs(self.reference, rows, self.tokenizer.pad_token_id)
        self._ref = {(tuple(p), tuple(r)): lp[: len(r)] for (p, r, _), lp in zip(rows, ref)}
        stats: dict[str, float] = {}
        for step in range(self.steps):
            ratios, _ = token_log_ratios(
                self.model, self.reference, rows, self.tokenizer.pad_token_id, ref_logprobs=ref
            )
            score = self.beta * ratios.sum(dim=1)
            loss = F.binary_cross_entropy_with_logits(score, labels)
            if step == 0:
                stats = {
                    "reward/implicit_loss": float(loss.detach()),
                    "reward/implicit_accuracy": _agreement(score.detach(), labels),
                }
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
            self.optimizer.step()
        return stats

    def _cached(self, rows: list[Row]) -> torch.Tensor | None:
        """The reference log-probs of ``rows`` from the last :meth:`observe` (the same responses,
        scored after the update), or None when a row is not among them."""
        found = [self._ref.get((tuple(p), tuple(r))) for p, r, _ in rows]
        if any(lp is None for lp in found):
            return None
        out = torch.zeros((len(rows), max(1, max(len(r) for _, r, _ in rows))))
        for i, lp in enumerate(found):
            out[i, : lp.numel()] = lp
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])


def _agreement(score: torch.Tensor, labels: torch.Tensor) -> float:
    """The share of responses whose implicit outcome ``sigmoid(score) > 1/2`` matches the label."""
    return float(((score > 0).float() == (labels > 0.5).float()).float().mean())


SPANS = ("token", "step", "segment", "key_token")  # any span of response tokens


@register_source_factory("implicit_prm", granularities=SPANS, default="token")
def _implicit_source(options: dict[str, Any]) -> RewardSource:
    """The implicit PRM (module docstring): ``pi_rm`` from the start policy (``train.init`` as the
    run resolves it), trained online on the outcomes; rewards are its log-ratio to that start."""
    prm = ImplicitPRM(
        str(options["init"]),
        beta=float(options.get("implicit_beta", 0.05)),
        lr=float(options.get("implicit_lr", 1e-4)),
        steps=int(options.get("implicit_steps", 1)),
        seed=int(options.get("init_seed", 0)),
        center=bool(options.get("implicit_center", True)),
    )

    def fn(task: Task, problem: Problem, completion: str, spans: Sequence[str]) -> list[float | None]:
        return prm.rewards([problem], [spans])[0]

    def batch_fn(task: Task, problems, completions, spans) -> list[list[float | None]]:
        return prm.rewards(problems, spans)

    return RewardSource("implicit_prm", frozenset(SPANS), "token", fn, batch_fn, prm, prm.token_rewards)
