"""The value stage: where ``values`` (B, T) come from for the estimator (``value.source``).

- ``none``: no values;
- ``critic`` / ``dual_critic``: a learned :class:`~creditrl.values.critic.Critic`, evaluated here
  (no grad) and trained in the update stage toward the estimator's returns;
- ``mc``: VinePPO Monte-Carlo values from continuations of every step prefix
  (:func:`~creditrl.values.mc.mc_values`), recomputed each iteration with the current policy;
- ``tree``: the rollout stage samples each prompt's group as a tree (:attr:`ValueStage.tree`),
  and V(node) = mean outcome of its leaves (:func:`~creditrl.values.tree.tree_values`); the
  tree's segments become the time steps of credit (``ValueOut.step_ends``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from creditrl.config import ValueConfig
from creditrl.policy.device import autocast, module_device
from creditrl.policy.engines import GenerationEngine, InProcessEngine, SamplingParams
from creditrl.rollout.batch import TrajectoryBatch, response_forward
from creditrl.tasks.base import Task
from creditrl.tasks.bounded import BoundedCalls, CallCounts, covered, finite_number, shorten
from creditrl.values.critic import Critic, build_critic
from creditrl.values.mc import mc_values
from creditrl.values.registry import VALUE_SOURCES
from creditrl.values.tree import TreeShape, tree_values


@dataclass
class ValueOut:
    values: torch.Tensor | None  # float (B, T) or None
    member_values: torch.Tensor | None  # float (M, B, T), a critic's heads before the min
    stats: dict[str, float] = field(default_factory=dict)
    step_ends: torch.Tensor | None = None  # bool (B, T): replaces the task's step ends in credit


def _failures(counts: CallCounts) -> dict[str, float]:
    """The value targets' failed outcome checks (``value/check_errors``, ``value/check_timeouts``)."""
    return {
        "value/check_errors": float(sum(counts.errors.values())),
        "value/check_timeouts": float(sum(counts.timeouts.values())),
    }


class ValueStage:
    """Holds the critic (and its optimizer) or the MC settings of a run."""

    def __init__(
        self,
        settings: ValueConfig,
        policy: PreTrainedModel,
        engine: GenerationEngine,
        tokenizer: PreTrainedTokenizerBase,
        task: Task,
        params: SamplingParams,
        *,
        precision: str,
        on_error: str,
        calls: BoundedCalls | None = None,
    ) -> None:
        """``settings``: the run's resolved ``value`` section; ``precision``: ``policy.precision``
        of the critic's forward; ``on_error``: ``reward.on_error`` for the value targets' outcome
        checks; ``calls``: where the task's outcome checker runs for Monte-Carlo and tree values
        (the score stage's bounded calls, :mod:`creditrl.tasks.bounded`); default in process."""
        if not isinstance(settings, ValueConfig):
            raise TypeError(
                f"ValueStage takes the config's value section (config.value), got {type(settings).__name__}"
            )
        self.settings, self.policy, self.engine = settings, policy, engine
        self.precision, self.on_error = precision, on_error
        self.tokenizer, self.task, self.params = tokenizer, task, params
        if calls is None:
            calls = BoundedCalls(0)
            calls.register("check_outcome", task.check_outcome)
        self.calls = calls
        self.info = VALUE_SOURCES[settings.source]
        self.tree = TreeShape(settings.tree_branching, settings.tree_depth) if self.info.kind == "tree" else None
        self.critic: Critic | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        if self.info.kind == "critic":
            self.critic = build_critic(
                policy,
                members=self.info.members,
                placement=settings.model,
                seed=settings.seed,
                backbone=settings.backbone,
            )
            self.critic.to(module_device(policy))  # policy.device; new heads are built on the CPU
            self.optimizer = torch.optim.AdamW(self.critic.parameters(), lr=settings.lr, betas=(0.9, 0.99))

    @torch.no_grad()
    def __call__(self, batch: TrajectoryBatch, step_ends: torch.Tensor, generator: torch.Generator) -> ValueOut:
        if self.info.kind == "none":
            return ValueOut(None, None)
        if self.critic is not None:
            states = None
            with autocast(module_device(self.critic), self.precision):
                if self.critic.shared:
                    self.policy.eval()
                    states = response_forward(self.policy, batch, hidden=True)[1]
                self.critic.eval()
                members = self.critic.member_values(batch, states).cpu()  # (M, B, T); credit runs on the CPU
            return ValueOut(self.critic.combine(members), members)
        problems, counts = batch.extras["problems"], CallCounts()
        if self.tree is not None:
            outcomes = self._outcomes(list(zip(problems, batch.extras["completions"])), counts)
            tv = tree_values(
                batch.extras["tree_paths"], batch.extras["tree_segment_ends"], outcomes, batch.response_mask
            )
            stats = {
                "value/tree_nodes": float(len(tv.node_values)),
                "value/tree_segments": float(tv.segment_ends.sum(-1).float().mean()),
                **_failures(counts),
            }
            return ValueOut(tv.values, None, stats, step_ends=tv.segment_ends)
        # spans need an in-process engine (draw_rows); vLLM pages its own cache, Ray splits the rows over workers
        bounded = isinstance(self.engine, InProcessEngine)
        out = mc_values(
            self.engine,
            batch,
            step_ends,
            lambda row, text: self._outcomes([(problems[row], text)], counts)[0],
            samples=self.settings.mc_samples,
            params=self.params,
            generator=generator,
            decode=lambda ids: self.tokenizer.decode(ids, skip_special_tokens=True),
            max_rows=self.settings.mc_rows_per_call if bounded else None,
            max_positions=self.settings.mc_positions_per_call if bounded else None,
        )
        stats = {"value/mc_states": float(out.n_states), "value/mc_tokens": float(out.n_tokens), **_failures(counts)}
        return ValueOut(out.values, None, stats)

    def _outcomes(self, pairs: list[tuple[Any, str]], counts: CallCounts) -> list[float]:
        """The outcome checker on ``(problem, text)`` pairs, bounded and under ``reward.on_error``
        (a failed check under ``zero`` or ``skip`` is a failed continuation: 0)."""
        values, _ = covered(
            "check_outcome",
            self.calls.map("check_outcome", pairs),
            self.on_error,
            counts,
            check=finite_number,
            describe=lambda i: f"a value rollout ({shorten(pairs[i][1])!r})",
        )
        return [0.0 if v is None else v for v in values]

    def state_dict(self) -> dict[str, Any]:
        if self.critic is None:
            return {}
        return {"critic": self.critic.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.critic is not None and state:
            self.critic.load_state_dict(state["critic"])
            self.optimizer.load_state_dict(state["optimizer"])
