"""Helper of ``test_ddp.py`` (not a test module): a fixed batch and the update's gradients.

In one process (imported by the test) :func:`reference` computes the single-process gradients
over the whole batch. Run as ``python -m torch.distributed.run --nproc_per_node 2 ddp_case.py
OUT_DIR``, every rank takes half of the prompt groups (rank 0 the short responses, rank 1 the
long ones, so per-rank and global loss denominators differ), computes the same update with the
policy (and critic) wrapped in DDP -- and once with FSDP2 -- and writes ``OUT_DIR/rank{r}.pt``.
"""

from __future__ import annotations

import sys
from contextlib import ExitStack
from unittest import mock

import torch

from creditrl.config import load_config
from creditrl.credit import normalise
from creditrl.distributed import ddp
from creditrl.losses import AGGREGATIONS
from creditrl.policy.model import build_tiny
from creditrl.rollout.batch import TrajectoryBatch, response_logits, token_logprobs
from creditrl.train import update as update_module
from creditrl.train.plan import CreditSettings
from creditrl.train.resolve import checked
from creditrl.train.stages import Scored, credit
from creditrl.train.update import CriticTarget, update
from creditrl.values.critic import build_critic

WORLD = 2
GROUPS, GROUP_SIZE = 6, 3
# response lengths per group: groups 0-2 (rank 0) short, groups 3-5 (rank 1) long
LENGTHS = [[3, 5, 2], [4, 1, 6], [2, 3, 2], [11, 14, 9], [13, 7, 12], [10, 8, 12]]
PROMPT_LENGTHS = [3, 4, 3, 6, 4, 5]
# at most 50 padded positions: rank 0 packs whole groups into 2 micro-batches; rank 1's groups
# (3 rows x 17-20 positions) are wider, so their rows split into 5
MICRO_POSITIONS = 50
CRITICS = ("none", "separate", "shared")


def variants() -> list[tuple[str, int, str]]:
    return [(agg, pos, critic) for agg in sorted(AGGREGATIONS) for pos in (0, MICRO_POSITIONS) for critic in CRITICS]


def key(agg: str, positions: int, critic: str) -> str:
    return f"{agg}|micro={positions}|critic={critic}"


def make_case() -> dict:
    """The tiny policy, a fixed batch of 6 groups x 3 responses and the update's inputs."""
    model, tok = build_tiny(0)
    g = torch.Generator().manual_seed(7)
    b = GROUPS * GROUP_SIZE
    lengths = torch.tensor([n for grp in LENGTHS for n in grp])
    width = int(lengths.max())
    p = max(PROMPT_LENGTHS)
    prompt_ids = torch.full((b, p), tok.pad_token_id)
    prompt_mask = torch.zeros(b, p, dtype=torch.long)
    for grp, n in enumerate(PROMPT_LENGTHS):
        ids = torch.randint(4, 30, (n,), generator=g)
        ids[0] = tok.bos_token_id
        for j in range(GROUP_SIZE):
            prompt_ids[grp * GROUP_SIZE + j, p - n :] = ids
            prompt_mask[grp * GROUP_SIZE + j, p - n :] = 1
    response_mask = torch.arange(width)[None, :] < lengths[:, None]
    response_ids = torch.where(response_mask, torch.randint(4, 30, (b, width), generator=g), tok.pad_token_id)
    batch = TrajectoryBatch(
        prompt_ids=prompt_ids,
        prompt_mask=prompt_mask,
        response_ids=response_ids,
        response_lengths=lengths,
        response_mask=response_mask,
        old_logprobs=torch.zeros(b, width),
        group_ids=torch.arange(GROUPS).repeat_interleave(GROUP_SIZE),
        finished=torch.ones(b, dtype=torch.bool),
    )
    with torch.no_grad():  # the sampling policy: near the current one, so that few ratios clip
        logp = token_logprobs(response_logits(model.eval(), batch), response_ids)
    batch.old_logprobs = torch.where(response_mask, logp + 0.05 * torch.randn(b, width, generator=g), 0.0)
    mask = response_mask.clone()
    mask[1] = False  # a response the filter dropped: no valid token (seq-mean-token-mean counts it out)
    mask[10, 8:] = False
    return {
        "model": model,
        "batch": batch,
        "mask": mask,
        "advantages": torch.where(mask, torch.randn(b, width, generator=g), 0.0),
        "ref_logprobs": torch.where(mask, logp + 0.1 * torch.randn(b, width, generator=g), 0.0),
        "returns": torch.randn(b, width, generator=g),
        "old_values": 0.1 * torch.randn(2, b, width, generator=g),
    }


