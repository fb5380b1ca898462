"""The keys of a ``creditrl compare`` grid file, which the grid reader checks and ``creditrl compare
--help`` prints (a leaf module: building the parser imports nothing heavy)."""

from __future__ import annotations

import textwrap

# docs/compare.md explains each with an example
KEY_HELP = {
    "name": "the grid's name (default: the file's stem); output in runs/compare-<name>",
    "base": "demo | demo_quick | arith | chain | paths (packaged) or a config file (relative to the grid file "
    "or the working directory); default demo",
    "set": "overrides for every run, key=value as in train --set (after base, before the arm's)",
    "seeds": "the seeds every arm runs (default [0, 1, 2]); the seed is the unit of replication",
    "budget": "per run: {tokens: N} generated tokens or {samples: N} generated samples",
    "target": 'the "to reach" accuracy: absolute (0.5) or {gain: g} over the arm\'s start (default {gain: 0.10})',
    "init": "auto (default: train.init=auto, the named model as it is, SFT only for the embedded tiny preset) "
    "| policy | sft (the cached warm start of base + set) | a checkpoint directory",
    "sft_seeds": "{rl seed: sft seed}: these seeds start from the SFT start of that sft.seed (init: sft), the "
    "rest from sft.seed's; every arm of a seed shares its start, so seeds over several starts sample start "
    "variance and still pair",
    "reference": "the arm every other is compared with, problem by problem, in the differences table and the "
    "verdicts (without it the verdicts are against the first arm and there is no differences table)",
    "arms": "name -> [overrides]",
    "grid": "key -> [values], expanded as a cartesian product (times arms when both are given)",
}


def keys_text() -> str:
    """The keys as ``--help`` lists them, one per line."""
    return "\n".join(
        textwrap.fill(text, 100, initial_indent=f"  {key:<10} ", subsequent_indent=" " * 13)
        for key, text in KEY_HELP.items()
    )
