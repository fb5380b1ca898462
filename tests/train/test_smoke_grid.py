"""Smoke grid: every granularity x every estimator x value source runs two RL iterations on the
tiny model without error or NaN; plus the critic warm-up, the hybrids and shaping in the loop."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from creditrl.config import load_config
from creditrl.credit import ESTIMATORS, requires
from creditrl.rewards.placement import GRANULARITIES
from creditrl.train.rl import RLTrainer
from creditrl.train.sft import cached_sft

# Two-operation sums and products: a 40-step warm start writes "a*b=c;c+d=e;#e"-shaped
# answers, so responses have several steps and MC values have something to estimate.
SMALL = [
    "task.args={min_ops: 1, max_ops: 2, operand_max: 3}",
    "sft.task_args={min_ops: 1, max_ops: 2, operand_max: 3}",
    "sft.steps=150",
    "sft.batch_size=32",
    "sft.warmup_steps=10",
    "sft.lr=0.003",
    "rollout.prompts_per_iter=2",
    "rollout.group_size=3",
    "rollout.max_new_tokens=20",
    "train.iterations=2",
    "train.eval_every=100",
    "train.eval_size=4",
    "train.checkpoint_every=100",
    "train.progress=false",
    "reward.segment_tokens=4",
    "value.mc_samples=2",
]

VALUE_FREE = sorted(n for n in ESTIMATORS if "values" not in requires(n))
VALUED = sorted(n for n in ESTIMATORS if "values" in requires(n))
VALUE_SOURCES = ["critic", "dual_critic", "mc", "tree"]
TREE = ["rollout.group_size=4", "value.tree_branching=2", "value.tree_depth=2"]  # 2 x 2 leaves per prompt
ARMS = [(e, "none") for e in VALUE_FREE] + [(e, v) for e in VALUED for v in VALUE_SOURCES]


@pytest.fixture(scope="module")
def sft_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CREDITRL_CACHE", str(tmp_path_factory.mktemp("cache")))
        path, _ = cached_sft(load_config(overrides=SMALL), progress=False)
        return str(path)


def run(sft_dir: str, tmp_path: Path, over: list[str]) -> list[dict]:
    cfg = load_config(overrides=SMALL + over)
    return RLTrainer.from_config(cfg, tmp_path / "run", init_path=sft_dir).run().history


def all_finite(rows: list[dict]) -> bool:
    return all(math.isfinite(v) for r in rows for v in r.values() if isinstance(v, (int, float)))


def test_the_grid_covers_every_registered_name() -> None:
    assert set(GRANULARITIES) == {"sequence", "step", "segment", "token", "key_token"}
    assert {e for e, _ in ARMS} == set(ESTIMATORS)


@pytest.mark.parametrize("granularity", sorted(GRANULARITIES))
@pytest.mark.parametrize("estimator,value_source", ARMS)
def test_every_granularity_estimator_and_value_source_runs(
    sft_dir: str, tmp_path: Path, granularity: str, estimator: str, value_source: str
) -> None:
    source = "outcome" if granularity == "sequence" else "oracle_steps"
    rows = run(
        sft_dir,
        tmp_path,
        [
            f"reward.source={source}",
            f"reward.granularity={granularity}",
            f"credit.estimator={estimator}",
            f"value.source={value_source}",
            *(TREE if value_source == "tree" else []),
        ],
    )
    assert [r["iteration"] for r in rows] == [0, 1, 2]
    assert all_finite(rows)
    for r in rows[1:]:
        assert r["reward/placed_per_response"] > 0
        if granularity == "sequence":
            assert r["reward/placed_per_response"] == 1.0
        if granularity == "token":  # the oracle labels tokens up to the first wrong step
            assert r["reward/placed_per_response"] > 1.0
        if value_source != "none":
            assert "value/mean" in r and "value/explained_variance" in r
        if value_source in ("critic", "dual_critic"):
            assert r["loss/value"] > 0
        if value_source == "mc":
            assert r["value/mc_states"] >= 2  # at least s_0 of each prompt
            assert 0.0 <= r["value/mean"] <= 1.0
        if value_source == "tree":  # two prompts' trees; leaves share their first step
            assert 2 <= r["value/tree_nodes"] and 1.0 <= r["value/tree_segments"] <= 2.0
            assert 0.0 <= r["value/mean"] <= 1.0
            assert r["tokens/generated"] < r["response/length"] * 8 or r["value/tree_segments"] == 1.0


def test_critic_warmup_trains_only_the_critic(sft_dir: str, tmp_path: Path) -> None:
    cfg = load_config(
        overrides=SMALL + ["credit.estimator=gae", "value.source=critic", "value.warmup_iterations=2", "value.lr=1e-3"]
    )
    trainer = RLTrainer.from_config(cfg, tmp_path / "run", init_path=sft_dir)
    policy_before = [p.detach().clone() for p in trainer.parts.model.parameters()]
    critic_before = [p.detach().clone() for p in trainer.parts.value_stage.critic.parameters()]
    rows = trainer.run().history
    assert [r["policy/updated"] for r in rows[1:]] == [0.0, 0.0]
    assert all(torch.equal(a, b) for a, b in zip(policy_before, trainer.parts.model.parameters()))
    assert any(not torch.equal(a, b) for a, b in zip(critic_before, trainer.parts.value_stage.critic.parameters()))


@pytest.mark.parametrize("warmup", [0, 2])
def test_shared_critic_moves_the_trunk_only_when_the_policy_trains(sft_dir: str, tmp_path: Path, warmup: int) -> None:
    cfg = load_config(
        overrides=SMALL
        + [
            "credit.estimator=gae",
            "value.source=dual_critic",
            "value.model=shared",
            f"value.warmup_iterations={warmup}",
        ]
    )
    trainer = RLTrainer.from_config(cfg, tmp_path / "run", init_path=sft_dir)
    assert trainer.parts.value_stage.critic.shared and trainer.parts.value_stage.critic.members == 2
    before = [p.detach().clone() for p in trainer.parts.model.parameters()]
    heads = [p.detach().clone() for p in trainer.parts.value_stage.critic.parameters()]
    trainer.run()
    moved = any(not torch.equal(a, b) for a, b in zip(before, trainer.parts.model.parameters()))
    assert moved == (warmup == 0)
    assert any(not torch.equal(a, b) for a, b in zip(heads, trainer.parts.value_stage.critic.parameters()))


def test_hybrids_and_shaping_in_the_loop(sft_dir: str, tmp_path: Path) -> None:
    rows = run(
        sft_dir,
        tmp_path,
        [
            "train.iterations=4",
            "hybrid.filter=group_accuracy",
            "hybrid.filter_lo=0.0",
            "hybrid.filter_hi=1.0",
            "hybrid.dense_source=oracle_steps",
            "hybrid.schedule=switch",
            "hybrid.switch_at=0.5",
            "hybrid.calibrate=true",
            "shaping.length_budget=4",
            "shaping.length_coef=0.01",
            "shaping.kl_coef=0.05",
            "credit.estimator=grpo_process",
        ],
    )
    assert all_finite(rows)
    # switch at 50%: iterations 1-2 are sequence-only, 3-4 dense-only
    assert [(r["hybrid/w_seq"], r["hybrid/w_dense"] > 0) for r in rows[1:]] == [
        (1.0, False),
        (1.0, False),
        (0.0, True),
        (0.0, True),
    ]
    # the oracle's verdict (every step right) matches the outcome checker except for a right
    # answer reached through a wrong step, which is rare: near-full trust
    assert all(r["hybrid/agreement"] >= 0.9 for r in rows[1:])
    assert all(r["reward/filtered"] == 0 for r in rows[1:])  # [0, 1] keeps every group


def test_lambda_schedule_reaches_the_loop(sft_dir: str, tmp_path: Path) -> None:
    rows = run(
        sft_dir,
        tmp_path,
        ["train.iterations=4", "credit.estimator=gae", "value.source=critic", "credit.lam=0.5", "credit.lam_end=0.9"],
    )
    assert [r["credit/lam"] for r in rows[1:]] == pytest.approx([0.5, 0.6, 0.7, 0.8])


def test_separate_critic_on_its_own_backbone(sft_dir: str, tmp_path: Path) -> None:
    cfg = load_config(overrides=SMALL + ["credit.estimator=gae", "value.source=dual_critic", "value.backbone=tiny"])
    trainer = RLTrainer.from_config(cfg, tmp_path / "run", init_path=sft_dir)
    critic = trainer.parts.value_stage.critic
    assert not critic.shared and len(critic.backbones) == 2
    # fresh tiny backbones, not copies of the SFT policy
    policy_embed = trainer.parts.model.base_model.embed_tokens.weight
    assert not torch.equal(critic.backbones[0].embed_tokens.weight, policy_embed)
    assert all_finite(trainer.run().history)


def test_resume_with_critic_and_calibrator_gives_the_same_metrics(sft_dir: str, tmp_path: Path) -> None:
    over = SMALL + [
        "train.iterations=4",
        "train.checkpoint_every=2",
        "train.eval_every=2",
        "credit.estimator=gae",
        "value.source=critic",
        "value.lr=1e-3",
        "hybrid.dense_source=oracle_steps",
        "hybrid.calibrate=true",
    ]
    RLTrainer.from_config(load_config(overrides=over), tmp_path / "full", init_path=sft_dir).run()
    part = RLTrainer.from_config(
        load_config(overrides=over + ["train.iterations=2"]), tmp_path / "part", init_path=sft_dir
    )
    part.run()
    cfg_text = (tmp_path / "part" / "config.yaml").read_text().replace("\n  iterations: 2\n", "\n  iterations: 4\n")
    (tmp_path / "part" / "config.yaml").write_text(cfg_text)
    RLTrainer.resume(tmp_path / "part").run()
    import json

    a, b = (
        [json.loads(x) for x in (tmp_path / d / "metrics.jsonl").read_text().splitlines()] for d in ("full", "part")
    )
    assert [r["iteration"] for r in a] == [r["iteration"] for r in b] == [0, 1, 2, 3, 4]
    for ra, rb in zip(a, b):
        for key in ra:
            if not key.startswith("time/"):
                assert ra[key] == pytest.approx(rb[key], abs=1e-6), (ra["iteration"], key)
