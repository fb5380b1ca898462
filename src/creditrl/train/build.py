"""The build layer: a config in, the parts of an RL run out (docs/design.md, "From a config to a run").

:func:`build_run` resolves every setting once, in one pass, and makes the run's
:class:`~creditrl.train.plan.RunPlan` last; :class:`~creditrl.train.rl.RLTrainer` reads the plan and
wires the parts, never the config. ``RLTrainer.resume`` builds through the same function.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from creditrl.config import Config
from creditrl.distributed import ddp
from creditrl.errors import ConfigError
from creditrl.inspect.record import InspectSettings, record_iteration
from creditrl.policy.device import grad_scaler, resolve_device
from creditrl.policy.engines import GenerationEngine, SamplingParams, choose_engine, engine_for
from creditrl.policy.model import apply_lora, load_policy, policy_options
from creditrl.prm.cache import cached_prm, prm_cost_s, prm_record
from creditrl.rewards.stage import Scorer, ScoreSettings
from creditrl.rollout.segment import step_stop_ids
from creditrl.tasks import Problem, Task
from creditrl.train.evaluate import EVAL_SEED
from creditrl.train.optim import make_optimizer
from creditrl.train.plan import RunPlan, plan_of
from creditrl.train.resolve import resolve_run, run_task, start_kind
from creditrl.train.sft import cached_sft
from creditrl.values.registry import VALUE_SOURCES
from creditrl.values.stage import ValueStage

log = logging.getLogger("creditrl")


@dataclass
class Learners:
    """The policy and critic as the update trains them: DDP wrappers under a data-parallel launch
    (built on first use, again for a policy swapped in), an FSDP2-sharded copy of the policy with
    ``backend.learner=fsdp`` (the plain policy, which generates and is saved, is refreshed from
    it after every update), the plain modules in one process."""

    sharded: bool
    policy: torch.nn.Module | None = None
    critic: torch.nn.Module | None = None

    def get(
        self, model: torch.nn.Module, critic: torch.nn.Module | None
    ) -> tuple[torch.nn.Module, torch.nn.Module | None]:
        if not self.sharded and (self.policy is None or ddp.unwrap(self.policy) is not model):
            self.policy = ddp.wrap(model)
        if self.critic is None and critic is not None:
            self.critic = ddp.wrap(critic)
        return self.policy, self.critic

    def close(self) -> None:
        self.policy = self.critic = None


@dataclass
class RunParts:
    """Everything an RL run holds; built by :func:`build_run`."""

    config: Config  # resolved and frozen: the run directory's config.yaml
    plan: RunPlan  # every setting the loop reads, resolved from ``config`` once
    task: Task
    init_path: str  # the start policy, and the reference for KL
    model: PreTrainedModel  # the policy that generates, is evaluated and saved (LoRA-wrapped with lora_r)
    tokenizer: PreTrainedTokenizerBase
    reference: PreTrainedModel | None  # frozen start policy, for KL terms
    engine: GenerationEngine
    scorer: Scorer
    value_stage: ValueStage
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler | None
    learners: Learners
    params: SamplingParams
    stop_ids: tuple[int, ...]  # tree rollouts stop a segment at these tokens
    heldout: list[Problem]
    inspector: Callable[..., Path | None]  # record_iteration bound to its settings, the tokenizer and task
    prm_s: float = 0.0  # what the PRM a reward reads cost to label for and train (prm_cost_s)
    prm: dict[str, float] = field(default_factory=dict)  # its labels' and its own quality (prm_record)


def start_policy(cfg: Config, task: Task | None = None, *, progress: bool, sft_task: Task | None = None) -> str:
    """The path RL starts from for ``train.init``: the cached SFT warm start, ``policy.model``, or a
    checkpoint directory (``task``, ``sft_task``: the run's task and the warm start's, built here
    when needed and not given)."""
    init = start_kind(cfg)
    if init == "sft":
        task = task or run_task(cfg)
        sft_task = sft_task or (task if not cfg.sft.task_args else run_task(cfg, "sft.task_args"))
        with ddp.main_first():  # data-parallel ranks: rank 0 trains (or finds) the cache, the rest reuse it
            path, _ = cached_sft(cfg, progress=progress, task=task, sft_task=sft_task)
        return str(path)
    return cfg.policy.model if init == "policy" else init


def resolve_policy_choices(
    cfg: Config, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase
) -> tuple[Config, str]:
    """Resolve ``policy.chat_template`` and ``policy.engine`` against the loaded policy; returns the
    new config and the engine chosen, with why."""
    engine, why = choose_engine(model, cfg.policy.engine)
    if cfg.backend.name == "ray":
        why += f"; on {cfg.backend.rollout_workers} Ray rollout workers"
    template = cfg.policy.chat_template
    if template == "auto":
        template = "template" if getattr(tokenizer, "chat_template", None) else "none"
    cfg = cfg.updated({"policy": {"engine": engine, "chat_template": template}})
    return cfg, f"{engine} ({why})"


def _prm(cfg: Config, init_path: str, progress: bool) -> Config:
    """``reward.prm=auto`` resolved to the cached PRM trained on the start policy's samples, and
    ``prm.completer=""`` to the start policy."""
    if cfg.reward.prm == "auto":
        with ddp.main_first():
            cfg = cfg.updated({"reward": {"prm": str(cached_prm(cfg, init_path, progress=progress))}})
    return cfg.updated({"prm": {"completer": cfg.prm.completer or init_path}})


def _policy(cfg: Config, init_path: str, checkpoint: Path | None, device: torch.device):
    """The policy (from ``checkpoint`` when resuming), its tokenizer, the reference, and the module
    a separate critic copies (the plain policy: LoRA injects its adapters in place)."""
    options = policy_options(cfg)
    model, tokenizer = load_policy(str(checkpoint or init_path), seed=cfg.policy.init_seed, **options)
    model.to(device)
    reference = None
    if cfg.loss.kl_coef > 0 or cfg.shaping.kl_coef > 0:
        reference, _ = load_policy(init_path, seed=cfg.policy.init_seed, **options)
        reference.to(device).eval().requires_grad_(False)
    critic_source = model
    p = cfg.policy
    separate_critic = VALUE_SOURCES[cfg.value.source].kind == "critic"
    if p.lora_r and checkpoint is None:
        if separate_critic:
            critic_source = copy.deepcopy(model)
        model = apply_lora(model, r=p.lora_r, alpha=p.lora_alpha, dropout=p.lora_dropout, targets=p.lora_targets)
    elif p.lora_r and separate_critic:  # a LoRA checkpoint loads as base + adapter; the critic's weights are restored
        critic_source, _ = load_policy(init_path, seed=p.init_seed, **options)
        critic_source.to(device)
    if p.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model, tokenizer, reference, critic_source


def _engine(cfg: Config, init_path: str, model: PreTrainedModel, tokenizer, scorer: Scorer) -> GenerationEngine:
    if cfg.backend.name == "ray":  # rollout (and scoring) workers as Ray actors; ray is imported only here
        from creditrl.distributed.ray_backend import ray_engine

        return ray_engine(cfg, init_path, model, tokenizer, scorer)
    return engine_for(model, tokenizer, cfg.policy)


def _warn_small_heldout(cfg: Config, task: Task) -> None:
    """One line when the held-out set of a task read from files is smaller than ``train.eval_size``
    (evaluation then draws its problems with replacement)."""
    pool = getattr(task, "pools", {}).get("heldout") if isinstance(getattr(task, "pools", None), dict) else None
    if pool is not None and 0 < len(pool) < cfg.train.eval_size:
        log.warning(
            "creditrl: train.eval_size=%d but the held-out set has %d problems: evaluation draws them with "
            "replacement (lower train.eval_size to %d to score each once)",
            cfg.train.eval_size,
            len(pool),
            len(pool),
        )


def build_run(
    cfg: Config, *, init_path: str | None = None, checkpoint: Path | None = None, task: Task | None = None
) -> RunParts:
    """The parts of a run of ``cfg``: the task is built once (or ``task`` is used), the config is
    checked and resolved, the policy starts from ``init_path`` (default: ``train.init``) or, when
    resuming, from ``checkpoint``'s weights. Every setting is resolved here, in one pass, before the
    run's :class:`~creditrl.train.plan.RunPlan` is made: nothing after it returns resolves again."""
    ddp.join_learner_group(cfg)  # a torchrun / accelerate launch: data-parallel ranks (no-op otherwise)
    cfg, task, sft_task = resolve_run(cfg, task)  # the one call into creditrl.train.resolve
    torch.set_num_threads(cfg.train.threads)
    init_path = init_path or start_policy(cfg, task, progress=cfg.train.progress, sft_task=sft_task)
    cfg = _prm(cfg.updated({"train": {"init": init_path}}), init_path, cfg.train.progress)
    device = resolve_device(cfg.policy.device)
    if device.type == "cuda":  # NCCL (data-parallel ranks) uses the current device
        torch.cuda.set_device(device)
    model, tokenizer, reference, critic_source = _policy(cfg, init_path, checkpoint, device)
    cfg, engine_choice = resolve_policy_choices(cfg, model, tokenizer)
    log.info("creditrl: start policy %s on %s", init_path, device)
    log.info("creditrl: engine %s", engine_choice)
    _warn_small_heldout(cfg, task)
    sharded = cfg.backend.learner == "fsdp" and ddp.is_distributed()
    learners = Learners(sharded)
    if sharded:
        if cfg.policy.lora_r:
            raise ConfigError("backend.learner=fsdp does not shard LoRA adapters; use backend.learner=ddp")
        learners.policy = ddp.wrap(copy.deepcopy(model), strategy="fsdp")
    trained = learners.policy if sharded else model
    optimizer = make_optimizer([p for p in trained.parameters() if p.requires_grad], cfg.optim)
    scorer = Scorer(ScoreSettings.of(cfg), task, tokenizer)
    engine = _engine(cfg, init_path, model, tokenizer, scorer)
    params = SamplingParams(
        max_new_tokens=cfg.rollout.max_new_tokens, temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p
    )
    value_stage = ValueStage(
        cfg.value,
        critic_source,
        engine,
        tokenizer,
        task,
        params,
        precision=cfg.policy.precision,
        on_error=cfg.reward.on_error,
        calls=scorer.calls,
    )
    stop_ids = step_stop_ids(tokenizer, cfg.reward.step_separator) if value_stage.tree else ()
    return RunParts(
        config=cfg,
        plan=plan_of(cfg),
        task=task,
        init_path=init_path,
        model=model,
        tokenizer=tokenizer,
        reference=reference,
        engine=engine,
        scorer=scorer,
        value_stage=value_stage,
        optimizer=optimizer,
        scaler=grad_scaler(device, cfg.policy.precision),
        learners=learners,
        params=params,
        stop_ids=stop_ids,
        heldout=task.sample(cfg.train.eval_size, split="heldout", seed=EVAL_SEED),
        inspector=partial(record_iteration, settings=InspectSettings.of(cfg), tokenizer=tokenizer, task=task),
        prm_s=prm_cost_s(cfg),
        prm=prm_record(cfg),
    )
