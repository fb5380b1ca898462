"""Validation at load time: names against their registries, numeric ranges, and combinations.

The axes of a run (``reward.granularity``, ``credit.estimator``, ``value.source``,
``credit.normaliser``, ``loss.*``) are named independently; every combination that makes sense
runs, and one that does not fails here, before anything is sampled, with a message saying why.
"""

from __future__ import annotations

import typing
from pathlib import Path

from creditrl.config.schema import Config, ConfigError


def _one_of(key: str, value: str, valid: typing.Iterable[str]) -> None:
    valid = sorted(valid)
    if value not in valid:
        raise ConfigError(f"{key}: unknown value '{value}'; valid: {', '.join(valid)}")


def _positive(key: str, value: float, allow_zero: bool = False) -> None:
    if value < 0 or (value == 0 and not allow_zero):
        raise ConfigError(f"{key}: must be {'>= 0' if allow_zero else '> 0'}, got {value}")


def _unit(key: str, value: float, *, open_low: bool = False) -> None:
    if not (0 < value <= 1 if open_low else 0 <= value <= 1):
        raise ConfigError(f"{key}: must lie in {'(0, 1]' if open_low else '[0, 1]'}, got {value}")


def resolved_granularity(source_name: str, granularity: str) -> str:
    """``granularity`` or, when empty, the source's default one."""
    from creditrl.rewards.sources import get_source

    return granularity or get_source(source_name).default_granularity


def resolved_resolution(cfg: Config) -> str:
    """``credit.resolution`` with ``auto`` resolved: step for values that exist only at steps."""
    from creditrl.values.registry import VALUE_SOURCES

    if cfg.credit.resolution != "auto":
        return cfg.credit.resolution
    return "step" if VALUE_SOURCES[cfg.value.source].needs_steps else "token"


def has_steps(cfg: Config) -> bool:
    """Whether responses can be cut into reasoning steps (a separator or a cut function)."""
    from creditrl.tasks import make_task

    if cfg.reward.step_separator or cfg.reward.cut_fn:
        return True
    return getattr(make_task(cfg.task.name, **cfg.task.args), "step_separator", None) is not None


def _check_source(key: str, source_name: str, granularity: str, cfg: Config) -> None:
    from creditrl.rewards.placement import GRANULARITIES
    from creditrl.rewards.sources import check_granularity, get_source, source_names

    _one_of(f"{key}.source" if key == "reward" else "hybrid.dense_source", source_name, source_names())
    for option in getattr(get_source(source_name), "requires", ()):
        value = getattr(cfg.reward, option)
        if not value:
            raise ConfigError(f"reward.{option}: source '{source_name}' needs it set")
        if option == "prm" and value != "auto" and not Path(value).is_dir():
            raise ConfigError(
                f"reward.prm: '{value}' is not a directory (write one with `creditrl prm train`, or use 'auto')"
            )
    if source_name == "unit_tests":
        from creditrl.tasks import make_task

        if not hasattr(make_task(cfg.task.name, **cfg.task.args), "test_results_batch"):
            raise ConfigError(
                f"{key}.source: 'unit_tests' needs a task with unit tests (task.name=code); "
                f"task '{cfg.task.name}' has none"
            )
    gkey = "reward.granularity" if key == "reward" else "hybrid.dense_granularity"
    if granularity:
        _one_of(gkey, granularity, GRANULARITIES)
    gran = resolved_granularity(source_name, granularity)
    try:
        check_granularity(get_source(source_name), gran)
    except ValueError as exc:
        raise ConfigError(f"{gkey}: {exc}") from exc
    if gran == "step" and not has_steps(cfg):
        raise ConfigError(
            f"{gkey}: 'step' needs a step separator, but task '{cfg.task.name}' has none; "
            "set reward.step_separator or reward.cut_fn"
        )


def _check_device(cfg: Config) -> None:
    from creditrl.policy.device import PRECISIONS, check_precision, resolve_device

    _one_of("policy.precision", cfg.policy.precision, PRECISIONS)
    _one_of("loss.recompute_logprobs", cfg.loss.recompute_logprobs, ("auto", "always", "never"))
    try:
        device = resolve_device(cfg.policy.device)
        check_precision(cfg.policy.precision, device)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    if device.type != "cpu" and cfg.policy.engine == "static":
        raise ConfigError(
            f"policy.engine: the static engine is written for the CPU; on '{cfg.policy.device}' use hf, vllm or auto"
        )
    if device.type != "cpu" and cfg.backend.name == "ray":
        raise ConfigError("policy.device: the Ray backend's rollout workers run on the CPU; use policy.device=cpu")
    recompute = cfg.loss.recompute_logprobs == "always" or (
        cfg.loss.recompute_logprobs == "auto" and cfg.policy.precision != "fp32"
    )
    if recompute and cfg.backend.learner == "fsdp":  # its ranks would run unequal numbers of gathering forwards
        raise ConfigError(
            "loss.recompute_logprobs: not supported with backend.learner=fsdp; use backend.learner=ddp, "
            "or policy.precision=fp32 with loss.recompute_logprobs=auto|never"
        )
    if cfg.policy.precision != "fp32" and cfg.backend.name == "ray":
        raise ConfigError("policy.precision: the Ray backend's rollout workers sample in fp32; use policy.precision=fp32")