def rank_rows(rank: int) -> torch.Tensor:
    per = GROUPS // WORLD * GROUP_SIZE
    return torch.arange(rank * per, (rank + 1) * per)


def local_case(case: dict, rank: int) -> dict:
    """Rank ``rank``'s share of the case: its whole groups, padded to its own longest response."""
    rows = rank_rows(rank)
    batch = case["batch"].select(rows)
    width = int(batch.response_lengths.max())
    batch = TrajectoryBatch(
        prompt_ids=batch.prompt_ids,
        prompt_mask=batch.prompt_mask,
        response_ids=batch.response_ids[:, :width],
        response_lengths=batch.response_lengths,
        response_mask=batch.response_mask[:, :width],
        old_logprobs=batch.old_logprobs[:, :width],
        group_ids=batch.group_ids,
        finished=batch.finished,
    )
    cut = {k: case[k][rows][:, :width] for k in ("mask", "advantages", "ref_logprobs", "returns")}
    return {**case, **cut, "batch": batch, "old_values": case["old_values"][:, rows][:, :, :width]}


def gradients(case: dict, agg: str, positions: int, critic_kind: str, *, strategy: str = "ddp") -> dict:
    """One update (SGD, lr 0, no clipping) of a fresh copy of the policy (and critic); returns
    the flattened gradients and the update's metrics."""
    import copy

    cfg = checked(
        load_config(
            None,
            {
                "loss": {"aggregation": agg, "kl_coef": 0.1, "entropy_coef": 0.01},
                "optim": {"micro_batch_positions": positions, "minibatches": 1, "grad_clip": 1e9},
            },
        )
    )
    model = copy.deepcopy(case["model"])
    target = None
    critic = None
    if critic_kind != "none":
        critic = build_critic(model, placement=critic_kind, members=2, seed=0)
    model = ddp.wrap(model, strategy=strategy)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    if critic is not None:
        critic = ddp.wrap(critic, strategy=strategy)
        target = CriticTarget(critic, torch.optim.SGD(critic.parameters(), lr=0.0), case["returns"], case["old_values"])
    logs = update(
        model,
        opt,
        case["batch"],
        case["advantages"],
        case["mask"],
        cfg,
        torch.Generator().manual_seed(0),
        ref_logprobs=case["ref_logprobs"],
        critic=target,
    )
    params = list(model.parameters()) + (list(critic.parameters()) if critic is not None else [])
    grads = [p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad for p in params]
    return {"grads": torch.cat([x.detach().flatten() for x in grads]), "logs": logs}


SKIPPED_GROUPS = (0, 1, 2, 4)  # all of rank 0's groups and one of rank 1's have advantage 0 throughout


def skip_gradients(case: dict, agg: str, positions: int, *, strategy: str = "ddp") -> dict:
    """One update (no KL, entropy or critic term) with the zero-advantage groups left out of
    the forward/backward (``optim.skip_zero_advantage``); rank 0 then has no row to train."""
    import copy

    cfg = checked(
        load_config(
            None, {"loss": {"aggregation": agg}, "optim": {"micro_batch_positions": positions, "grad_clip": 1e9}}
        )
    )
    zero = torch.isin(case["batch"].group_ids, torch.tensor(SKIPPED_GROUPS))
    advantages = torch.where(zero[:, None], 0.0, case["advantages"])
    model = ddp.wrap(copy.deepcopy(case["model"]), strategy=strategy)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    logs = update(model, opt, case["batch"], advantages, case["mask"], cfg, torch.Generator().manual_seed(0))
    grads = [p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad for p in model.parameters()]
    return {"grads": torch.cat([x.detach().flatten() for x in grads]), "logs": logs}


def whitening_case() -> tuple[torch.Tensor, torch.Tensor]:
    """Advantages (18, 14) with unequal valid tokens per rank and offset means (rank 1 higher)."""
    g = torch.Generator().manual_seed(3)
    lengths = torch.tensor([n for grp in LENGTHS for n in grp])
    mask = torch.arange(int(lengths.max()))[None, :] < lengths[:, None]
    adv = torch.randn(mask.shape, generator=g) + torch.linspace(0, 3, mask.shape[0])[:, None]
    return torch.where(mask, adv, 0.0), mask


