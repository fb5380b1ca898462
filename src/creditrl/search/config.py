"""The search configuration: one typed dataclass for every method, validated with clear errors."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any, Sequence

import yaml

from creditrl.config import ConfigError
from creditrl.prm.metrics import AGGREGATIONS, SELECTORS

METHOD_NAMES = ("greedy", "best_of_n", "beam", "mcts")
LEAF_VALUES = ("prm", "rollout_orm", "rollout_oracle")


@dataclass(frozen=True)
class SearchConfig:
    """How to search. Fields not used by ``method`` are ignored."""

    method: str = "greedy"  # greedy | best_of_n | beam | mcts
    budget: int = 1024  # generated tokens per problem, every engine token counted (>= 1)
    max_new_tokens: int = 96  # longest response; 7-op arithmetic solutions take up to ~90
    temperature: float = 1.0  # sampling temperature of best_of_n samples, expansions and rollouts
    top_p: float = 1.0
    seed: int = 0  # seeds the generator all engine calls draw from
    n: int = 8  # best_of_n: samples per problem
    selector: str = "prm_min"  # best_of_n: a creditrl.prm.metrics.SELECTORS name
    width: int = 4  # beam: W live partial solutions per problem
    expansions: int = 4  # beam, mcts: E one-step samples per expanded partial solution
    min_request_tokens: int = 16  # beam, mcts: send an expansion/rollout only if it can get this many tokens
    aggregation: str = "min"  # beam, mcts (leaf_value=prm): step scores -> partial-solution score
    simulations: int = 100  # mcts: most simulations per problem (the budget usually stops it first)
    c_puct: float = 1.0  # mcts: exploration weight in PUCT
    leaf_value: str = "prm"  # mcts: prm | rollout_orm | rollout_oracle (upper bound: uses the answer key)
    rollouts: int = 1  # mcts rollout_*: K rollouts to the end per evaluated node

    def validate(self) -> "SearchConfig":
        """Return self, or raise ConfigError (a ValueError) naming the bad field and what it expects."""
        def need(ok: bool, message: str) -> None:
            if not ok:
                raise ConfigError(message)

        need(self.method in METHOD_NAMES,
             f"unknown search method '{self.method}'; expected one of: {', '.join(METHOD_NAMES)}")
        need(self.budget >= 1, f"budget must be >= 1 generated token per problem, got {self.budget}")
        need(self.max_new_tokens >= 1, f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        need(self.temperature >= 0, f"temperature must be >= 0, got {self.temperature}")
        need(0 < self.top_p <= 1, f"top_p must be in (0, 1], got {self.top_p}")
        for name in ("n", "width", "expansions", "min_request_tokens", "simulations", "rollouts"):
            need(getattr(self, name) >= 1, f"{name} must be >= 1, got {getattr(self, name)}")
        need(self.selector in SELECTORS,
             f"selector: unknown best-of-N selector '{self.selector}'; expected one of: {', '.join(sorted(SELECTORS))}")
        need(self.aggregation in AGGREGATIONS,
             f"aggregation: unknown value '{self.aggregation}'; expected one of: {', '.join(sorted(AGGREGATIONS))}")
        need(self.c_puct >= 0, f"c_puct must be >= 0, got {self.c_puct}")
        need(self.leaf_value in LEAF_VALUES,
             f"leaf_value: unknown value '{self.leaf_value}'; expected one of: {', '.join(LEAF_VALUES)}")
        return self

    @property
    def needs_prm(self) -> bool:
        """beam, mcts with leaf_value=prm, and best_of_n with a prm_* selector score steps with a PRM."""
        return (self.method == "beam" or (self.method == "mcts" and self.leaf_value == "prm")
                or (self.method == "best_of_n" and self.selector.startswith("prm_")))

    @property
    def needs_orm(self) -> bool:
        """best_of_n with selector=orm and mcts with leaf_value=rollout_orm judge solutions with an ORM."""
        return ((self.method == "best_of_n" and self.selector == "orm")
                or (self.method == "mcts" and self.leaf_value == "rollout_orm"))

    def describe(self) -> str:
        """The settings that matter for ``method``, e.g. ``width=4 expansions=4 aggregation=min``."""
        keys = {
            "greedy": (),
            "best_of_n": ("n", "selector", "temperature"),
            "beam": ("width", "expansions", "aggregation", "temperature"),
            "mcts": ("leaf_value", "expansions", "c_puct", "simulations", "temperature")
            + (("aggregation",) if self.leaf_value == "prm" else ("rollouts",)),
        }[self.method]
        return " ".join(f"{k}={getattr(self, k)}" for k in keys)


def with_overrides(cfg: SearchConfig, pairs: Sequence[str]) -> SearchConfig:
    """``cfg`` with ``key=value`` overrides (values parsed as YAML, then type-checked), validated.

    Raises:
        ConfigError: On a pair without ``=``, an unknown key (listing the valid ones) or a value
            of the wrong type.
    """
    types = {f.name: f.type for f in fields(SearchConfig)}
    changes: dict[str, Any] = {}
    for pair in pairs:
        if "=" not in pair:
            raise ConfigError(f"--set expects key=value, got '{pair}'")
        key, raw = (s.strip() for s in pair.split("=", 1))
        if key not in types:
            raise ConfigError(f"--set: unknown search setting '{key}'; valid: {', '.join(sorted(types))}")
        value = yaml.safe_load(raw)
        kind = {"int": int, "float": float, "str": str}[types[key]]
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if kind is str and not isinstance(value, str):
            value = str(value)
        if not isinstance(value, kind) or isinstance(value, bool):
            raise ConfigError(f"--set {key}: expected {types[key]}, got {raw!r}")
        changes[key] = value
    return replace(cfg, **changes).validate()
