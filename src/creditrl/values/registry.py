"""The value sources a run can name (``value.source``), and what each one needs."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ValueSourceInfo:
    name: str
    kind: str  # "none" | "critic" (learned, trained each iteration) | "mc" (rollouts, not trained)
    #            | "tree" (the rollouts themselves are sampled as a tree; not trained)
    members: int = 0  # critic heads; the dual critic reports their per-token minimum
    needs_steps: bool = False  # estimated only at step boundaries
    meaning: str = ""


VALUE_SOURCES: dict[str, ValueSourceInfo] = {
    info.name: info
    for info in (
        ValueSourceInfo("none", "none", meaning="no values (critic-free estimators)"),
        ValueSourceInfo("critic", "critic", members=1, meaning="a learned value head (PPO)"),
        ValueSourceInfo("dual_critic", "critic", members=2, meaning="two learned heads, V = min(V1, V2) per token"),
        ValueSourceInfo("mc", "mc", needs_steps=True, meaning="Monte-Carlo continuations at step boundaries (VinePPO)"),
        ValueSourceInfo(
            "tree",
            "tree",
            needs_steps=True,
            meaning="rollouts branch at step boundaries; V(node) = mean outcome of its leaves (TreeRL)",
        ),
    )
}
