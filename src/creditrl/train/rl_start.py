"""The start of an RL run (:mod:`creditrl.train.rl`): each iteration's seeds, its problems and
samples, the run's sample / token / time totals, and value pretraining before iteration 1."""

from __future__ import annotations

import logging
import time
from typing import Any

import torch

from creditrl.distributed import ddp
from creditrl.losses import explained_variance
from creditrl.train import stages
from creditrl.train.build import RunParts
from creditrl.train.plan import RunPlan

log = logging.getLogger("creditrl")
RANK_SEED_STRIDE = 2**32  # data-parallel rank r samples its rollouts from iteration_seed + r * stride
PRETRAIN_SEED_OFFSET = 2**48  # value pretraining iteration k draws from iteration_seed(seed, k) + offset


def iteration_seed(seed: int, iteration: int) -> int:
    return seed * 1_000_003 + iteration


class RunStart:
    """:class:`~creditrl.train.rl.RLTrainer`'s rollout, totals and value pretraining."""

    parts: RunParts
    plan: RunPlan
    totals: dict[str, Any]

    def _pretrain_critic(self) -> dict[str, float]:
        """Value pretraining (VC-PPO, Yuan et al., 2025, arXiv:2503.01491): ``value.pretrain_iterations``
        rounds of rollout -> score -> value -> Monte-Carlo returns (lambda 1) -> a critic-only update,
        all from the start policy, before RL's first iteration, on samples apart from RL's
        (``PRETRAIN_SEED_OFFSET``). Returns iteration 0's ``pretrain/*`` metrics: the explained
        variance of the first and the last batch, each measured before the critic trains on it; the
        last update's value loss; ``time/pretrain_s``."""
        p, plan = self.parts, self.plan
        start, evs, update = time.perf_counter(), [], {}
        for k in range(plan.pretrain_iterations):
            seed = iteration_seed(plan.seed, k) + PRETRAIN_SEED_OFFSET
            gen = torch.Generator().manual_seed(seed + RANK_SEED_STRIDE * ddp.rank())
            batch = self._rollout(k, gen, seed=seed)
            scored = p.scorer(batch, progress=0.0, generator=gen, ref_logprobs=None)
            values = p.value_stage(batch, scored.step_ends, gen)
            mc = {"lam": 1.0, "lam_critic": 1.0, "lam_alpha": 0.0}  # Monte-Carlo returns
            adv, ret = stages.credit(batch, scored, plan.credit, values=values.values, step_ends=values.step_ends, **mc)
            mask = batch.response_mask & scored.keep[:, None]
            (ev,) = ddp.all_reduce_mean([explained_variance(values.values, ret, mask)])
            evs.append(ev)
            update = stages.learn(p, batch, scored, adv, ret, values, None, gen, train_policy=False)
            self._count(batch.size, stages.generated_tokens(batch), 0.0)
            log.info("creditrl: value pretraining %d/%d: explained variance %.3f", k + 1, plan.pretrain_iterations, ev)
        seconds = time.perf_counter() - start
        self.totals["time_s"] += seconds
        return {
            "pretrain/iterations": len(evs),
            "pretrain/explained_variance_first": evs[0],
            "pretrain/explained_variance": evs[-1],
            "pretrain/loss_value": update.get("loss/value", 0.0),
            "time/pretrain_s": seconds,
        }

    def _rollout(self, it: int, generator: torch.Generator, *, seed: int | None = None):
        """This iteration's problems (the same on every rank; each keeps its share) and their samples;
        ``seed`` replaces the problems' seed ``iteration_seed(train.seed, it)``."""
        p, plan = self.parts, self.plan
        seed = iteration_seed(plan.seed, it) if seed is None else seed
        problems = p.task.sample(plan.prompts_per_iter, split="train", seed=seed)
        return stages.rollout(
            p.engine,
            p.tokenizer,
            ddp.share(problems),
            plan.group_size,
            p.params,
            generator,
            tree=p.value_stage.tree,
            stop_ids=p.stop_ids,
        )

    def _count(self, samples: int, tokens: int, seconds: float) -> None:
        samples, tokens = (int(x) for x in ddp.all_reduce_sum([samples, tokens]))  # over every rank
        self.totals["samples"] += samples
        self.totals["tokens"] += tokens
        self.totals["time_s"] += seconds
