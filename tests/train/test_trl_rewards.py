"""Reward functions by import path with TRL's signature: one, several with weights, and a dense
per-step one, each training through `creditrl train`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from creditrl.config import load_config
from creditrl.errors import ConfigError
from creditrl.rewards import function_source
from creditrl.tasks import make_task
from creditrl.train.resolve import checked
from creditrl.train.rl import RLTrainer

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
RUN = [
    "task.args={min_ops: 1, max_ops: 2, operand_max: 3}",
    "train.init=policy",
    "rollout.prompts_per_iter=4",
    "rollout.group_size=4",
    "rollout.max_new_tokens=12",
    "train.eval_size=4",
    "train.progress=false",
    "train.threads=1",
    "train.iterations=3",
    "train.checkpoint_every=3",
]


@pytest.fixture(autouse=True)
def examples_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(EXAMPLES))
    sys.modules.pop("trl_rewards", None)


def rows(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()][1:]


def test_a_trl_signature_function_scores_like_its_own_call() -> None:
    import trl_rewards

    task = make_task("arithmetic", min_ops=1, max_ops=1)
    (p,) = task.sample(1, split="train", seed=0)
    source = function_source("trl_rewards:exact_answer")
    assert source.default_granularity == "sequence" and source.name == "trl_rewards:exact_answer"
    for completion, want in ((p.solution, 1.0), ("1+1=3;#3", 0.0)):
        assert source.fn(task, p, completion, [completion]) == [want]
        assert trl_rewards.exact_answer([p.prompt], [completion], answer=[p.answer]) == [want]
    dense = function_source("trl_rewards:well_formed_steps")
    assert dense.default_granularity == "step"
    assert dense.fn(task, p, "1+2=3;x;", ["1+2=3;", "x;"]) == [1.0, 0.0]


@pytest.mark.parametrize(
    "over, by_source",
    [
        (["reward.source=trl_rewards:exact_answer"], []),
        (
            [
                "reward.source=trl_rewards:exact_answer",
                "reward.sources=[trl_rewards:concise]",
                "reward.weights=[1.0, 0.5]",
            ],
            ["trl_rewards:exact_answer", "trl_rewards:concise"],
        ),
        (["reward.source=trl_rewards:well_formed_steps", "credit.estimator=grpo_process"], []),
    ],
    ids=["one", "two-weighted", "dense-steps"],
)
def test_reward_functions_train_for_three_iterations(tmp_path: Path, over: list[str], by_source: list[str]) -> None:
    cfg = load_config(overrides=RUN + over)
    RLTrainer.from_config(cfg, tmp_path / "run").run()
    got = rows(tmp_path / "run")
    assert len(got) == 3
    name = cfg.reward.source
    assert all(r[f"reward/errors/{name}"] == 0 and r[f"reward/timeouts/{name}"] == 0 for r in got)
    if by_source:
        for r in got:
            parts = [r[f"reward/by_source/{n}"] for n in by_source]
            assert r["reward/mean"] == pytest.approx(parts[0] + 0.5 * parts[1], abs=1e-5)
            assert parts[1] > 0  # concise pays something for any completion under 64 characters
    if name.endswith("steps"):  # placed per step (a random policy writes one step: one reward per response)
        assert checked(cfg).reward.granularity == "step"
        assert all(r["reward/placed_per_response"] >= 1 for r in got)


def test_bad_function_sources_are_one_line_errors() -> None:
    with pytest.raises(ConfigError, match=r"^reward.source: cannot import module 'no_such_module'"):
        checked(load_config(overrides=RUN + ["reward.source=no_such_module:f"]))
    with pytest.raises(ConfigError, match=r"reward.weights: 3 weights for 2 sources"):
        load_config(overrides=RUN + ["reward.sources=[outcome]", "reward.weights=[1, 2, 3]"])


def test_a_dense_function_places_one_reward_per_step(scored_by) -> None:
    from creditrl.policy.model import build_tiny
    from creditrl.rewards.stage import Scorer

    _, tok = build_tiny(0)
    cfg = checked(load_config(overrides=RUN + ["reward.source=trl_rewards:well_formed_steps"]))
    task = make_task(cfg.task.name, **cfg.task.args)
    (p,) = task.sample(1, split="train", seed=0)
    completion = "1+2=3;oops;#3"  # a well-formed step, a malformed one, the answer
    scored = scored_by(None, [p], [completion], scorer=Scorer(cfg, task, tok), tokenizer=tok)
    placed = scored.rewards[0][scored.reward_mask[0]].tolist()
    assert placed == [1.0, 0.0, 0.0]  # "1+2=3;" and "oops;" and the final "#3" span
