"""README's results table, generated from the JSON its pages were written with.

    python docs/glance.py           # rewrite the table between README's glance markers
    python docs/glance.py --check   # exit 1 when README's table differs from the JSON

Each row names the JSON it reads: ``docs/findings/verdicts.json`` (written by ``creditrl
findings``: every verdict row's seed-level paired difference, its Holm-level interval and the
verdict), ``docs/results/performance.json`` and ``docs/results/gpu/gpu_realsize.json`` (written by
the speed benchmarks). No number is typed here; tests/test_readme.py checks README against this.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
START, END = "<!-- glance:start -->", "<!-- glance:end -->"
VERDICTS = "docs/findings/verdicts.json"
PERFORMANCE = "docs/results/performance.json"
GPU = "docs/results/gpu/gpu_realsize.json"

# (what, finding, arm, reference): one verdict row of FINDINGS.md each
FINDING_ROWS = [
    ("C1, ~45 tokens: token credit vs outcome GRPO", "C1-short", "token", "sequence + GRPO"),
    (
        "C1, ~655 tokens, rare success: step credit vs PPO as VC-PPO/VAPO run it",
        "C1-sparse",
        "step",
        "sequence + repaired PPO",
    ),
    (
        "C2, ~45 tokens: RL on a PRM (oracle labels) vs outcome + GAE",
        "C2-arith",
        "PRM, oracle labels",
        "sequence + GAE",
    ),
    ("C3: outcome 80%, then steps vs outcome only", "C3-arith", "switch 80/20", "outcome"),
    ("C4: lambda 0.5 -> 0.95 vs lambda 0.95", "C4-arith", "lam 0.5 -> 0.95", "sequence + GAE"),
    ("C5: Monte-Carlo values (K=4) vs a critic", "C5-arith", "MC values, K=4", "sequence + GAE"),
]


def _load(rel: str) -> dict:
    return json.loads((ROOT / rel).read_text())


def _verdict_cell(row: dict) -> str:
    d = row["difference"]
    return (
        f"{100 * d['mean']:+.1f} points [{100 * d['lo']:+.1f}, {100 * d['hi']:+.1f}], "
        f"{d['seeds']} seeds: {row['verdict']}"
    )


def rows() -> list[tuple[str, str, str]]:
    """``(what, result, page)`` for every row of the table."""
    found = {(r["finding"], r["arm"], r["reference"]): r for r in _load(VERDICTS)["rows"]}
    out = []
    for what, finding, arm, reference in FINDING_ROWS:
        row = found[(finding, arm, reference)]
        anchor = row["finding"].lower()
        out.append((what, _verdict_cell(row), f"[FINDINGS](FINDINGS.md#{anchor})"))
    lengths = _load(PERFORMANCE)["lengths"]
    ratios = [x["iteration"]["ratio_trl_vs_creditrl"] for x in lengths]
    out.append(
        (
            f"GRPO iteration vs TRL GRPOTrainer, {lengths[0]['length']}-{lengths[-1]['length']} tokens, CPU",
            f"{min(ratios):.2f}x-{max(ratios):.2f}x faster",
            "[performance](docs/results/performance.md)",
        )
    )
    gpu = _load(GPU)
    point = max(gpu["points"], key=lambda x: (x["length"], x["rows"]))
    peak = point["creditrl"]["peak_gpu_mb"] / 1024, point["trl"]["peak_gpu_mb"] / 1024
    out.append(
        (
            f"{gpu['gpu']}, {point['length']} tokens, {point['rows']} rows: GRPO iteration vs TRL",
            f"{point['trl']['iter_s']['median'] / point['creditrl']['iter_s']['median']:.2f}x; "
            f"peak {peak[0]:.0f} GB vs {peak[1]:.0f} GB",
            "[gpu](docs/results/gpu.md)",
        )
    )
    return out


def table() -> str:
    lines = ["| what | result (held-out exact match; interval at the claim's Holm level) | page |", "|---|---|---|"]
    lines += [f"| {what} | {result} | {page} |" for what, result, page in rows()]
    return "\n".join(lines)


def readme_table(text: str) -> str:
    """The table between README's markers."""
    return text.split(START, 1)[1].split(END, 1)[0].strip()


def main(argv: list[str]) -> int:
    readme = ROOT / "README.md"
    text = readme.read_text()
    if START not in text or END not in text:
        print(f"{readme}: no {START} ... {END} markers", file=sys.stderr)
        return 1
    if "--check" in argv:
        if readme_table(text) != table():
            print(f"{readme}: the results table differs from its JSON; run python docs/glance.py", file=sys.stderr)
            return 1
        return 0
    head, rest = text.split(START, 1)
    readme.write_text(f"{head}{START}\n{table()}\n{END}{rest.split(END, 1)[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
