"""Loading: defaults <- YAML file <- ``--set key=value`` overrides, validated by the schema.

Every problem pydantic finds becomes one :class:`~creditrl.config.errors.ConfigError` line that
names the key and what was expected (the first problem; a near-miss key or value gets a
"did you mean"). Registry names and the combinations that need them are checked when the run
is built (:mod:`creditrl.train.build`).
"""

from __future__ import annotations

import hashlib
import json
import re
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from creditrl.config.errors import ConfigError
from creditrl.config.schema import Config
from creditrl.config.validation import validated


class _Loader(yaml.SafeLoader):
    """SafeLoader that also reads ``1e-4`` as a float (YAML 1.1 needs a dot: ``1.0e-4``)."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."),
)


def _yaml(text: str) -> Any:
    return yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass


# ----------------------------------------------------------------------------- layers


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
            if not isinstance(node, dict):
                raise ConfigError(f"--set {key.strip()}: '{p}' is set to a value above, not a section")
        node[parts[-1]] = _yaml(raw)
    return out


def read_yaml(path: str | Path) -> dict[str, Any]:
    """The sections of a YAML config file; ConfigError when it is missing, invalid or not a mapping."""
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"config file not found: {p}")
    try:
        loaded = _yaml(p.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{p}: not valid YAML: {exc}") from exc
    if not isinstance(loaded, dict):
        raise ConfigError(f"{p}: expected a mapping of sections at the top level")
    return loaded


def load_config(path: str | Path | None = None, overrides: list[str] | dict[str, Any] | None = None) -> Config:
    """Defaults <- YAML file <- overrides (mappings merge key by key; a layer naming another task
    starts that task's arguments afresh), validated by the schema. The result is frozen; registry
    names are checked, and defaults resolved, when a run is built from it."""
    data: dict[str, Any] = Config().to_dict()
    if path is not None:
        data = merge_layer(data, read_yaml(path))
    if overrides:
        over = parse_overrides(overrides) if isinstance(overrides, list) else overrides
        data = merge_layer(data, over)
    return validated(Config, data)


def config_hash(obj: Any) -> str:
    """Stable short hash of a JSON-serialisable object (cache keys)."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def packaged_config(name: str) -> Path:
    """A config shipped in ``creditrl/configs`` by name (``demo``, ``demo_quick``, ``arith``)."""
    return Path(str(resources.files("creditrl") / "configs" / f"{name}.yaml"))


def demo_config_path(quick: bool) -> Path:
    """The demo's config (operands 1-3), or its smoke-test sizes under ``quick``."""
    return packaged_config("demo_quick" if quick else "demo")


def arith_config_path(quick: bool) -> Path:
    """The reference arithmetic config (operands 1-9) that the findings grids, the reports and
    ``creditrl bench`` start from; under ``quick`` the demo's smoke-test sizes."""
    return packaged_config("demo_quick" if quick else "arith")