def reference() -> dict:
    """Single-process results on the whole batch."""
    case = make_case()
    out = {key(*v): gradients(case, *v) for v in variants()}
    for agg in sorted(AGGREGATIONS):
        out["skip|" + agg] = skip_gradients(case, agg, MICRO_POSITIONS)
    adv, mask = whitening_case()
    out["whiten"] = normalise("batch", adv, mask)
    out["whiten_stage"] = _stage_whitening(adv, mask, torch.arange(mask.shape[0]))
    return out


def metric_values(rank: int) -> torch.Tensor:
    """Rank ``rank``'s sample for the metric reduction check: 5 values on rank 0, 9 on rank 1."""
    g = torch.Generator().manual_seed(11 + rank)
    return torch.randn(5 + 4 * rank, generator=g, dtype=torch.float64) * (1 + rank) + 2 * rank


def metric_row(rank: int) -> dict:
    x = metric_values(rank)
    return {
        "x/mean": float(x.mean()),
        "x/std": float(x.std()),
        "x/abs_max": float(x.abs().max()),
        "resp/mean_len": 10.0 + rank,
        "count": 5 + 4 * rank,
        "time/iter_s": 1.0 + rank,
        "k": 4 - rank,
        "same": 0.5,
        "label": f"rank{rank}",
    }


def _stage_whitening(adv: torch.Tensor, mask: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """The credit stage with ``credit.normaliser=batch`` and the identity-like ``reinforce``
    estimator on a rank's rows: a reward on each valid token, so the returns are reward-to-go."""
    cfg = checked(load_config(None, {"credit": {"estimator": "reinforce", "normaliser": "batch"}}))
    m = mask[rows]
    b, t = m.shape
    scored = Scored(
        rewards=adv[rows],
        reward_mask=m,
        step_ends=torch.zeros_like(m),
        outcome=torch.zeros(b),
        step_correct=torch.zeros(b),
        keep=torch.ones(b, dtype=torch.bool),
        errors=0,
    )
    batch = TrajectoryBatch(
        prompt_ids=torch.ones(b, 1, dtype=torch.long),
        prompt_mask=torch.ones(b, 1, dtype=torch.long),
        response_ids=torch.ones(b, t, dtype=torch.long),
        response_lengths=m.sum(-1),
        response_mask=m,
        old_logprobs=torch.zeros(b, t),
        group_ids=torch.arange(b),
        finished=torch.ones(b, dtype=torch.bool),
    )
    return credit(batch, scored, CreditSettings.of(cfg))[0]


def main(out_dir: str) -> None:
    ddp.init_from_env()
    assert ddp.world_size() == WORLD, ddp.world_size()
    torch.set_num_threads(1)
    r = ddp.rank()
    case = local_case(make_case(), r)
    out: dict = {key(*v): gradients(case, *v) for v in variants()}
    # the naive port: per-rank denominators and padded length, DDP's average on top
    for agg in sorted(AGGREGATIONS):
        with ExitStack() as stack:
            stack.enter_context(mock.patch.object(update_module.ddp, "all_reduce_sum", lambda x: x))
            stack.enter_context(mock.patch.object(update_module.ddp, "all_reduce_max", lambda x: x))
            stack.enter_context(mock.patch.object(update_module.ddp, "world_size", lambda: 1))
            out["naive|" + key(agg, 0, "none")] = gradients(case, agg, 0, "none")
    for agg in sorted(AGGREGATIONS):
        for pos in (0, MICRO_POSITIONS):
            out["fsdp|" + key(agg, pos, "separate")] = gradients(case, agg, pos, "separate", strategy="fsdp")
    for agg in sorted(AGGREGATIONS):
        out["skip|" + agg] = skip_gradients(case, agg, MICRO_POSITIONS)
        out["skip-fsdp|" + agg] = skip_gradients(case, agg, MICRO_POSITIONS, strategy="fsdp")
    adv, mask = whitening_case()
    rows = rank_rows(r)
    out["whiten"] = ddp.batch_whitening(adv[rows], mask[rows], 1e-6)
    out["whiten_stage"] = _stage_whitening(adv, mask, rows)
    out["rows"] = rows
    out["metrics"] = ddp.reduce_metrics(
        metric_row(r), counts={"": 2.0, "x": float(metric_values(r).numel())}, sums={"count"}, mins={"k"}, same={"same"}
    )
    torch.save(out, f"{out_dir}/rank{r}.pt")
    ddp.shutdown()


if __name__ == "__main__":
    main(sys.argv[1])