def _check_ranges(cfg: Config) -> None:
    for key, value in (
        ("rollout.prompts_per_iter", cfg.rollout.prompts_per_iter),
        ("rollout.group_size", cfg.rollout.group_size),
        ("rollout.max_new_tokens", cfg.rollout.max_new_tokens),
        ("optim.lr", cfg.optim.lr),
        ("optim.ppo_epochs", cfg.optim.ppo_epochs),
        ("optim.minibatches", cfg.optim.minibatches),
        ("train.eval_every", cfg.train.eval_every),
        ("train.eval_size", cfg.train.eval_size),
        ("train.checkpoint_every", cfg.train.checkpoint_every),
        ("sft.batch_size", cfg.sft.batch_size),
        ("sft.lr", cfg.sft.lr),
        ("reward.segment_tokens", cfg.reward.segment_tokens),
        ("value.lr", cfg.value.lr),
        ("value.mc_samples", cfg.value.mc_samples),
        ("value.tree_branching", cfg.value.tree_branching),
        ("value.tree_depth", cfg.value.tree_depth),
    ):
        _positive(key, value)
    for key, value in (
        ("train.iterations", cfg.train.iterations),
        ("sft.steps", cfg.sft.steps),
        ("loss.kl_coef", cfg.loss.kl_coef),
        ("rollout.temperature", cfg.rollout.temperature),
        ("train.threads", cfg.train.threads),
        ("optim.warmup_iterations", cfg.optim.warmup_iterations),
        ("shaping.length_budget", cfg.shaping.length_budget),
        ("shaping.length_coef", cfg.shaping.length_coef),
        ("shaping.overlong_cache", cfg.shaping.overlong_cache),
        ("shaping.overlong_coef", cfg.shaping.overlong_coef),
        ("shaping.kl_coef", cfg.shaping.kl_coef),
        ("hybrid.dense_weight", cfg.hybrid.dense_weight),
        ("value.coef", cfg.value.coef),
        ("value.warmup_iterations", cfg.value.warmup_iterations),
        ("train.inspect_every", cfg.train.inspect_every),
        ("train.inspect_groups", cfg.train.inspect_groups),
    ):
        _positive(key, value, allow_zero=True)
    _unit("credit.gamma", cfg.credit.gamma)
    for key, value in (("optim.beta1", cfg.optim.beta1), ("optim.beta2", cfg.optim.beta2), ("optim.momentum", cfg.optim.momentum)):
        if not 0 <= value < 1:
            raise ConfigError(f"{key}: must lie in [0, 1), got {value}")
    _positive("optim.eps", cfg.optim.eps)
    _unit("credit.lam", cfg.credit.lam)
    if cfg.credit.lam_end is not None:
        _unit("credit.lam_end", cfg.credit.lam_end)
    _unit("hybrid.filter_q", cfg.hybrid.filter_q, open_low=True)
    _unit("hybrid.switch_at", cfg.hybrid.switch_at)
    _unit("hybrid.calibration_momentum", cfg.hybrid.calibration_momentum)
    if not 0 <= cfg.hybrid.filter_lo <= cfg.hybrid.filter_hi <= 1:
        raise ConfigError(
            f"hybrid.filter_lo/filter_hi: need 0 <= lo <= hi <= 1, got [{cfg.hybrid.filter_lo}, {cfg.hybrid.filter_hi}]"
        )
    if not 0 < cfg.rollout.top_p <= 1:
        raise ConfigError(f"rollout.top_p: must be in (0, 1], got {cfg.rollout.top_p}")
    if not 0 < cfg.loss.clip_eps < 1:
        raise ConfigError(f"loss.clip_eps: must be in (0, 1), got {cfg.loss.clip_eps}")
    if cfg.value.clip_eps is not None:
        _positive("value.clip_eps", cfg.value.clip_eps)
    if cfg.shaping.overlong_cache >= cfg.rollout.max_new_tokens:
        raise ConfigError(
            f"shaping.overlong_cache: must be < rollout.max_new_tokens ({cfg.rollout.max_new_tokens}), "
            f"got {cfg.shaping.overlong_cache}"
        )
    _positive("train.max_tokens", cfg.train.max_tokens, allow_zero=True)
    _positive("policy.lora_r", cfg.policy.lora_r, allow_zero=True)
    _one_of("policy.dtype", cfg.policy.dtype, ("float32", "bfloat16", "float16"))
    _one_of("policy.chat_template", cfg.policy.chat_template, ("auto", "none"))
    if cfg.policy.lora_r:
        if not [t for t in cfg.policy.lora_targets.split(",") if t.strip()]:
            raise ConfigError("policy.lora_targets: name at least one module, e.g. q_proj,v_proj")
        if not 0 <= cfg.policy.lora_dropout < 1:
            raise ConfigError(f"policy.lora_dropout: must lie in [0, 1), got {cfg.policy.lora_dropout}")
        if cfg.policy.engine == "static":
            raise ConfigError("policy.engine: 'static' reads plain weights and cannot run LoRA adapters; use auto or hf")
    if cfg.rollout.prompts_per_iter * cfg.rollout.group_size < cfg.optim.minibatches:
        raise ConfigError("optim.minibatches: more minibatches than responses per iteration")


