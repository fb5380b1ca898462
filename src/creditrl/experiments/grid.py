"""Grid files of ``creditrl compare``: parsed, validated and expanded into arms (the format is in
docs/compare.md; :data:`KEY_HELP` lists the keys)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from creditrl.config import ConfigError, load_config
from creditrl.config.loader import arith_config_path, demo_config_path, packaged_config, read_yaml_file
from creditrl.experiments.grid_keys import KEY_HELP
from creditrl.train.resolve import checked, start_kind

KEYS = set(KEY_HELP)
INITS = ("auto", "policy", "sft")
PACKAGED = ("demo", "demo_quick", "arith", "chain", "paths")  # creditrl/configs, named in a grid's base
TOKEN_ITERATIONS = 1_000_000
# --quick: demo_quick sizes on any base, a tiny budget, 2 seeds (numbers meaningless)
QUICK_SET = [
    "sft.steps=20",
    "sft.batch_size=16",
    "sft.warmup_steps=5",
    "rollout.prompts_per_iter=4",
    "rollout.group_size=4",
    "rollout.max_new_tokens=40",
    "train.eval_every=1",
    "train.eval_size=16",
    "train.checkpoint_every=1000",
]
QUICK_BUDGET = {"tokens": 600, "samples": 32}


@dataclass(kw_only=True)
class Grid:
    """A comparison grid (a grid file, :func:`load_grid`, or one made in code): every arm's runs,
    one per seed, from ``base`` + ``common`` + the arm's overrides, each up to ``budget``."""

    base: Path
    arms: dict[str, list[str]]
    seeds: list[int]
    budget: int
    name: str = "grid"
    common: list[str] = field(default_factory=list)
    unit: str = "tokens"  # tokens | samples
    target: float | None = None  # absolute accuracy target, or None when gain is set
    gain: float | None = None  # target = the arm's start accuracy + gain
    init: str = "sft"  # resolved: sft, policy or a checkpoint directory
    reference: str | None = None  # the arm every other is compared with, problem by problem
    sft_seeds: dict[int, int] = field(default_factory=dict)  # RL seed -> the sft.seed of its start (init: sft)
    # an arm's own seeds, where a report of a grid whose seeds are still running gives it fewer
    arm_seeds: dict[str, list[int]] = field(default_factory=dict)

    def seeds_of(self, arm: str) -> list[int]:
        """The seeds of ``arm``'s runs: :attr:`arm_seeds` where it names the arm, else :attr:`seeds`."""
        return self.arm_seeds.get(arm, self.seeds)


def run_common(grid: Grid) -> list[str]:
    """The overrides every run of ``grid`` takes before its arm's: (for a tokens budget, which is to
    stop the run) ``TOKEN_ITERATIONS`` iterations, then ``common``."""
    return ([f"train.iterations={TOKEN_ITERATIONS}"] if grid.unit == "tokens" else []) + list(grid.common)


def _value_text(v: Any) -> str:
    """An override's value as YAML text (``gae``, ``0.5``, ``{min_ops: 5, max_ops: 7}``)."""
    if isinstance(v, str):
        return v
    return yaml.safe_dump(v, default_flow_style=True, sort_keys=False, width=10**6).strip().removesuffix("\n...")


def expand_grid(grid: dict[str, list[Any]], where: str = "grid") -> dict[str, list[str]]:
    """``{"credit.estimator": ["grpo", "rloo"], "credit.lam": [0, 1]}`` -> 4 arms named
    ``estimator=grpo, lam=0`` ... in cartesian (first key slowest) order; a key's last part names
    it unless two keys share that part, then the full key does."""
    if not isinstance(grid, dict) or not grid:
        raise ConfigError(f"{where}: 'grid' must be a non-empty mapping key -> [values]")
    for key, values in grid.items():
        if not isinstance(values, list) or not values:
            raise ConfigError(f"{where}: grid key '{key}' must be a non-empty list of values, got {values!r}")
    leaves = [str(k).split(".")[-1] for k in grid]
    label = {k: (leaf if leaves.count(leaf) == 1 else str(k)) for k, leaf in zip(grid, leaves)}
    arms: dict[str, list[str]] = {}
    for point in itertools.product(*grid.values()):
        pairs = list(zip(grid, point))
        arms[", ".join(f"{label[k]}={_value_text(v)}" for k, v in pairs)] = [f"{k}={_value_text(v)}" for k, v in pairs]
    return arms


def _base_path(raw: Any, here: Path, where: str) -> Path:
    if raw is None:
        return demo_config_path(False)
    if raw in PACKAGED:
        return packaged_config(str(raw))
    for p in (here / str(raw), Path(str(raw))):
        if p.exists():
            return p
    raise ConfigError(f"{where}: key 'base': config file not found: {raw}")


