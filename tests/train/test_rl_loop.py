"""End-to-end checks of the RL loop on the embedded default: learning, resume, run directory."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from creditrl.config import load_config
from creditrl.policy.tokenizer import encode_prompt
from creditrl.train.checkpoint import latest_name
from creditrl.train.rl import RLTrainer
from creditrl.train.sft import cached_sft

# An easy setting: the four sums of 1..2, a warm start that teaches only the format, then RL.
EASY = [
    "task.args={min_ops: 1, max_ops: 1, operand_min: 1, operand_max: 2, operators: '+', heldout_mod: 2}",
    "sft.task_args={min_ops: 1, max_ops: 1, operand_min: 1, operand_max: 2, operators: '+', heldout_mod: 2}",
    "sft.steps=30",
    "sft.batch_size=16",
    "sft.warmup_steps=5",
    "sft.lr=0.003",
    "rollout.prompts_per_iter=8",
    "rollout.group_size=8",
    "rollout.max_new_tokens=12",
    "optim.lr=3e-4",
    "train.eval_size=32",
    "train.progress=false",
]


@pytest.fixture(scope="module")
def sft_dir(tmp_path_factory: pytest.TempPathFactory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CREDITRL_CACHE", str(tmp_path_factory.mktemp("cache")))
        path, metrics = cached_sft(load_config(overrides=EASY), progress=False)
        assert 0.0 <= metrics["eval/accuracy"] <= 1.0
        assert path.parent.parent == Path(os.environ["CREDITRL_CACHE"])  # written to the cache
        yield str(path)


def rows(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_mean_reward_rises_on_easy_setting(sft_dir: str, tmp_path: Path) -> None:
    torch.manual_seed(0)
    cfg = load_config(overrides=EASY + ["train.iterations=30", "train.eval_every=30", "train.checkpoint_every=30"])
    result = RLTrainer.from_config(cfg, tmp_path / "run", init_path=sft_dir).run()
    rewards = [r["reward/mean"] for r in result.history if "reward/mean" in r]
    assert len(rewards) == 30
    first, last = sum(rewards[:6]) / 6, sum(rewards[-6:]) / 6
    assert last > first + 0.15, (first, last)


@pytest.mark.parametrize("optimizer", [[], ["optim.name=sgd", "optim.lr=0.05"]], ids=["adamw", "sgd"])
def test_resume_gives_the_same_metrics(sft_dir: str, tmp_path: Path, optimizer: list[str]) -> None:
    over = (
        EASY + optimizer + ["train.iterations=4", "train.eval_every=2", "train.checkpoint_every=2", "train.threads=1"]
    )
    full = RLTrainer.from_config(load_config(overrides=over), tmp_path / "full", init_path=sft_dir)
    assert type(full.parts.optimizer).__name__ == ("SGD" if optimizer else "AdamW")
    full.run()
    # an interrupted run: stop after the checkpoint at iteration 2, then resume to 4
    part = RLTrainer.from_config(
        load_config(overrides=over + ["train.iterations=2"]), tmp_path / "part", init_path=sft_dir
    )
    part.run()
    cfg_text = (tmp_path / "part" / "config.yaml").read_text().replace("\n  iterations: 2\n", "\n  iterations: 4\n")
    (tmp_path / "part" / "config.yaml").write_text(cfg_text)
    RLTrainer.resume(tmp_path / "part").run()
    a, b = rows(tmp_path / "full"), rows(tmp_path / "part")
    assert [r["iteration"] for r in a] == [r["iteration"] for r in b] == [0, 1, 2, 3, 4]
    for ra, rb in zip(a, b):
        for key in ra:
            if key.startswith("time/"):
                continue
            assert ra[key] == pytest.approx(rb[key], abs=1e-6), (ra["iteration"], key)


def test_run_directory_contents(sft_dir: str, tmp_path: Path) -> None:
    cfg = load_config(overrides=EASY + ["train.iterations=2", "train.eval_every=1", "train.checkpoint_every=1"])
    trainer = RLTrainer.from_config(cfg, tmp_path / "run", init_path=sft_dir)
    trainer.run()
    run = tmp_path / "run"
    assert load_config(run / "config.yaml") == trainer.cfg  # the resolved config the run used
    metrics = rows(run)
    assert [r["iteration"] for r in metrics] == [0, 1, 2]
    for key in (
        "reward/mean",
        "policy/clipfrac",
        "policy/approx_kl",
        "policy/entropy",
        "adv/std",
        "time/rollout_s",
        "time/update_s",
        "eval/accuracy",
        "eval/step_accuracy",
    ):
        assert key in metrics[-1]
    ckpts = run / "checkpoints"
    assert latest_name(ckpts) == "iter_000002"
    for name in ("iter_000001", "iter_000002"):
        for f in ("model.safetensors", "tokenizer.json", "optimizer.pt", "rng.pt", "trainer_state.json"):
            assert (ckpts / name / f).exists()
    assert not list(ckpts.glob("*.tmp"))


def test_sft_is_cached_by_config_hash(sft_dir: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from creditrl.train.sft import sft_key

    monkeypatch.setenv("CREDITRL_CACHE", str(Path(sft_dir).parent.parent))
    cfg = load_config(overrides=EASY)
    again, metrics = cached_sft(cfg, progress=False)  # no retraining: the state file is read back
    assert str(again) == sft_dir
    state = json.loads((again / "trainer_state.json").read_text())
    assert metrics == state["metrics"]
    assert sft_key(load_config(overrides=EASY + ["sft.steps=31"])) != sft_key(cfg)
    assert sft_key(load_config(overrides=EASY + ["train.iterations=7"])) == sft_key(cfg)
    for choice in ("policy.engine=hf", "policy.kernels=torch"):  # generation only: the checkpoint is the same
        assert sft_key(load_config(overrides=EASY + [choice])) == sft_key(cfg)


def test_token_budget_stops_the_run_with_a_final_evaluation(sft_dir: str, tmp_path: Path) -> None:
    cfg = load_config(
        overrides=EASY
        + ["train.iterations=50", "train.eval_every=50", "train.checkpoint_every=50", "train.max_tokens=600"]
    )
    trainer = RLTrainer.from_config(cfg, tmp_path / "run", init_path=sft_dir)
    history = trainer.run().history
    last = history[-1]
    assert last["tokens/total"] >= 600 > history[-2]["tokens/total"]  # stopped at the first iteration past it
    assert last["iteration"] < 50 and "eval/accuracy" in last
    assert sum(r["tokens/generated"] for r in history[1:]) == last["tokens/total"]
    # EASY's prompts ("a+b=" with one-digit operands) all have one length: 64 rows of it, no padding
    tok, task = trainer.parts.tokenizer, trainer.parts.task
    (length,) = {len(encode_prompt(tok, p.prompt)) for p in task.sample(32, split="train", seed=0)}
    assert all(r["tokens/prompt"] == 64 * length for r in history[1:])
    assert all(r["tokens/prompt"] + r["tokens/generated"] <= r["tokens/padded"] for r in history[1:])
    assert latest_name(tmp_path / "run" / "checkpoints") == f"iter_{last['iteration']:06d}"


def test_pass_at_k_metrics_match_hand_counts() -> None:
    from creditrl.train.metrics import pass_at_k_metrics as _pass_at_k

    groups = torch.tensor([0, 0, 0, 1, 1, 1, 2, 2, 2])
    outcome = torch.tensor([1.0, 0, 0, 0, 0, 0, 1, 1, 0])
    m = _pass_at_k(groups, outcome)
    assert m["train/pass@1"] == pytest.approx((1 / 3 + 0 + 2 / 3) / 3)  # = the accuracy with equal groups
    assert m["train/pass_k"] == 3 and m["train/pass@k"] == pytest.approx(2 / 3)  # groups with any success
    m2 = _pass_at_k(torch.tensor([0, 0, 0, 1, 1]), torch.tensor([1.0, 0, 0, 0, 1]))
    # k = 2 (the smallest group): group 0: 1 - C(2,2)/C(3,2) = 2/3; group 1: 1 - 0 = 1
    assert m2["train/pass_k"] == 2 and m2["train/pass@k"] == pytest.approx((2 / 3 + 1) / 2)


def test_a_resumed_run_carries_its_cpu_seconds_from_the_checkpoint(
    sft_dir: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from creditrl.train import checkpoint, rl

    now = [100.0]  # a fake run clock: it moves only where the test moves it
    monkeypatch.setattr(rl, "run_cpu_s", lambda: now[0])
    over = EASY + ["train.iterations=2", "train.eval_every=2", "train.checkpoint_every=1", "train.threads=1"]
    part = RLTrainer.from_config(load_config(overrides=over), tmp_path / "part", init_path=sft_dir)
    now[0] = 130.0
    part.run()
    ckpts = tmp_path / "part" / "checkpoints"
    state = json.loads((ckpts / "iter_000002" / "trainer_state.json").read_text())
    assert state["cpu_s"] == 30.0  # this process's seconds since the trainer was built
    cfg_text = (tmp_path / "part" / "config.yaml").read_text().replace("\n  iterations: 2\n", "\n  iterations: 3\n")
    (tmp_path / "part" / "config.yaml").write_text(cfg_text)
    now[0] = 500.0  # a new process: its own clock reading is not the run's
    resumed = RLTrainer.resume(tmp_path / "part")
    now[0] = 510.0
    resumed.run()
    assert resumed.cpu_s() == 40.0  # 30 carried from iteration 2's checkpoint + 10 of its own
    assert json.loads((ckpts / "iter_000003" / "trainer_state.json").read_text())["cpu_s"] == 40.0

    # a checkpoint written before runs recorded their CPU seconds: the run's total is unknown, not its last part
    ckpt = ckpts / "iter_000003"
    state = json.loads((ckpt / "trainer_state.json").read_text())
    del state["cpu_s"]
    (ckpt / "trainer_state.json").write_text(json.dumps(state))
    checkpoint.write_manifest(ckpt)
    (tmp_path / "part" / "config.yaml").write_text(cfg_text.replace("\n  iterations: 3\n", "\n  iterations: 4\n"))
    again = RLTrainer.resume(tmp_path / "part")
    assert again.start_iteration == 3 and again.cpu_s() is None
