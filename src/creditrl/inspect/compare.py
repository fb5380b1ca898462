"""Re-run estimators offline on a saved iteration: the same groups, other credit.

Estimators are pure functions of the saved tensors, so each saved group's advantages under any
registered estimator are computed here with :func:`creditrl.credit.estimate_at` at the run's
resolution (and time steps), with the run's gamma, lambda and normaliser, exactly as the credit
stage (:func:`creditrl.train.stages.credit`) does: only kept responses enter, each group keeps
its id. Where the run's normaliser is per group or none this reproduces the run's advantages
for its own estimator bit for bit; ``batch`` whitening can only be redone over the saved groups
(the run whitened over the whole batch), and the result says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from creditrl.credit import ESTIMATORS, estimate_at, normalise, requires
from creditrl.inspect.data import InspectError
from creditrl.inspect.precision import NegativeCredit, negative_credit, percent, pooled
from creditrl.inspect.record import floats
from creditrl.inspect.spread import credit_notes

TRAINED = "trained"  # the key of the advantages the run itself used


def parse_estimators(spec: str | None, run_estimator: str) -> list[str]:
    """Names from ``"a,b,c"`` (default: every registered estimator, the run's first);
    InspectError listing the valid names for an unknown one."""
    if not spec:
        return [run_estimator] + sorted(n for n in ESTIMATORS if n != run_estimator)
    names = [n.strip() for n in spec.split(",") if n.strip()]
    unknown = [n for n in names if n not in ESTIMATORS]
    if unknown:
        raise InspectError(f"unknown estimator {', '.join(map(repr, unknown))}; valid: {', '.join(sorted(ESTIMATORS))}")
    return list(dict.fromkeys(names))


@dataclass
class Tensors:
    """A saved iteration's responses as (B, T) tensors (every saved group, in order)."""

    rewards: torch.Tensor  # float32 (B, T)
    reward_mask: torch.Tensor  # bool (B, T)
    response_mask: torch.Tensor  # bool (B, T)
    step_ends: torch.Tensor  # bool (B, T), the time steps credit used
    values: torch.Tensor | None  # float32 (B, T), None unless every response has values
    group_ids: torch.Tensor  # long (B,)
    keep: torch.Tensor  # bool (B,)
    lengths: list[int] = field(default_factory=list)


def to_tensors(record: dict[str, Any]) -> Tensors:
    """``record``'s saved responses as :class:`Tensors`."""
    responses = [(g["group_id"], r) for g in record["groups"] for r in g["responses"]]
    lengths = [len(r["tokens"]) for _, r in responses]
    b, t = len(responses), max([1, *lengths])
    rewards = torch.zeros(b, t)
    reward_mask = torch.zeros(b, t, dtype=torch.bool)
    mask = torch.zeros(b, t, dtype=torch.bool)
    step_ends = torch.zeros(b, t, dtype=torch.bool)
    has_values = b > 0 and all(r["values"] is not None for _, r in responses)
    values = torch.zeros(b, t) if has_values else None
    for i, (n, (_, r)) in enumerate(zip(lengths, responses)):
        rewards[i, :n] = torch.tensor(r["rewards"], dtype=torch.float32)
        reward_mask[i, r["reward_mask"]] = True
        mask[i, :n] = True
        mask[i, r["masked"]] = False
        ends = r["credit_step_ends"] if r["credit_step_ends"] is not None else r["step_ends"]
        step_ends[i, ends] = True
        if values is not None:
            values[i, :n] = torch.tensor(r["values"], dtype=torch.float32)
    group_ids = torch.tensor([g for g, _ in responses], dtype=torch.long)
    keep = torch.tensor([r["kept"] for _, r in responses], dtype=torch.bool)
    return Tensors(rewards, reward_mask, mask, step_ends, values, group_ids, keep, lengths)


def recompute(record: dict[str, Any], name: str, x: Tensors | None = None) -> torch.Tensor:
    """Advantages float32 (B, T) of estimator ``name`` on ``record``'s saved groups, after the
    run's normaliser; 0 on dropped responses and masked tokens. ValueError (from the estimator)
    when an input it needs is missing."""
    x = to_tensors(record) if x is None else x
    s = record["settings"]
    adv = torch.zeros(x.rewards.shape)
    rows = x.keep.nonzero().squeeze(-1)
    if rows.numel() == 0:
        return adv
    mask, gid = x.response_mask[rows], x.group_ids[rows]
    a, _ = estimate_at(
        s["resolution"],
        name,
        x.rewards[rows],
        x.reward_mask[rows],
        mask,
        step_ends=x.step_ends[rows],
        group_ids=gid,
        values=None if x.values is None else x.values[rows],
        gamma=s["gamma"],
        lam=s["lam"],
    )
    adv[rows] = normalise(s["normaliser"], a, mask, group_ids=gid)
    return adv


def _precision(record: dict[str, Any], adv_rows: list[list[float]]) -> dict[str, Any]:
    """Credit precision per response, per group and over the iteration (numbers and texts);
    a group's also says why it is undefined (:func:`creditrl.inspect.spread.credit_notes`)."""
    by_group = _split(adv_rows, record)
    per_group = [
        [
            negative_credit(a, r["steps"], r["labels"]) if r["labels"] is not None else None
            for r, a in zip(g["responses"], adv)
        ]
        for g, adv in zip(record["groups"], by_group)
    ]
    groups = [pooled(p for p in parts if p is not None) for parts in per_group]
    total = pooled(groups)

    def show(nc: NegativeCredit | None) -> dict[str, Any]:
        value = None if nc is None else nc.precision
        return {"value": value, "text": percent(value)}

    return {
        "responses": [[show(p) for p in parts] for parts in per_group],
        "groups": [
            show(nc) | credit_notes(g, adv, nc.precision) for g, adv, nc in zip(record["groups"], by_group, groups)
        ],
        "all": show(total),
    }


def _split(rows: list[list[float]], record: dict[str, Any]) -> list[list[list[float]]]:
    out, i = [], 0
    for g in record["groups"]:
        n = len(g["responses"])
        out.append(rows[i : i + n])
        i += n
    return out


def compare_iteration(record: dict[str, Any], estimators: list[str]) -> dict[str, Any]:
    """Every requested estimator on ``record`` (plus ``"trained"``, the run's own advantages):
    ``{key: {label, available, reason, note, adv (group, response, token), precision}}``."""
    x = to_tensors(record)
    s = record["settings"]

    def entry(label: str, rows: list[list[float]] | None, reason: str = "", note: str = "") -> dict[str, Any]:
        adv, precision = (None, None) if rows is None else (_split(rows, record), _precision(record, rows))
        return dict(label=label, available=rows is not None, reason=reason, note=note, adv=adv, precision=precision)

    note = ""
    if s["normaliser"] == "batch":
        note = (
            f"batch whitening recomputed over the {len(x.lengths)} saved responses only "
            f"(the run whitened over all {record['batch_size']})"
        )
    trained = [r["adv"] for g in record["groups"] for r in g["responses"]]
    out = {TRAINED: entry(f"as trained ({s['estimator']})", trained)}
    for name in estimators:
        if "values" in requires(name) and x.values is None:
            why = f"'{name}' needs values; this run had value.source={s['value_source']}, so none were saved"
            out[name] = entry(name, None, why, note)
            continue
        try:
            adv = recompute(record, name, x)
        except ValueError as exc:  # an input this estimator cannot take, said by the estimator
            out[name] = entry(name, None, str(exc), note)
        else:
            out[name] = entry(name, [floats(adv[i, :n]) for i, n in enumerate(x.lengths)], note=note)
    return out
