"""Typed configuration: dataclasses per component, YAML files, ``--set key=value`` overrides.

Loading is strict: an unknown section or key fails with the list of valid ones, a value of the
wrong type names the key and the expected type, and names (estimator, reward source, ...) are
checked against their registries in :func:`validate`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import types
import typing
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml


class ConfigError(ValueError):
    """A configuration problem; the message names the key and what was expected."""


class _Loader(yaml.SafeLoader):
    """SafeLoader that also reads ``1e-4`` as a float (YAML 1.1 needs a dot: ``1.0e-4``)."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."),
)


def _yaml(text: str) -> Any:
    return yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass


@dataclass
class PolicyConfig:
    model: str = "tiny"  # "tiny" (built locally) or a local save_pretrained directory
    init_seed: int = 0  # seed of the tiny model's random initialisation


@dataclass
class TaskConfig:
    name: str = "arithmetic"  # a registered task
    args: dict[str, Any] = field(default_factory=lambda: {"min_ops": 4, "max_ops": 6})  # task constructor kwargs


@dataclass
class SFTConfig:
    steps: int = 1500  # optimizer steps of supervised warm start
    batch_size: int = 64  # problems per step
    lr: float = 2e-3  # peak learning rate (linear warm-up, cosine decay)
    warmup_steps: int = 100
    weight_decay: float = 0.01
    task_args: dict[str, Any] = field(default_factory=lambda: {"min_ops": 1, "max_ops": 6})  # SFT problem mix
    seed: int = 0


@dataclass
class RolloutConfig:
    prompts_per_iter: int = 16  # distinct prompts per RL iteration
    group_size: int = 8  # samples per prompt (G)
    max_new_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0


@dataclass
class RewardConfig:
    source: str = "outcome"  # a registered reward source: outcome | oracle_steps
    on_error: str = "raise"  # raise | zero | skip: what a failing or NaN reward does


@dataclass
class CreditConfig:
    estimator: str = "grpo"  # reinforce | reinforce_baseline | rloo | grpo | dr_grpo | grpo_process
    normaliser: str = "none"  # none | batch | group (whitening after the estimator)
    gamma: float = 1.0
    lam: float = 1.0


@dataclass
class LossConfig:
    clip_eps: float = 0.2
    clip_eps_high: float | None = None  # asymmetric upper clip (DAPO clip-higher); None = clip_eps
    dual_clip: float | None = None
    kl_coef: float = 0.0  # weight of KL(pi || pi_ref) as a loss term; 0 disables the reference model
    kl_estimator: str = "k3"
    aggregation: str = "token-mean"
    entropy_coef: float = 0.0


@dataclass
class OptimConfig:
    lr: float = 5e-5
    warmup_iterations: int = 0  # linear lr warm-up; Adam's first steps are sign-like and noisy in RL
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    ppo_epochs: int = 1  # passes over each batch
    minibatches: int = 1  # optimizer steps per pass


@dataclass
class TrainConfig:
    iterations: int = 100
    eval_every: int = 10  # held-out greedy evaluation every N iterations (and at 0 and the end)
    eval_size: int = 256  # held-out problems per evaluation
    checkpoint_every: int = 50
    seed: int = 0
    init: str = "sft"  # "sft" (cached warm start), "policy" (policy.model as is) or a checkpoint dir
    threads: int = 0  # torch intra-op threads; 0 = leave torch's default
    progress: bool = True


