"""Schema validation with one-line messages: every problem pydantic finds becomes one
:class:`~creditrl.config.errors.ConfigError` that names the key and what was expected (a near-miss
key or value gets a "did you mean")."""

from __future__ import annotations

import types
import typing
from typing import Any, TypeVar

import annotated_types
from pydantic import BaseModel, ValidationError

from creditrl.config.errors import ConfigError, did_you_mean, unknown_choice


def _field(root: type[BaseModel], loc: tuple) -> tuple[type[BaseModel] | None, str | None]:
    """The section model and field name at ``loc`` (None where it is not a model field)."""
    model: type[BaseModel] = root
    for i, part in enumerate(loc):
        info = model.model_fields.get(part) if isinstance(part, str) else None
        if info is None:
            return None, None
        if i == len(loc) - 1:
            return model, part
        sub = info.annotation
        if not (isinstance(sub, type) and issubclass(sub, BaseModel)):
            return None, None
        model = sub
    return None, None


def _bounds(model: type[BaseModel], name: str) -> str:
    """``> 0``, ``>= 0`` or ``lie in (0, 1]`` from the field's constraints."""
    lo = hi = None
    for m in model.model_fields[name].metadata:
        if isinstance(m, annotated_types.Gt):
            lo = ("(", m.gt)
        elif isinstance(m, annotated_types.Ge):
            lo = ("[", m.ge)
        elif isinstance(m, annotated_types.Lt):
            hi = (")", m.lt)
        elif isinstance(m, annotated_types.Le):
            hi = ("]", m.le)
    if lo and hi:
        return f"lie in {lo[0]}{lo[1]:g}, {hi[1]:g}{hi[0]}"
    if lo:
        return f"be {'>' if lo[0] == '(' else '>='} {lo[1]:g}"
    return f"be {'<' if hi[0] == ')' else '<='} {hi[1]:g}"


def _is_float(model: type[BaseModel] | None, name: str | None) -> bool:
    hint = model.model_fields[name].annotation if model else None
    return hint is float or float in typing.get_args(hint)


def _optional(model: type[BaseModel] | None, name: str | None) -> bool:
    hint = model.model_fields[name].annotation if model else None
    return typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in typing.get_args(hint)


_EXPECTED = {
    "int_type": "an integer",
    "int_from_float": "an integer",
    "float_type": "a number",
    "bool_type": "true/false",
    "string_type": "a string",
    "dict_type": "a mapping",
}
_RANGES = ("greater_than", "greater_than_equal", "less_than", "less_than_equal")


def _message(root: type[BaseModel], err: dict[str, Any]) -> str:
    """One pydantic error as ``key: what was expected, got value``."""
    loc = tuple(err["loc"])
    key = ".".join(str(p) for p in loc)
    kind, value = err["type"], err.get("input")
    model, name = _field(root, loc)
    if kind == "extra_forbidden":
        parent, _ = _field(root, loc[:-1]) if len(loc) > 1 else (None, None)
        section = root if len(loc) == 1 else (parent.model_fields[loc[-2]].annotation if parent else None)
        valid = list(section.model_fields) if section else []
        where = f"section '{'.'.join(map(str, loc[:-1]))}'" if len(loc) > 1 else "the top level"
        return f"unknown key '{loc[-1]}' in {where}; valid keys: {', '.join(valid)}{did_you_mean(str(loc[-1]), valid)}"
    if kind == "model_type":
        return (
            f"{key}: expected a mapping of {type(model.model_fields[name].default_factory()).__name__} keys, got "
            f"{value!r}"
        )
    if kind == "literal_error":
        choices = typing.get_args(model.model_fields[name].annotation) if model else ()
        return str(unknown_choice(key, value, choices))
    if kind in _RANGES:
        shown = float(value) if _is_float(model, name) and isinstance(value, int) else value
        return f"{key}: must {_bounds(model, name)}, got {shown}"
    if kind == "string_pattern_mismatch" and key == "policy.device":
        return f"policy.device: expected cpu, cuda, cuda:N or auto, got '{value}'"
    if kind in _EXPECTED:
        expected = _EXPECTED[kind]
        if _optional(model, name):
            expected += " or null"
        return f"{key}: expected {expected}, got {value!r}"
    if kind == "value_error":  # a model validator's own message, which names its keys
        return str(err["ctx"]["error"])
    return f"{key}: {err['msg']}, got {value!r}"


M = TypeVar("M", bound=BaseModel)


def validated(root: type[M], data: dict[str, Any]) -> M:
    """``data`` (nested sections) as a ``root`` model, or its first problem as a ConfigError."""
    try:
        return root.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_message(root, exc.errors()[0])) from None
