"""A run's plan: every setting the RL loop reads, resolved once by :func:`creditrl.train.build.build_run`.

The loop (:mod:`creditrl.train.rl` and its mixins) and its stages read the plan and the parts, never
the config: :func:`plan_of` is the one place that turns the resolved config into a run's numbers,
flags and schedules. The config is kept as plain data only for ``config.yaml`` and the trackers.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from creditrl.config import Config, LossConfig, OptimConfig
from creditrl.credit.schedule import linear_schedule


@dataclass(frozen=True)
class CreditSettings:
    """The credit stage's settings (``credit.*``): the estimator and normaliser by name, the time
    resolution, ``gamma``, the lambdas and the outcome channel's weight."""

    resolution: str
    estimator: str
    normaliser: str
    gamma: float
    lam: float
    lam_end: float | None
    lam_critic: float | None
    lam_alpha: float
    outcome_coef: float

    @classmethod
    def of(cls, cfg: Config) -> CreditSettings:
        return cls(**{f.name: getattr(cfg.credit, f.name) for f in fields(cls)})

    def lam_at(self, progress: float) -> float:
        """The advantages' lambda at ``progress`` (iteration / iterations) of training (``credit.lam_end``)."""
        return linear_schedule(self.lam, self.lam_end, progress)


@dataclass(frozen=True)
class UpdateSettings:
    """The update's settings (:func:`creditrl.train.update.update`): the ``loss`` and ``optim``
    sections (frozen, resolved), the forward's precision and path, the value loss's clip and weight."""

    loss: LossConfig
    optim: OptimConfig
    precision: str  # policy.precision
    packed: bool  # policy.forward=auto: the packed forward where it applies
    value_clip_eps: float
    value_coef: float

    @classmethod
    def of(cls, cfg: Config) -> UpdateSettings:
        packed = cfg.policy.forward == "auto"
        return cls(cfg.loss, cfg.optim, cfg.policy.precision, packed, cfg.value.clip_eps, cfg.value.coef)


@dataclass(frozen=True)
class RunPlan:
    """What the RL loop does and when: iterations and budget, cadences, seeds, schedules, the
    rollout's and reference's shapes, evaluation, logging and export. Built by :func:`plan_of`."""

    iterations: int  # train.iterations
    max_tokens: int  # train.max_tokens: stop once this many tokens were sampled (0 = no budget)
    seed: int  # train.seed: iteration i's problems and generator come from (seed, i)
    eval_every: int
    checkpoint_every: int
    prompts_per_iter: int
    group_size: int
    pretrain_iterations: int  # value.pretrain_iterations: critic-only rounds before iteration 1
    critic_only_iterations: int  # value.warmup_iterations: the first iterations train only the critic
    lr: float  # optim.lr, reached after optim.warmup_iterations
    lr_warmup: int
    credit: CreditSettings
    update: UpdateSettings
    precision: str  # policy.precision of the reference forward
    packed: bool  # policy.forward=auto: the packed forward where it applies
    inference_positions: int  # optim.inference_positions: the reference forward's chunk
    ray: bool  # backend.name=ray: rollout workers report their stats
    eval_max_new_tokens: int
    eval_engine: str
    eval_kernels: str
    on_error: str  # reward.on_error, for the held-out checks too
    log_completions: int
    progress: bool  # train.progress: a bar on a terminal, plain lines otherwise
    report_to: tuple[str, ...]
    push_to_hub: str
    merge_lora: bool
    label: str  # "estimator/source", the progress bar's name
    saved_config: dict[str, Any]  # the resolved config as plain data: config.yaml and the trackers' run config

    def lr_at(self, it: int) -> float:
        """Iteration ``it``'s learning rate: linear warm-up over ``optim.warmup_iterations``, then ``optim.lr``."""
        return self.lr * (min(1.0, (it + 1) / self.lr_warmup) if self.lr_warmup else 1.0)

    def progress_at(self, it: int) -> float:
        """Training progress at iteration ``it`` (0-based), the schedules' clock."""
        return it / max(1, self.iterations)

    def lam_at(self, it: int) -> float:
        """Iteration ``it``'s lambda of the advantages (``credit.lam`` -> ``credit.lam_end``)."""
        return self.credit.lam_at(self.progress_at(it))

    def due(self, done: int, every: int, spent: bool) -> bool:
        """Whether an evaluation / checkpoint of cadence ``every`` is due after ``done`` iterations:
        on the cadence, at the last iteration, or when the token budget is spent."""
        return done % every == 0 or done == self.iterations or spent

    def spent(self, tokens: int) -> bool:
        """Whether ``tokens`` sampled so far use up the budget (``train.max_tokens``)."""
        return bool(self.max_tokens) and tokens >= self.max_tokens


def plan_of(cfg: Config) -> RunPlan:
    """The plan of a resolved config (:func:`creditrl.train.build.build_run` calls it last)."""
    t = cfg.train
    return RunPlan(
        iterations=t.iterations,
        max_tokens=t.max_tokens,
        seed=t.seed,
        eval_every=t.eval_every,
        checkpoint_every=t.checkpoint_every,
        prompts_per_iter=cfg.rollout.prompts_per_iter,
        group_size=cfg.rollout.group_size,
        pretrain_iterations=cfg.value.pretrain_iterations,
        critic_only_iterations=cfg.value.warmup_iterations,
        lr=cfg.optim.lr,
        lr_warmup=cfg.optim.warmup_iterations,
        credit=CreditSettings.of(cfg),
        update=UpdateSettings.of(cfg),
        precision=cfg.policy.precision,
        packed=cfg.policy.forward == "auto",
        inference_positions=cfg.optim.inference_positions,
        ray=cfg.backend.name == "ray",
        eval_max_new_tokens=cfg.rollout.max_new_tokens,
        eval_engine=cfg.policy.engine,
        eval_kernels=cfg.policy.kernels,
        on_error=cfg.reward.on_error,
        log_completions=t.log_completions,
        progress=t.progress,
        report_to=tuple(t.report_to),
        push_to_hub=t.push_to_hub,
        merge_lora=t.merge_lora,
        label=f"{cfg.credit.estimator}/{cfg.reward.source}",
        saved_config=cfg.to_dict(),
    )
