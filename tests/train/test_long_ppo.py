"""PPO for long outputs as its practitioners run it (issue 59, item 1): the decoupled critic lambda
(``credit.lam_critic``, VC-PPO), the length-adaptive policy lambda (``credit.lam_alpha``, VAPO),
value pretraining (``value.pretrain_iterations``, VC-PPO) and the critic at step resolution, in
the loop. The estimator maths is tested against loops in ``tests/credit/test_lambdas.py``."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from creditrl.config import load_config
from creditrl.credit import estimate
from creditrl.errors import ConfigError
from creditrl.train import stages
from creditrl.train.resolve import checked
from creditrl.train.rl import RLTrainer
from small_runs import TINY_RUN

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "long_ppo.yaml"
PPO = ["credit.estimator=gae", "value.source=critic", "credit.lam=0.95", "value.lr=1e-3"]
LONG_PPO = PPO + ["credit.lam_critic=1.0", "credit.lam_alpha=0.05", "value.pretrain_iterations=2"]


def finite(rows: list[dict]) -> bool:
    return all(math.isfinite(v) for r in rows for v in r.values() if isinstance(v, (int, float)))


def test_the_defaults_leave_the_options_off() -> None:
    cfg = load_config()
    assert (cfg.credit.lam_critic, cfg.credit.lam_alpha, cfg.value.pretrain_iterations) == (None, 0.0, 0)
    assert checked(load_config(overrides=TINY_RUN + LONG_PPO)).credit.lam_critic == 1.0


def test_the_example_config_is_the_repaired_ppo() -> None:
    cfg = checked(load_config(EXAMPLE))
    assert (cfg.credit.estimator, cfg.value.source, cfg.credit.resolution) == ("gae", "critic", "token")
    assert (cfg.credit.lam_critic, cfg.credit.lam_alpha, cfg.value.pretrain_iterations) == (1.0, 0.05, 10)


@pytest.mark.parametrize(
    "over, message",
    [
        (["value.pretrain_iterations=2"], "value.pretrain_iterations: only a learned critic is pretrained"),
        (["credit.lam_critic=1.0"], "credit.lam_critic: the returns' lambda is what a learned critic trains on"),
        (
            ["credit.estimator=gae", "value.source=mc", "credit.lam_critic=1.0"],
            "credit.lam_critic: .* with value.source='mc' nothing does",
        ),
        (["credit.lam_alpha=0.05"], "credit.lam_alpha: estimator 'grpo' does not bootstrap on values"),
        (["credit.lam_critic=1.5"], "credit.lam_critic"),
        (["credit.lam_alpha=-1"], "credit.lam_alpha"),
    ],
)
def test_the_options_are_refused_where_nothing_reads_them(over: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        checked(load_config(overrides=TINY_RUN + over))


@pytest.mark.slow
def test_long_output_ppo_runs_three_iterations(tmp_path: Path) -> None:
    """lam_critic = 1, lam_alpha = 0.05 and two pretraining iterations: iteration 0 logs the
    pretraining's explained variance and samples, every iteration the critic's, and the losses
    stay finite."""
    cfg = load_config(overrides=TINY_RUN + LONG_PPO + ["train.iterations=3"])
    rows = RLTrainer.from_config(cfg, tmp_path / "run").run().history
    assert [r["iteration"] for r in rows] == [0, 1, 2, 3]
    assert finite(rows)
    first = rows[0]
    assert first["pretrain/iterations"] == 2
    assert -math.inf < first["pretrain/explained_variance"] <= 1.0
    assert -math.inf < first["pretrain/explained_variance_first"] <= 1.0
    assert first["pretrain/loss_value"] > 0
    assert first["samples/total"] == 2 * 4 * 4  # the pretraining's samples count (prompts x group)
    assert first["tokens/total"] > 0 and first["time/pretrain_s"] > 0
    for r in rows[1:]:
        assert "value/explained_variance" in r and r["value/explained_variance"] <= 1.0
        assert r["loss/value"] > 0 and math.isfinite(r["loss/policy"])
        assert r["policy/updated"] == 1.0
        assert 0.0 <= r["credit/lam_policy_mean"] < 1.0  # VAPO's lambda: 1 - 1/(0.05 l), clamped
    assert rows[-1]["samples/total"] == 32 + 3 * 16


@pytest.mark.slow
def test_pretraining_trains_the_critic_only_on_monte_carlo_returns(tmp_path: Path) -> None:
    cfg = load_config(overrides=TINY_RUN + PPO + ["value.pretrain_iterations=2", "credit.lam=0.0"])
    trainer = RLTrainer.from_config(cfg, tmp_path / "run")
    policy = [p.detach().clone() for p in trainer.parts.model.parameters()]
    critic = [p.detach().clone() for p in trainer.parts.value_stage.critic.parameters()]
    targets = []
    learn = stages.learn

    def spy(parts, batch, scored, adv, ret, *a, **k):
        targets.append((batch, scored, ret))
        assert k["train_policy"] is False
        return learn(parts, batch, scored, adv, ret, *a, **k)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(stages, "learn", spy)
        out = trainer._pretrain_critic()
    assert out["pretrain/iterations"] == 2 and len(targets) == 2
    assert all(torch.equal(a, b) for a, b in zip(policy, trainer.parts.model.parameters(), strict=True))
    assert any(not torch.equal(a, b) for a, b in zip(critic, trainer.parts.value_stage.critic.parameters()))
    # credit.lam = 0 for RL, but the pretraining targets are the Monte-Carlo returns: the outcome
    # (the only reward, on the last token) on every valid token of its response.
    for batch, scored, ret in targets:
        mask = batch.response_mask & scored.keep[:, None]
        outcome = (scored.rewards * batch.response_mask).sum(1, keepdim=True).expand_as(ret)
        assert torch.allclose(ret[mask], outcome[mask], atol=1e-6)


@pytest.mark.slow
def test_a_critic_at_step_resolution_runs(tmp_path: Path) -> None:
    """A learned critic with one time step per reasoning step (per-step rewards from the step
    oracle), with the decoupled and length-adaptive lambdas (l = steps) and pretraining."""
    over = [
        "reward.source=oracle_steps",
        "credit.resolution=step",
        "train.iterations=2",
        "value.pretrain_iterations=1",
        "credit.lam_critic=1.0",
        "credit.lam_alpha=0.5",
    ]
    cfg = load_config(overrides=TINY_RUN + PPO + over)
    trainer = RLTrainer.from_config(cfg, tmp_path / "run")
    assert trainer.cfg.credit.resolution == "step"
    targets = []
    learn = stages.learn

    def spy(parts, batch, scored, adv, ret, *a, **k):
        targets.append((batch, scored, ret))
        return learn(parts, batch, scored, adv, ret, *a, **k)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(stages, "learn", spy)
        rows = trainer.run().history
    assert finite(rows) and [r["iteration"] for r in rows] == [0, 1, 2]
    assert len(targets) == 3  # one pretraining round, two iterations
    # lam_critic = 1, gamma = 1: every token of step k is trained toward the rewards of steps k, k+1, ...
    # (the step rewards sit on step ends, so that is each token's reward-to-go)
    for batch, scored, ret in targets:
        mask = batch.response_mask & scored.keep[:, None]
        _, to_go = estimate("reinforce", scored.rewards, scored.reward_mask, batch.response_mask)
        assert torch.allclose(ret[mask], to_go[mask], atol=1e-5)
    assert "pretrain/explained_variance" in rows[0]
    for r in rows[1:]:
        assert r["reward/placed_per_response"] >= 1.0
        # at most 10 tokens, so at most 10 steps: 1 - 1/(0.5 l) is at most 0.8 (and 0 up to 2 steps)
        assert 0.0 <= r["credit/lam_policy_mean"] <= 0.8 + 1e-9
        assert "value/explained_variance" in r and r["loss/value"] > 0