def _str_list(raw: Any, where: str) -> list[str]:
    raw = [raw] if isinstance(raw, str) else raw
    if not isinstance(raw, list) or not all(isinstance(x, str) and "=" in x for x in raw):
        raise ConfigError(f"{where} must be a list of 'key=value' overrides, got {raw!r}")
    return list(raw)


def load_grid(path: str | Path, *, quick: bool = False, seeds: int | None = None) -> Grid:
    """Parse and validate a grid file; every arm's config is loaded once so a bad key fails here."""
    path = Path(path)
    data = read_yaml_file(path, "grid") or {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a grid file is a mapping (base, set, seeds, budget, target, init, arms, grid)")
    if unknown := set(data) - KEYS:
        raise ConfigError(f"{path}: unknown key(s) {sorted(unknown)}; expected some of {sorted(KEYS)}")
    base = _base_path(data.get("base"), path.parent, str(path))
    if quick and base in (demo_config_path(False), arith_config_path(False)):
        base = demo_config_path(True)
    common = _str_list(data.get("set", []), f"{path}: key 'set'") + (QUICK_SET if quick else [])
    seed_list = data.get("seeds", [0, 1, 2])
    if not isinstance(seed_list, list) or not seed_list or not all(isinstance(s, int) for s in seed_list):
        raise ConfigError(f"{path}: key 'seeds' must be a non-empty list of integers, got {seed_list!r}")
    seed_list = list(range(seeds)) if seeds is not None else (seed_list[:2] if quick else seed_list)
    budget = data.get("budget")
    ((unit, amount),) = budget.items() if isinstance(budget, dict) and len(budget) == 1 else [(None, None)]
    if unit not in ("tokens", "samples") or not isinstance(amount, int) or amount <= 0:
        raise ConfigError(f"{path}: key 'budget' must be {{tokens: N}} or {{samples: N}} with N > 0, got {budget!r}")
    target = data.get("target", {"gain": 0.10})
    if isinstance(target, dict) and set(target) == {"gain"} and isinstance(target["gain"], (int, float)):
        absolute, gain = None, float(target["gain"])
    elif isinstance(target, (int, float)) and not isinstance(target, bool) and 0 <= target <= 1:
        absolute, gain = float(target), None
    else:
        raise ConfigError(f"{path}: key 'target' must be an accuracy in [0, 1] or {{gain: g}}, got {target!r}")
    init = data.get("init", "auto")
    if not isinstance(init, str) or (init not in INITS and not Path(init).exists()):
        raise ConfigError(
            f"{path}: key 'init' must be auto, policy, sft or an existing checkpoint directory, got {init!r}"
        )
    if init == "auto":  # as train.init=auto: the named model as it is, SFT for the tiny preset
        init = start_kind(load_config(base, common))
    if "arms" not in data and "grid" not in data:
        raise ConfigError(f"{path}: needs 'arms' (name -> overrides) or 'grid' (key -> values), or both")
    arms = data.get("arms", {"": []})
    if not isinstance(arms, dict) or not arms:
        raise ConfigError(f"{path}: key 'arms' must be a non-empty mapping name -> [overrides]")
    arms = {str(k): _str_list(v or [], f"{path}: arm '{k}'") for k, v in arms.items()}
    if "grid" in data:
        points = expand_grid(data["grid"], str(path))
        arms = {
            ", ".join(x for x in (a, p) if x): over + pover for a, over in arms.items() for p, pover in points.items()
        }
    for name, over in arms.items():
        try:
            checked(load_config(base, common + over))
        except ConfigError as exc:
            raise ConfigError(f"{path}: arm '{name}': {exc}") from exc
    sft_seeds = data.get("sft_seeds", {})
    if not (
        isinstance(sft_seeds, dict)
        and all(isinstance(k, int) and isinstance(v, int) and not isinstance(v, bool) for k, v in sft_seeds.items())
    ):
        raise ConfigError(f"{path}: key 'sft_seeds' must map RL seeds to SFT seeds ({{3: 1, 4: 1}}), got {sft_seeds!r}")
    if sft_seeds and init != "sft":
        raise ConfigError(f"{path}: key 'sft_seeds' needs init: sft (got init {init!r})")
    if stray := sorted(set(sft_seeds) - set(data.get("seeds", [0, 1, 2]))):
        raise ConfigError(f"{path}: key 'sft_seeds' names seeds the grid does not run: {stray}")
    reference = data.get("reference")
    if reference is not None and reference not in arms:
        raise ConfigError(f"{path}: key 'reference': no arm {reference!r}; arms: {', '.join(arms)}")
    return Grid(
        name=str(data.get("name", path.stem)),
        base=base,
        common=common,
        seeds=seed_list,
        unit=unit,
        budget=QUICK_BUDGET[unit] if quick else amount,
        target=absolute,
        gain=gain,
        init=init,
        arms=arms,
        reference=reference,
        sft_seeds={s: k for s, k in sft_seeds.items() if s in seed_list},
    )