@dataclass
class Config:
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    credit: CreditConfig = field(default_factory=CreditConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def dump(self, path: Path) -> None:
        path.write_text(yaml.safe_dump(self.to_dict(), sort_keys=False))


def _check_type(key: str, value: Any, hint: Any) -> Any:
    """Coerce ``value`` to the annotated type or raise a ConfigError naming ``key``."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(hint)
        if value is None and type(None) in args:
            return None
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _check_type(key, value, arg)
            except ConfigError:
                continue
        raise ConfigError(f"{key}: expected {hint}, got {value!r}")
    if origin is dict or hint is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping, got {value!r}")
        return dict(value)
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key}: expected true/false, got {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key}: expected an integer, got {value!r}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key}: expected a number, got {value!r}")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key}: expected a string, got {value!r}")
        return value
    return value


def _build(cls: type, data: dict[str, Any], prefix: str) -> Any:
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(data) - set(names))
    if unknown:
        where = f"section '{prefix}'" if prefix else "the top level"
        raise ConfigError(f"unknown key '{unknown[0]}' in {where}; valid keys: {', '.join(names)}")
    kwargs = {}
    for name, value in data.items():
        key = f"{prefix}.{name}" if prefix else name
        hint = hints[name]
        if dataclasses.is_dataclass(hint):
            if not isinstance(value, dict):
                raise ConfigError(f"{key}: expected a mapping of {hint.__name__} keys, got {value!r}")
            kwargs[name] = _build(hint, value, key)
        else:
            kwargs[name] = _check_type(key, value, hint)
    return cls(**kwargs)


def merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """Recursive update: mappings merge key by key (``task.args`` too), other values replace."""
    out = dict(base)
    for k, v in over.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def parse_overrides(pairs: list[str]) -> dict[str, Any]:
    """``["credit.estimator=rloo", "optim.lr=1e-4"]`` -> nested dict; values parsed as YAML."""
    out: dict[str, Any] = {}
    for pair in pairs:
        if "=" not in pair:
            raise ConfigError(f"--set expects key=value, got '{pair}'")
        key, raw = pair.split("=", 1)
        parts = key.strip().split(".")
        node = out
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = _yaml(raw)
    return out


def load_config(path: str | Path | None = None, overrides: list[str] | dict[str, Any] | None = None) -> Config:
    """Defaults <- YAML file <- overrides (mappings merge key by key), then type-checked and validated."""
    data: dict[str, Any] = asdict(Config())
    if path is not None:
        p = Path(path)
        if not p.exists():
            raise ConfigError(f"config file not found: {p}")
        try:
            loaded = _yaml(p.read_text()) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"{p}: not valid YAML: {exc}") from exc
        if not isinstance(loaded, dict):
            raise ConfigError(f"{p}: expected a mapping of sections at the top level")
        data = merge(data, loaded)
    if overrides:
        over = parse_overrides(overrides) if isinstance(overrides, list) else overrides
        data = merge(data, over)
    cfg = _build(Config, data, "")
    validate(cfg)
    return cfg


def config_hash(obj: Any) -> str:
    """Stable short hash of a JSON-serialisable object (cache keys)."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _one_of(key: str, value: str, valid: typing.Iterable[str]) -> None:
    valid = sorted(valid)
    if value not in valid:
        raise ConfigError(f"{key}: unknown value '{value}'; valid: {', '.join(valid)}")


def _positive(key: str, value: float, allow_zero: bool = False) -> None:
    if value < 0 or (value == 0 and not allow_zero):
        raise ConfigError(f"{key}: must be {'>= 0' if allow_zero else '> 0'}, got {value}")


def validate(cfg: Config) -> None:
    """Check names against the registries and numeric ranges; raise ConfigError on the first problem."""
    from creditrl.credit import ESTIMATORS, NORMALISERS
    from creditrl.losses import AGGREGATIONS, KL_ESTIMATORS
    from creditrl.rewards.sources import ERROR_POLICIES, REWARD_SOURCES
    from creditrl.tasks import TASKS, make_task

    _one_of("task.name", cfg.task.name, TASKS)
    for key, args in (("task.args", cfg.task.args), ("sft.task_args", cfg.sft.task_args)):
        try:
            make_task(cfg.task.name, **args)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{key}: {exc}") from exc
    _one_of("credit.estimator", cfg.credit.estimator, ESTIMATORS)
    _one_of("credit.normaliser", cfg.credit.normaliser, NORMALISERS)
    _one_of("reward.source", cfg.reward.source, REWARD_SOURCES)
    _one_of("reward.on_error", cfg.reward.on_error, ERROR_POLICIES)
    _one_of("loss.aggregation", cfg.loss.aggregation, AGGREGATIONS)
    _one_of("loss.kl_estimator", cfg.loss.kl_estimator, KL_ESTIMATORS)
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
    ):
        _positive(key, value)
    for key, value in (
        ("train.iterations", cfg.train.iterations),
        ("sft.steps", cfg.sft.steps),
        ("loss.kl_coef", cfg.loss.kl_coef),
        ("rollout.temperature", cfg.rollout.temperature),
        ("train.threads", cfg.train.threads),
        ("optim.warmup_iterations", cfg.optim.warmup_iterations),
    ):
        _positive(key, value, allow_zero=True)
    if not 0 < cfg.rollout.top_p <= 1:
        raise ConfigError(f"rollout.top_p: must be in (0, 1], got {cfg.rollout.top_p}")
    if not 0 < cfg.loss.clip_eps < 1:
        raise ConfigError(f"loss.clip_eps: must be in (0, 1), got {cfg.loss.clip_eps}")
    if cfg.rollout.prompts_per_iter * cfg.rollout.group_size < cfg.optim.minibatches:
        raise ConfigError("optim.minibatches: more minibatches than responses per iteration")
    source = REWARD_SOURCES[cfg.reward.source]
    if source.granularity == "step" and getattr(make_task(cfg.task.name, **cfg.task.args), "step_separator", None) is None:
        raise ConfigError(f"reward.source: '{cfg.reward.source}' needs steps, but task '{cfg.task.name}' has no step separator")