def _check_combinations(cfg: Config) -> None:
    from creditrl.credit import requires
    from creditrl.values.registry import VALUE_SOURCES

    needs_values = "values" in requires(cfg.credit.estimator)
    source = VALUE_SOURCES[cfg.value.source]
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
            f"credit.gamma: min_form credit takes the minimum of the rewards ahead and does not discount; "
            f"set credit.gamma=1.0 (got {cfg.credit.gamma})"
        )
    resolution = resolved_resolution(cfg)
    if source.needs_steps and resolution != "step":
        raise ConfigError(
            f"credit.resolution: '{cfg.value.source}' values exist only at step boundaries; "
            "use credit.resolution=step (or auto)"
        )
    if (resolution == "step" or source.needs_steps) and not has_steps(cfg):
        raise ConfigError(
            f"credit.resolution/value.source: step-level credit needs steps, but task '{cfg.task.name}' "
            "has no step separator; set reward.step_separator or reward.cut_fn"
        )
    from creditrl.tasks import make_task

    if source.kind == "tree" and not (
        cfg.reward.step_separator or getattr(make_task(cfg.task.name, **cfg.task.args), "step_separator", None)
    ):
        raise ConfigError(
            "value.source: 'tree' branches where a step separator is generated; task "
            f"'{cfg.task.name}' has none, set reward.step_separator (a cut function cannot stop generation)"
        )
    if source.kind == "tree" and cfg.rollout.group_size != cfg.value.tree_branching**cfg.value.tree_depth:
        raise ConfigError(
            "rollout.group_size: with value.source=tree a prompt's group is its tree's leaves; it must equal "
            f"value.tree_branching ** value.tree_depth = {cfg.value.tree_branching ** cfg.value.tree_depth}, "
            f"got {cfg.rollout.group_size}"
        )
    if cfg.policy.lora_r and source.kind == "critic" and cfg.value.model == "shared":
        raise ConfigError("value.model: a shared critic trains the policy's trunk, which LoRA freezes; use value.model=separate")
    if cfg.value.backbone and (source.kind != "critic" or cfg.value.model != "separate"):
        raise ConfigError("value.backbone: only a separate critic has a backbone of its own (value.model=separate)")
    if source.kind != "critic" and cfg.value.warmup_iterations:
        raise ConfigError("value.warmup_iterations: only a learned critic has a warm-up; set it to 0")
    h = cfg.hybrid
    if not h.dense_source:
        if h.schedule != "constant" or h.calibrate or h.dense_granularity:
            raise ConfigError(
                "hybrid.schedule/calibrate/dense_granularity: these weight a second reward source; "
                "set hybrid.dense_source (e.g. oracle_steps)"
            )


def _check_prm(cfg: Config) -> None:
    from creditrl.prm.pipeline import LABELER_NAMES
    from creditrl.tasks.arithmetic import SPLITS

    p = cfg.prm
    _one_of("prm.labeler", p.labeler, LABELER_NAMES)
    _one_of("prm.mc_mode", p.mc_mode, ("hard", "soft"))
    _one_of("prm.combine", p.combine, ("mean", "min"))
    _one_of("prm.split", p.split, SPLITS)
    for name in p.vote_labelers.split(","):
        _one_of("prm.vote_labelers", name.strip(), ("oracle", "outcome_heuristic", "mc"))
    for key in ("problems", "samples", "mc_n", "mc_rows_per_call", "members", "steps", "batch_size", "lr"):
        _positive(f"prm.{key}", getattr(p, key))
    _positive("prm.temperature", p.temperature, allow_zero=True)
    _positive("prm.mc_temperature", p.mc_temperature, allow_zero=True)
    _unit("prm.vote_threshold", p.vote_threshold, open_low=True)
    _unit("prm.augment_rate", p.augment_rate)
    if p.max_step_tokens is not None:
        _positive("prm.max_step_tokens", p.max_step_tokens)


