"""PRMs as practitioners use them (issue 59, item 2), in the loop with ``reward.prm=auto``: the
outcome plus the PRM's step rewards with a weight (``reward.sources`` / ``reward.weights``), and
PURE's recipe (``min_form`` on the PRM's step rewards plus a share of the verifiable reward,
``credit.outcome_coef``). The credit maths is tested against loops in ``tests/credit/test_outcome.py``."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from creditrl.config import load_config
from creditrl.credit import estimate_at, outcome_advantage
from creditrl.train import stages
from creditrl.train.resolve import checked
from creditrl.train.rl import RLTrainer

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "pure.yaml"

# A short SFT warm start on 1-2-operation sums and products (some answers right, some wrong, so the
# outcome varies within groups), then a PRM trained on its samples, all at toy sizes.
SMALL = [
    "task.args={min_ops: 1, max_ops: 2, operand_max: 3}",
    "sft.task_args={min_ops: 1, max_ops: 2, operand_max: 3}",
    "sft.steps=150",
    "sft.batch_size=32",
    "sft.warmup_steps=10",
    "sft.lr=0.003",
    "rollout.prompts_per_iter=4",
    "rollout.group_size=4",
    "rollout.max_new_tokens=20",
    "train.iterations=2",
    "train.eval_every=100",
    "train.eval_size=4",
    "train.checkpoint_every=100",
    "train.progress=false",
    "prm.problems=12",
    "prm.samples=2",
    "prm.steps=20",
    "prm.batch_size=8",
    "prm.mc_n=2",
    "reward.source=prm",
    "reward.prm=auto",
]
PURE = ["credit.estimator=min_form", "credit.outcome_coef=0.1"]


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CREDITRL_CACHE", str(tmp_path_factory.mktemp("cache")))
        yield


def finite(rows: list[dict]) -> bool:
    return all(math.isfinite(v) for r in rows for v in r.values() if isinstance(v, (int, float)))


def test_the_pure_example_config_is_this_recipe() -> None:
    cfg = checked(load_config(EXAMPLE))
    assert (cfg.reward.source, cfg.reward.prm, cfg.reward.granularity) == ("prm", "auto", "step")
    assert (cfg.credit.estimator, cfg.credit.outcome_coef, cfg.credit.gamma) == ("min_form", 0.1, 1.0)


@pytest.mark.slow
def test_outcome_plus_weighted_prm_at_step_granularity(cache, tmp_path: Path) -> None:
    over = ["reward.sources=[outcome]", "reward.weights=[1.0, 0.5]", "credit.estimator=grpo_process"]
    trainer = RLTrainer.from_config(load_config(overrides=SMALL + over), tmp_path / "run")
    assert Path(trainer.cfg.reward.prm).is_dir() and trainer.cfg.reward.granularity == "step"
    rows = trainer.run().history
    assert finite(rows)
    for r in rows[1:]:  # reward = 1.0 * PRM step rewards + 0.5 * outcome, each source's mean logged
        assert r["reward/mean"] == pytest.approx(r["reward/by_source/prm"] + 0.5 * r["reward/by_source/outcome"])
        assert r["reward/placed_per_response"] >= 1.0


@pytest.mark.slow
def test_pure_recipe_is_min_form_plus_the_outcome_term(cache, tmp_path: Path, monkeypatch) -> None:
    seen = []
    credit = stages.credit

    def spy(batch, scored, settings, **k):
        adv, ret = credit(batch, scored, settings, **k)
        seen.append((batch, scored, adv))
        return adv, ret

    monkeypatch.setattr(stages, "credit", spy)
    trainer = RLTrainer.from_config(load_config(overrides=SMALL + PURE), tmp_path / "run")
    rows = trainer.run().history
    assert finite(rows) and len(seen) == 2
    varied = False
    for batch, scored, adv in seen:
        keep = scored.keep
        mask = batch.response_mask[keep]
        groups = batch.group_ids[keep]
        dense, _ = estimate_at(
            "token", "min_form", scored.rewards[keep], scored.reward_mask[keep], mask, group_ids=groups
        )
        outcome = scored.outcome[keep].to(dense.dtype)
        assert torch.allclose(adv[keep], dense + 0.1 * outcome_advantage(outcome, mask, groups), atol=1e-6)
        varied |= bool(outcome.min() < outcome.max())
    assert varied, "the warm start should get some answers right and some wrong"
