"""A grid's SFT start: cached per recipe, kept in the repository, and checked against its summarised runs.

The same SFT recipe trains other weights on another CPU kind or torch version, and a grid's runs
pair only when they share their start; a start is therefore kept under ``findings/starts`` once it
is known to be the one the committed runs started from, and a start that is not theirs stops a
grid before it trains. Its held-out outcomes on each other RL task it served are kept beside it in
``heldout.json``, so that the findings can name it as those runs' start too. A grid that keeps no
summaries starts from :func:`any_start`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from creditrl.cache import cache_root
from creditrl.config import Config, load_config
from creditrl.errors import ConfigError
from creditrl.experiments.summaries import read_summary

HELDOUT = "heldout.json"  # in a kept start: {sft key of an RL task: the start's held-out outcomes there}


def grid_start(
    base: Path, common: list[str], starts: Path | None = None, summarised: list[Path] | tuple[Path, ...] = ()
) -> str:
    """The SFT start of a grid on ``base`` + ``common`` (cached). With ``starts`` (a repository's
    folder of kept starts, one per SFT recipe), a start kept there is used as it is, and one built
    here is kept there once it is known to be the one the ``summarised`` runs started from."""
    from creditrl.train.sft import cached_sft, keep_start, recipe_key

    cfg = load_config(base, common)
    kept = None if starts is None else starts / recipe_key(cfg)
    weights = kept if kept is not None and kept.is_dir() else None
    path = cached_sft(cfg, progress=cfg.train.progress, weights=weights)[0]
    _check_start(cfg, path, summarised)
    if kept is not None and weights is None:
        keep_start(path, kept)
    if kept is not None:
        _keep_heldout(cfg, path, kept)
    return str(path)


def known_starts(*places: Path) -> list[Path]:
    """The existing folders of kept starts (``findings/starts``) under the working directory, under
    ``places`` (a grid file's folder) or a folder above them, and in the checkout creditrl runs from."""
    roots = [Path.cwd(), *(q for p in places for q in (p.resolve(), *p.resolve().parents))]
    roots.append(Path(__file__).resolve().parents[3])  # src/creditrl/experiments/starts.py -> the checkout
    found = [r / "findings" / "starts" for r in roots]
    return [d for d in dict.fromkeys(found) if d.is_dir()]


def _cached(cfg: Config) -> bool:
    """Whether the SFT cache holds a start of ``cfg``'s recipe (its own entry, or one of the same
    recipe for another RL task, which :func:`~creditrl.train.sft.cached_sft` links)."""
    from creditrl.train.sft import recipe_key, sft_key

    root = cache_root()
    recipe = root / "sft-recipes" / recipe_key(cfg)
    entries = [root / "sft" / sft_key(cfg)] + ([root / "sft" / recipe.read_text().strip()] if recipe.is_file() else [])
    return any((e / "trainer_state.json").is_file() for e in entries)


def any_start(base: Path, common: list[str], known: Sequence[Path], log: Callable[[str], None] = print) -> str:
    """The SFT start of a grid on ``base`` + ``common`` that keeps no summaries: the cache entry of
    its recipe, else a start kept for the recipe in one of ``known``, else trained now; ``log``
    says which."""
    from creditrl.train.sft import cached_sft, recipe_key

    cfg = load_config(base, common)
    key = recipe_key(cfg)
    kept = next((d / key for d in known if (d / key / "trainer_state.json").is_file()), None)
    if _cached(cfg):
        log(f"start: the cached supervised warm start of {cfg.policy.model} (init: sft)")
        kept = None
    elif kept is not None:
        log(f"start: the warm start kept at {kept} (the same SFT recipe), not trained again")
    elif not cfg.train.progress:
        log(
            f"start: supervised warm start of {cfg.policy.model}, {cfg.sft.steps} steps (init: sft; "
            "init: policy starts RL from the model as it is)"
        )
    return str(cached_sft(cfg, progress=cfg.train.progress, weights=kept)[0])


def _keep_heldout(cfg: Config, path: Path, kept: Path) -> None:
    """Note in kept start ``kept`` its held-out outcomes on ``cfg``'s RL task (those of ``path``, the
    cache entry holding its weights) when its state holds another task's."""
    from creditrl.train.sft import sft_key, start_outcomes

    own = json.loads((kept / "trainer_state.json").read_text()).get("heldout_correct")
    outcomes = start_outcomes(cfg, path)
    file = kept / HELDOUT
    noted = json.loads(file.read_text()) if file.is_file() else {}
    key = sft_key(cfg)
    if outcomes != own and noted.get(key) != outcomes:
        file.write_text(json.dumps({**noted, key: outcomes}, indent=1, sort_keys=True) + "\n")


def kept_start(base: Path, common: list[str], starts: Path, found: list[dict[str, Any]]) -> Path | None:
    """The start kept under ``starts`` for the recipe of ``base`` + ``common`` when its held-out
    outcomes on their RL task equal the iteration-0 outcomes of the summarised runs ``found``; else None."""
    from creditrl.train.sft import recipe_key, sft_key

    cfg = load_config(base, common)
    kept = starts / recipe_key(cfg)
    state = kept / "trainer_state.json"
    if not state.is_file():
        return None
    noted = json.loads((kept / HELDOUT).read_text()) if (kept / HELDOUT).is_file() else {}
    known = [json.loads(state.read_text()).get("heldout_correct"), noted.get(sft_key(cfg))]
    first = _start_evals(found)
    same = any(own is not None and all(e["eval/correct"] == own for e in first) for own in known)
    return kept if first and same else None


def _start_evals(found: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The iteration-0 evaluations with per-problem outcomes of the run summaries ``found``."""
    first = [f["evals"][0] for f in found if f["evals"]]
    return [e for e in first if e.get("iteration") == 0 and "eval/correct" in e]


def _check_start(cfg: Config, start: Path, summaries: list[Path] | tuple[Path, ...]) -> None:
    """Raise ConfigError when ``start`` is not the start the summarised runs began from (by outcomes)."""
    from creditrl.train.metrics import unpack_outcomes
    from creditrl.train.sft import start_outcomes

    first = _start_evals([read_summary(p) for p in summaries if p.is_file()])
    if not first:
        return
    own = start_outcomes(cfg, start)
    if any(e["eval/correct"] != own for e in first):
        # evaluated again before refusing: an entry that an older creditrl linked from a start of the same
        # recipe, stopped before its own report, holds the other task's outcomes as this one's
        own = start_outcomes(cfg, start, fresh=True)
    if other := [e for e in first if e["eval/correct"] != own]:
        share = float(np.mean(unpack_outcomes(own)))
        raise ConfigError(
            f"start {start}: held out {share:.1%} here, but {len(other)} of the {len(first)} summarised runs "
            f"of this grid started from {other[0]['eval/accuracy']:.1%} on the same problems: these weights are not "
            "theirs (trained on another CPU kind or torch version) and new runs would not pair with "
            "them; start from theirs (kept under findings/starts), or move their summaries aside to rerun every arm"
        )
