"""Loading: defaults <- YAML file <- ``--set key=value`` overrides, strictly typed.

An unknown section or key fails with the list of valid ones and a value of the wrong type names
the key and the expected type; names and combinations are then checked by
:func:`creditrl.config.validate.validate`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import types
import typing
from dataclasses import asdict
from pathlib import Path
from typing import Any

import yaml

from creditrl.config.schema import Config, ConfigError


class _Loader(yaml.SafeLoader):
    """SafeLoader that also reads ``1e-4`` as a float (YAML 1.1 needs a dot: ``1.0e-4``)."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."),
)


def _yaml(text: str) -> Any:
    return yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass


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


def merge_layer(data: dict[str, Any], layer: dict[str, Any]) -> dict[str, Any]:
    """:func:`merge` one config layer (a file or the overrides) into ``data``; a layer that
    switches ``task.name`` first drops the previous task's ``task.args`` and ``sft.task_args``
    (they are that task's constructor arguments), then its own apply."""
    name = (layer.get("task") or {}).get("name") if isinstance(layer.get("task"), dict) else None
    if name is not None and name != data.get("task", {}).get("name"):
        data = {**data, "task": {**data["task"], "args": {}}, "sft": {**data.get("sft", {}), "task_args": {}}}
    return merge(data, layer)


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
    """Defaults <- YAML file <- overrides (mappings merge key by key; a layer naming another task
    starts that task's arguments afresh), then type-checked and validated."""
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
        data = merge_layer(data, loaded)
    if overrides:
        over = parse_overrides(overrides) if isinstance(overrides, list) else overrides
        data = merge_layer(data, over)
    cfg = _build(Config, data, "")
    from creditrl.config.validate import validate

    validate(cfg)
    return cfg


def config_hash(obj: Any) -> str:
    """Stable short hash of a JSON-serialisable object (cache keys)."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def packaged_config(name: str) -> Path:
    """A config shipped in ``creditrl/configs`` by name (``demo``, ``demo_quick``, ``arith``)."""
    from importlib import resources

    return Path(str(resources.files("creditrl") / "configs" / f"{name}.yaml"))


def demo_config_path(quick: bool) -> Path:
    """The demo's config (operands 1-3), or its smoke-test sizes under ``quick``."""
    return packaged_config("demo_quick" if quick else "demo")


def arith_config_path(quick: bool) -> Path:
    """The reference arithmetic config (operands 1-9; the demo's until 2026-11-30) that the findings
    grids, the reports and ``creditrl bench`` start from; under ``quick`` the demo's smoke-test sizes."""
    return packaged_config("demo_quick" if quick else "arith")