BACKENDS = ("local", "ray")


def _check_backend(cfg: Config) -> None:
    b = cfg.backend
    _one_of("backend.name", b.name, BACKENDS)
    _one_of("backend.learner", b.learner, ("ddp", "fsdp"))
    _positive("backend.rollout_workers", b.rollout_workers)
    _positive("backend.worker_threads", b.worker_threads)
    if b.score_workers < 0:
        raise ConfigError(f"backend.score_workers: expected >= 0, got {b.score_workers}")
    if b.max_restarts < 0:
        raise ConfigError(f"backend.max_restarts: expected >= 0, got {b.max_restarts}")


def _check_vllm(cfg: Config) -> None:
    """policy.engine=vllm: full fine-tuning, one process, and vLLM + CUDA on this machine."""
    from creditrl.policy.vllm_engine import unavailable_message, vllm_unavailable_reason

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


def validate(cfg: Config) -> None:
    """Check names against the registries, ranges and combinations; raise ConfigError on the first problem."""
    from creditrl.credit import ESTIMATORS, NORMALISERS, RESOLUTIONS
    from creditrl.losses import AGGREGATIONS, KL_ESTIMATORS
    from creditrl.train.update import OPTIMIZERS
    from creditrl.rewards.hybrid import FILTERS, SCHEDULES
    from creditrl.rewards.sources import ERROR_POLICIES
    from creditrl.tasks import make_task
    from creditrl.tasks.base import TaskNameError
    from creditrl.values.critic import CRITIC_MODELS
    from creditrl.values.registry import VALUE_SOURCES

    from creditrl.policy.static_engine import ENGINES, KERNELS

    _one_of("policy.engine", cfg.policy.engine, ENGINES)
    _one_of("policy.kernels", cfg.policy.kernels, KERNELS)
    if cfg.policy.kernels == "numba":
        from creditrl.policy import kernels

        if not kernels.available():
            raise ConfigError("policy.kernels: 'numba' needs numba, which cannot be imported here; use auto or torch")
        if cfg.policy.precision != "fp32" or cfg.policy.dtype != "float32":
            raise ConfigError(
                f"policy.kernels: 'numba' runs float32 only, got policy.dtype={cfg.policy.dtype}, "
                f"policy.precision={cfg.policy.precision}; use auto or torch"
            )
    _check_device(cfg)
    if cfg.policy.engine == "vllm":
        _check_vllm(cfg)
    for key, args in (("task.args", cfg.task.args), ("sft.task_args", cfg.sft.task_args or cfg.task.args)):
        try:
            make_task(cfg.task.name, **args)
        except TaskNameError as exc:  # an unknown name or a bad import path
            raise ConfigError(f"task.name: {exc}") from exc
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{key}: {exc}") from exc
    _one_of("credit.estimator", cfg.credit.estimator, ESTIMATORS)
    _one_of("credit.normaliser", cfg.credit.normaliser, NORMALISERS)
    _one_of("credit.resolution", cfg.credit.resolution, ("auto", *RESOLUTIONS))
    _one_of("reward.on_error", cfg.reward.on_error, ERROR_POLICIES)
    _one_of("loss.aggregation", cfg.loss.aggregation, AGGREGATIONS)
    _one_of("optim.name", cfg.optim.name, OPTIMIZERS)
    _one_of("loss.kl_estimator", cfg.loss.kl_estimator, KL_ESTIMATORS)
    _one_of("shaping.kl_estimator", cfg.shaping.kl_estimator, KL_ESTIMATORS)
    _one_of("hybrid.filter", cfg.hybrid.filter, FILTERS)
    _one_of("hybrid.schedule", cfg.hybrid.schedule, SCHEDULES)
    _one_of("value.source", cfg.value.source, VALUE_SOURCES)
    _one_of("value.model", cfg.value.model, CRITIC_MODELS)
    _check_ranges(cfg)
    _check_prm(cfg)
    _check_backend(cfg)
    _check_source("reward", cfg.reward.source, cfg.reward.granularity, cfg)
    if cfg.hybrid.dense_source:
        _check_source("hybrid", cfg.hybrid.dense_source, cfg.hybrid.dense_granularity, cfg)
    _check_combinations(cfg)
