"""Checking a config against the registries, and resolving its defaults, once per run.

What only the lower layers know is checked here, against the registries themselves: every name
gets the same one-line message (``key: unknown value 'x'; valid: ...; did you mean 'y'?``), every
combination that makes no sense says why, before anything is sampled. :func:`check` resolves the
defaults that need nothing heavy; :mod:`creditrl.train.build` resolves the rest (the start policy,
the chat template, the engine, ``reward.prm=auto``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from creditrl import prm as _prm  # noqa: F401  (registers reward.source=prm)
from creditrl.config import Config
from creditrl.credit import ESTIMATORS, NORMALISERS, requires
from creditrl.errors import ConfigError, unknown_choice
from creditrl.losses import AGGREGATIONS
from creditrl.policy.device import check_precision, resolve_device
from creditrl.policy.engines import ENGINES, kernels
from creditrl.prm.labels import LABELERS, MC_MODES
from creditrl.prm.model import COMBINES
from creditrl.prm.public import PRM_FORMATS, detect_format
from creditrl.rewards.hybrid import FILTERS, SCHEDULES
from creditrl.rewards.placement import GRANULARITIES
from creditrl.rewards.sources import check_granularity, get_source, source_names
from creditrl.tasks import Task, TaskNameError, make_task
from creditrl.tasks.base import takes_argument
from creditrl.train.optim import OPTIMIZERS
from creditrl.values.registry import VALUE_SOURCES


def one_of(key: str, value: str, valid: Any) -> None:
    """ConfigError naming ``key`` and the valid names unless ``value`` is one of them."""
    if value not in valid:
        raise unknown_choice(key, value, valid)


def task_args(cfg: Config, key: str = "task.args") -> dict[str, Any]:
    """The arguments of the task of ``cfg`` at ``key`` (``task.args`` or ``sft.task_args``; the
    latter empty means the former), with ``local_files_only`` from ``policy.local_files_only``
    for a task that takes it (hub datasets) and is not given it."""
    args = dict(cfg.sft.task_args if key == "sft.task_args" and cfg.sft.task_args else cfg.task.args)
    if "local_files_only" not in args and takes_argument(cfg.task.name, "local_files_only"):
        args["local_files_only"] = cfg.policy.local_files_only
    separator = cfg.reward.step_separator
    if separator is not None and takes_argument(cfg.task.name, "step_separator"):
        given = args.get("step_separator")
        if given is not None and given != separator:
            raise ConfigError(
                f"{key}: step_separator {given!r} differs from reward.step_separator {separator!r}; "
                "set only reward.step_separator"
            )
        args["step_separator"] = separator
    return args


def run_task(cfg: Config, key: str = "task.args") -> Task:
    """:func:`build_task` of ``cfg``'s task with :func:`task_args`. ``reward.step_separator`` is
    the task's step separator: passed to a factory that takes ``step_separator`` (math), set on a
    task with a separator of its own (arithmetic's ``;``); a task without steps (code) keeps none
    (the separator then only cuts the spans of step rewards)."""
    task = build_task(cfg.task.name, task_args(cfg, key), key)
    separator = cfg.reward.step_separator
    if separator and getattr(task, "step_separator", None) not in (None, separator):
        task.step_separator = separator
    return task


def build_task(name: str, args: Any, key: str = "task.args") -> Task:
    """The task ``name(**args)``; ConfigError naming ``task.name`` or ``key`` when it cannot be built."""
    try:
        return make_task(name, **dict(args))
    except TaskNameError as exc:  # an unknown name or a bad import path
        raise ConfigError(f"task.name: {exc}") from exc
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{key}: {exc}") from exc


def _names(cfg: Config) -> None:
    """Every registry name of ``cfg`` against its registry."""
    for key, value, valid in (
        ("policy.engine", cfg.policy.engine, ("auto", *ENGINES)),
        ("credit.estimator", cfg.credit.estimator, ESTIMATORS),
        ("credit.normaliser", cfg.credit.normaliser, NORMALISERS),
        ("loss.aggregation", cfg.loss.aggregation, AGGREGATIONS),
        ("optim.name", cfg.optim.name, OPTIMIZERS),
        ("hybrid.filter", cfg.hybrid.filter, FILTERS),
        ("hybrid.schedule", cfg.hybrid.schedule, SCHEDULES),
        ("value.source", cfg.value.source, VALUE_SOURCES),
        ("prm.labeler", cfg.prm.labeler, LABELERS),
        ("prm.mc_mode", cfg.prm.mc_mode, MC_MODES),
        ("prm.combine", cfg.prm.combine, COMBINES),
        ("prm.format", cfg.prm.format, PRM_FORMATS),
    ):
        one_of(key, value, valid)
    for name in cfg.prm.vote_labelers.split(","):
        one_of("prm.vote_labelers", name.strip(), sorted(set(LABELERS) - {"vote"}))
    h = cfg.hybrid
    if not h.dense_source and (h.schedule != "constant" or h.calibrate or h.dense_granularity):
        raise ConfigError(
            "hybrid.schedule/calibrate/dense_granularity: these weight a second reward source; "
            "set hybrid.dense_source (e.g. oracle_steps)"
        )


def _device(cfg: Config) -> None:
    p = cfg.policy
    if p.kernels == "numba":
        if not kernels.available():
            raise ConfigError("policy.kernels: 'numba' needs numba, which cannot be imported here; use auto or torch")
        if p.precision != "fp32" or p.dtype != "float32":
            raise ConfigError(
                f"policy.kernels: 'numba' runs float32 only, got policy.dtype={p.dtype}, "
                f"policy.precision={p.precision}; use auto or torch"
            )
    try:
        device = resolve_device(p.device)
        check_precision(p.precision, device)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    if device.type != "cpu" and p.engine == "static":
        raise ConfigError(
            f"policy.engine: the static engine is written for the CPU; on '{p.device}' use compiled, hf, vllm or auto"
        )
    if device.type != "cpu" and cfg.backend.name == "ray":
        raise ConfigError("policy.device: the Ray backend's rollout workers run on the CPU; use policy.device=cpu")
    recompute = cfg.loss.recompute_logprobs == "always" or (
        cfg.loss.recompute_logprobs == "auto" and p.precision != "fp32"
    )
    if recompute and cfg.backend.learner == "fsdp":  # its ranks would run unequal numbers of gathering forwards
        raise ConfigError(
            "loss.recompute_logprobs: not supported with backend.learner=fsdp; use backend.learner=ddp, "
            "or policy.precision=fp32 with loss.recompute_logprobs=auto|never"
        )
    if p.precision != "fp32" and cfg.backend.name == "ray":
        raise ConfigError(
            "policy.precision: the Ray backend's rollout workers sample in fp32; use policy.precision=fp32"
        )
    if p.lora_r and p.engine in ("static", "compiled"):
        raise ConfigError(
            f"policy.engine: '{p.engine}' reads plain weights and cannot run LoRA adapters; use auto or hf"
        )
    if p.engine == "vllm":
        _vllm(cfg)


def _vllm(cfg: Config) -> None:
    """policy.engine=vllm: full fine-tuning, one process, and vLLM + CUDA on this machine."""
    from creditrl.policy.engines.vllm import unavailable_message, vllm_unavailable_reason

    if cfg.policy.lora_r:
        raise ConfigError(
            "policy.engine: 'vllm' syncs plain weights and does not run LoRA adapters; "
            "use policy.lora_r=0, or policy.engine=auto or hf"
        )
    if cfg.backend.name != "local":
        raise ConfigError(
            f"policy.engine: 'vllm' runs in the trainer's process; use backend.name=local, got '{cfg.backend.name}'"
        )
    reason = vllm_unavailable_reason()
    if reason is not None:
        raise ConfigError(unavailable_message(reason))


def has_steps(cfg: Config, task: Task) -> bool:
    """Whether responses can be cut into reasoning steps (a separator or a cut function)."""
    return bool(cfg.reward.step_separator or cfg.reward.cut_fn or getattr(task, "step_separator", None))


def _source(section: str, source_name: str, granularity: str, cfg: Config, task: Task) -> str:
    """Check one reward source and its granularity; returns the granularity it resolves to."""
    key, gkey = (
        ("reward.source", "reward.granularity")
        if section == "reward"
        else ("hybrid.dense_source", "hybrid.dense_granularity")
    )
    if ":" not in source_name:  # a module:function is checked by importing it
        if source_name not in source_names() and Path(source_name).is_dir():
            raise ConfigError(
                f"{key}: '{source_name}' is a directory; name a reward model by path as rm:{source_name} "
                "(or a reward function as module:function or path/to/file.py:function)"
            )
        one_of(key, source_name, source_names())
    try:
        source = get_source(source_name)
    except ValueError as exc:
        raise ConfigError(f"{key}: {exc}") from exc
    for option in getattr(source, "requires", ()):
        value = getattr(cfg.reward, option)
        if not value:
            raise ConfigError(f"reward.{option}: source '{source_name}' needs it set")
        if option == "prm" and value != "auto" and not Path(value).is_dir():
            raise ConfigError(
                f"reward.prm: '{value}' is not a directory (write one with `creditrl prm train`, or use 'auto')"
            )
    if source_name == "implicit_prm" and cfg.backend.score_workers:
        raise ConfigError(
            f"{key}: 'implicit_prm' learns during the run and scores on the driver; set backend.score_workers=0"
        )
    if source_name == "unit_tests" and not hasattr(task, "test_results_batch"):
        raise ConfigError(
            f"{key}: 'unit_tests' needs a task with unit tests (task.name=code); task '{cfg.task.name}' has none"
        )
    if granularity:
        one_of(gkey, granularity, GRANULARITIES)
    gran = granularity or source.default_granularity
    try:
        check_granularity(source, gran)
    except ValueError as exc:
        raise ConfigError(f"{gkey}: {exc}") from exc
    if gran == "step" and not has_steps(cfg, task):
        raise ConfigError(
            f"{gkey}: 'step' needs a step separator, but task '{cfg.task.name}' has none; "
            "set reward.step_separator or reward.cut_fn"
        )
    if "prm" in getattr(source, "requires", ()) and cfg.reward.prm != "auto" and cfg.prm.format == "auto":
        detect_format(cfg.reward.prm)  # one line naming the conventions, before any model is loaded
    return gran


def _values(cfg: Config, task: Task) -> str:
    """Check the value source against the estimator and the task; returns the credit resolution."""
    source = VALUE_SOURCES[cfg.value.source]
    needs_values = "values" in requires(cfg.credit.estimator)
    if needs_values and source.kind == "none":
        raise ConfigError(
            f"credit.estimator: '{cfg.credit.estimator}' needs values; set value.source to one of "
            f"{', '.join(n for n, v in VALUE_SOURCES.items() if v.kind != 'none')}"
        )
    if not needs_values and source.kind != "none":
        raise ConfigError(
            f"value.source: '{cfg.value.source}' gives values that estimator '{cfg.credit.estimator}' "
            "never reads; use credit.estimator=gae or value.source=none"
        )
    if cfg.credit.estimator == "min_form" and cfg.credit.gamma != 1.0:
        raise ConfigError(
            "credit.gamma: min_form credit takes the minimum of the rewards ahead and does not discount; "
            f"set credit.gamma=1.0 (got {cfg.credit.gamma})"
        )
    resolution = cfg.credit.resolution
    if resolution == "auto":
        resolution = "step" if source.needs_steps else "token"
    if source.needs_steps and resolution != "step":
        raise ConfigError(
            f"credit.resolution: '{cfg.value.source}' values exist only at step boundaries; "
            "use credit.resolution=step (or auto)"
        )
    if resolution == "step" and not has_steps(cfg, task):
        raise ConfigError(
            f"credit.resolution/value.source: step-level credit needs steps, but task '{cfg.task.name}' "
            "has no step separator; set reward.step_separator or reward.cut_fn"
        )
    _critic_and_tree(cfg, task, source.kind)
    return resolution


def _critic_and_tree(cfg: Config, task: Task, kind: str) -> None:
    v = cfg.value
    if kind == "tree" and not (cfg.reward.step_separator or getattr(task, "step_separator", None)):
        raise ConfigError(
            "value.source: 'tree' branches where a step separator is generated; task "
            f"'{cfg.task.name}' has none, set reward.step_separator (a cut function cannot stop generation)"
        )
    if kind == "tree" and cfg.rollout.group_size != v.tree_branching**v.tree_depth:
        raise ConfigError(
            "rollout.group_size: with value.source=tree a prompt's group is its tree's leaves; it must equal "
            f"value.tree_branching ** value.tree_depth = {v.tree_branching**v.tree_depth}, got {cfg.rollout.group_size}"
        )
    if cfg.policy.lora_r and kind == "critic" and v.model == "shared":
        raise ConfigError(
            "value.model: a shared critic trains the policy's trunk, which LoRA freezes; use value.model=separate"
        )
    if v.backbone not in ("", "policy") and (kind != "critic" or v.model != "separate"):
        raise ConfigError("value.backbone: only a separate critic has a backbone of its own (value.model=separate)")
    if kind != "critic" and v.warmup_iterations:
        raise ConfigError("value.warmup_iterations: only a learned critic has a warm-up; set it to 0")
    if kind != "critic" and v.pretrain_iterations:
        raise ConfigError(
            "value.pretrain_iterations: only a learned critic is pretrained (value.source=critic or dual_critic); "
            "set it to 0"
        )
    if kind != "critic" and cfg.credit.lam_critic is not None:
        raise ConfigError(
            "credit.lam_critic: the returns' lambda is what a learned critic trains on; with value.source="
            f"'{cfg.value.source}' nothing does, set it to null"
        )
    if cfg.credit.lam_alpha and "values" not in requires(cfg.credit.estimator):
        raise ConfigError(
            f"credit.lam_alpha: estimator '{cfg.credit.estimator}' does not bootstrap on values and reads no "
            "lambda; use credit.estimator=gae or set it to 0"
        )


def start_kind(cfg: Config) -> str:
    """``train.init`` resolved: ``auto`` is ``sft`` for the embedded ``tiny`` preset (random weights
    that need the warm start) and ``policy`` for a model of the user's (RL starts from it at once)."""
    if cfg.train.init != "auto":
        return cfg.train.init
    return "sft" if cfg.policy.model == "tiny" else "policy"


def check(cfg: Config, task: Task) -> Config:
    """``cfg`` checked against the registries and ``task``, with its light defaults resolved.

    Raises ConfigError on the first problem. Resolving is idempotent: a checked config checks
    to itself (a run directory's ``config.yaml`` loads back to the run's config)."""
    _names(cfg)
    _device(cfg)
    if cfg.train.push_to_hub and cfg.policy.local_files_only:
        raise ConfigError(
            f"train.push_to_hub: uploading to {cfg.train.push_to_hub!r} needs the network; set "
            "policy.local_files_only=false too"
        )
    granularity = _source("reward", cfg.reward.source, cfg.reward.granularity, cfg, task)
    for extra in cfg.reward.sources:
        _source("reward", extra, "", cfg, task)
    dense = ""
    if cfg.hybrid.dense_source:
        dense = _source("hybrid", cfg.hybrid.dense_source, cfg.hybrid.dense_granularity, cfg, task)
    resolution = _values(cfg, task)
    p = cfg.policy
    numba = p.dtype == "float32" and p.precision == "fp32" and kernels.available()
    recompute = cfg.loss.recompute_logprobs
    if recompute == "auto":
        recompute = "never" if p.precision == "fp32" else "always"
    return cfg.updated(
        {
            "policy": {
                "device": p.device if p.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu"),
                "kernels": p.kernels if p.kernels != "auto" else ("numba" if numba else "torch"),
            },
            "reward": {
                "granularity": granularity,
                "step_separator": cfg.reward.step_separator or getattr(task, "step_separator", None),
            },
            "hybrid": {"dense_granularity": dense},
            "credit": {"resolution": resolution},
            "loss": {
                "recompute_logprobs": recompute,
                "clip_eps_high": cfg.loss.clip_eps if cfg.loss.clip_eps_high is None else cfg.loss.clip_eps_high,
            },
            "value": {"backbone": cfg.value.backbone or "policy"},
            "train": {"threads": cfg.train.threads or torch.get_num_threads(), "init": start_kind(cfg)},
            "task": {"args": task_args(cfg)},
            "sft": {"task_args": task_args(cfg, "sft.task_args") if cfg.sft.task_args else {}},
        }
    )


def resolve_run(cfg: Config, task: Task | None = None) -> tuple[Config, Task, Task | None]:
    """The one resolution a run's build makes: its task (``task`` when given), the config checked
    against it (:func:`check`), and the SFT warm start's task when ``train.init`` resolves to
    ``sft`` (``sft.task_args``' task, or the run's own; None otherwise)."""
    task = task or run_task(cfg)
    cfg = check(cfg, task)
    sft_task = None
    if cfg.train.init == "sft":
        sft_task = run_task(cfg, "sft.task_args") if cfg.sft.task_args else task
    return cfg, task, sft_task


def checked(cfg: Config) -> Config:
    """:func:`check` with the task built here, and the SFT task's arguments checked too (a caller
    that builds a run passes its own task to :func:`check`)."""
    task = run_task(cfg)
    if cfg.sft.task_args:
        run_task(cfg, "sft.task_args")
    return check(cfg, task)
