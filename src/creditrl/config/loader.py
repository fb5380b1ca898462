"""Loading: defaults <- YAML file <- ``--set key=value`` overrides, validated by the schema
(:mod:`.validation`: the first problem as one ConfigError line). Registry names are checked when
the run is built (:mod:`creditrl.train.build`).
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

MAX_YAML_BYTES = 4 * 2**20
"""The largest YAML file read (a config, a grid or a finding file is a few kB)."""

MAX_YAML_VALUES = 100_000
"""The most values (scalars, lists and mappings) a YAML document may hold once its aliases are
expanded: an anchor reused a few times is fine, a "billion laughs" document is not."""

MAX_YAML_DEPTH = 100
"""How deeply a YAML document's lists and mappings may nest."""


class _Refused(yaml.YAMLError):
    """A document this loader does not build: aliases that expand too far or refer to themselves,
    or nesting too deep. ``mark`` is where it was found."""

    def __init__(self, message: str, mark: yaml.Mark | None) -> None:
        super().__init__(message)
        self.mark = mark


class _Loader(yaml.SafeLoader):
    """SafeLoader that also reads ``1e-4`` as a float (YAML 1.1 needs a dot: ``1.0e-4``) and refuses
    a document whose aliases expand it past :data:`MAX_YAML_VALUES` values or into a cycle, or that
    nests deeper than :data:`MAX_YAML_DEPTH`. The check runs on the composed node graph, where an
    alias is the anchored node itself, before any Python object is built."""

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            self.aliases.append((event.anchor, event.start_mark))
        return super().compose_node(parent, index)

    def compose_document(self) -> yaml.Node:
        self.aliases: list[tuple[str, yaml.Mark]] = []
        node = super().compose_document()
        _check_expansion(node, self.aliases)
        return node


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."),
)


def _check_expansion(root: yaml.Node, aliases: list[tuple[str, yaml.Mark]]) -> None:
    """Raise :class:`_Refused` for the limits :class:`_Loader` names (``aliases``: the aliases
    met, in order). Each node is sized once."""
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()
    first = f"the first, *{aliases[0][0]}, at line {aliases[0][1].line + 1}" if aliases else ""

    def size(node: yaml.Node, depth: int) -> int:
        if id(node) in sizes:
            return sizes[id(node)]
        if id(node) in open_nodes:
            raise _Refused(f"a YAML alias refers to a value that holds it ({first})", node.start_mark)
        if depth > MAX_YAML_DEPTH:
            raise _Refused(f"YAML lists and mappings nested more than {MAX_YAML_DEPTH} deep", node.start_mark)
        total = 1
        if isinstance(node, (yaml.SequenceNode, yaml.MappingNode)):
            open_nodes.add(id(node))
            children = node.value if isinstance(node, yaml.SequenceNode) else [n for pair in node.value for n in pair]
            for child in children:
                total += size(child, depth + 1)
                if total > MAX_YAML_VALUES and aliases:
                    raise _Refused(
                        f"YAML aliases expand the document to more than {MAX_YAML_VALUES} values "
                        f"({len(aliases)} aliases; {first}); write the values out, or reuse fewer",
                        aliases[0][1],
                    )
            open_nodes.discard(id(node))
        sizes[id(node)] = total
        return total

    size(root, 1)


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """A PyYAML error as one line: ``line L, column C: problem`` (what PyYAML prints over several lines)."""
    if isinstance(exc, _Refused):
        line = f"line {exc.mark.line + 1}: " if exc.mark else ""
        return f"{line}{exc}"
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        context = f" ({exc.context})" if exc.context else ""
        return f"{where}not valid YAML: {exc.problem}{context}"
    return f"not valid YAML: {' '.join(str(exc).split())}"


def load_yaml(text: str, where: str) -> Any:
    """``text`` parsed as YAML, the one way every YAML a user hands in is read (configs, ``--set``
    values, grid and finding files). A problem (invalid YAML with its line and column, or one that
    :class:`_Loader` refuses) is one :class:`ConfigError` line starting with ``where``."""
    try:
        return yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        problem = _yaml_problem(exc)
        raise ConfigError(f"{where}, {problem}" if problem.startswith("line ") else f"{where}: {problem}") from None
    except RecursionError:  # the composer recurses once per level: deeper than the interpreter's stack
        raise ConfigError(f"{where}: YAML lists and mappings nested more than {MAX_YAML_DEPTH} deep") from None


def read_yaml_file(path: str | Path, kind: str = "YAML") -> Any:
    """The YAML document in ``path`` (:func:`load_yaml`); ConfigError naming ``kind`` when the file
    is missing, and the file when it is over :data:`MAX_YAML_BYTES`, unreadable or not UTF-8."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{kind} file not found: {p}")
    size = p.stat().st_size
    if size > MAX_YAML_BYTES:
        raise ConfigError(f"{p}: {size} bytes, over the {MAX_YAML_BYTES}-byte limit of a {kind} file")
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{p}: cannot read it: {getattr(exc, 'strerror', None) or exc}") from None
    return load_yaml(text, str(p))


# ----------------------------------------------------------------------------- layers


def merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """Recursive update: mappings merge key by key (``task.args`` too), other values replace."""
    out = dict(base)
    for k, v in over.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def merge_layer(data: dict[str, Any], layer: dict[str, Any]) -> dict[str, Any]:
    """:func:`merge` one config layer (a file or the overrides) into ``data``; a layer that
    switches ``task.name`` first drops the previous task's ``task.args`` and ``sft.task_args``."""
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
        node[parts[-1]] = load_yaml(raw, f"--set {key.strip()}")
    return out


def read_yaml(path: str | Path) -> dict[str, Any]:
    """The sections of a YAML config file (:func:`read_yaml_file`); ConfigError when it is missing,
    invalid, refused or not a mapping."""
    loaded = read_yaml_file(path, "config") or {}
    if not isinstance(loaded, dict):
        raise ConfigError(f"{path}: expected a mapping of sections at the top level")
    return loaded


def load_config(path: str | Path | None = None, overrides: list[str] | dict[str, Any] | None = None) -> Config:
    """Defaults <- YAML file <- overrides (:func:`merge_layer`), validated by the schema; frozen."""
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
    ``benchmarks/bench.py`` start from; under ``quick`` the demo's smoke-test sizes."""
    return packaged_config("demo_quick" if quick else "arith")
