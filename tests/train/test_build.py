"""The build layer: the task is built once per run, the config is resolved once and frozen, and
the run directory's config.yaml is exactly that resolved config."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from creditrl.config import load_config
from creditrl.tasks import TASKS, register_task
from creditrl.tasks.arithmetic import ArithmeticTask
from creditrl.train.build import build_run
from creditrl.train.resolve import checked
from creditrl.train.rl import RLTrainer

TINY = [
    "train.init=policy",
    "task.args={min_ops: 1, max_ops: 2, operand_max: 3}",
    "rollout.prompts_per_iter=2",
    "rollout.group_size=2",
    "rollout.max_new_tokens=12",
    "train.iterations=1",
    "train.eval_size=4",
    "train.progress=false",
    "train.checkpoint_every=1",
    "train.eval_every=1",
]


@pytest.fixture
def counting_task():
    """A registered arithmetic task that counts its constructions, per constructor arguments."""
    name, built = "test_build_counting", []

    @register_task(name)
    def factory(**kwargs):
        built.append(dict(kwargs))
        return ArithmeticTask(**kwargs)

    yield name, built
    del TASKS[name]


def test_the_task_is_built_once_per_run(counting_task, tmp_path: Path) -> None:
    name, built = counting_task
    over = TINY + [
        f"task.name={name}",
        "task.args={min_ops: 1, max_ops: 2, operand_max: 3}",
        "sft.task_args={}",
        "reward.source=oracle_steps",
        "credit.estimator=gae",
        "value.source=mc",
        "value.mc_samples=2",
        "hybrid.dense_source=outcome",
        "train.eval_every=1",
    ]
    RLTrainer.from_config(load_config(overrides=over), tmp_path / "run").run()
    assert len(built) == 1  # checks, scorer, value stage, evaluation and the loop all share it


def test_an_sft_start_builds_the_sft_task_once_more(counting_task, tmp_path: Path, monkeypatch) -> None:
    name, built = counting_task
    monkeypatch.setenv("CREDITRL_CACHE", str(tmp_path / "cache"))
    over = [o for o in TINY if not o.startswith("train.init")] + [
        f"task.name={name}",
        "task.args={min_ops: 1, max_ops: 2, operand_max: 3}",
        "sft.task_args={min_ops: 1, max_ops: 1, operand_max: 3}",
        "sft.steps=2",
        "sft.batch_size=4",
        "sft.warmup_steps=1",
    ]
    build_run(load_config(overrides=over))
    assert built == [{"min_ops": 1, "max_ops": 2, "operand_max": 3}, {"min_ops": 1, "max_ops": 1, "operand_max": 3}]


def test_config_yaml_is_the_resolved_config(tmp_path: Path) -> None:
    cfg = load_config(overrides=TINY + ["reward.source=oracle_steps", "credit.estimator=gae", "value.source=critic"])
    unresolved = {
        ("policy", "engine"): "auto",
        ("policy", "kernels"): "auto",
        ("policy", "chat_template"): "auto",
        ("reward", "granularity"): "",
        ("reward", "step_separator"): None,
        ("credit", "resolution"): "auto",
        ("loss", "recompute_logprobs"): "auto",
        ("loss", "clip_eps_high"): None,
        ("train", "threads"): 0,
        ("prm", "completer"): "",
    }
    for (section, key), value in unresolved.items():  # the loaded config still holds its defaults
        assert getattr(getattr(cfg, section), key) == value
    trainer = RLTrainer.from_config(cfg, tmp_path / "run")
    trainer.run()
    saved = load_config(tmp_path / "run" / "config.yaml")
    assert saved == trainer.cfg
    assert (saved.policy.engine, saved.policy.kernels, saved.policy.chat_template) == ("static", "numba", "none")
    assert (saved.reward.granularity, saved.reward.step_separator, saved.credit.resolution) == ("step", ";", "token")
    assert (saved.loss.recompute_logprobs, saved.loss.clip_eps_high, saved.train.init) == ("never", 0.2, "tiny")
    assert saved.train.threads >= 1 and saved.prm.completer == "tiny"
    # nothing is resolved differently later: checking again, or building again, changes nothing
    assert checked(saved) == saved
    assert build_run(saved).config == saved


def test_the_config_cannot_be_mutated_after_build(tmp_path: Path) -> None:
    trainer = RLTrainer.from_config(load_config(overrides=TINY), tmp_path / "run")
    with pytest.raises(Exception, match="frozen"):
        trainer.cfg.train.iterations = 5
    with pytest.raises(TypeError):
        trainer.cfg.task.args["min_ops"] = 3
    # the stages hold the run's own frozen sections, not copies that could drift
    parts = trainer.parts
    assert parts.scorer.settings.reward is trainer.cfg.reward and parts.scorer.settings.hybrid is trainer.cfg.hybrid
    assert parts.value_stage.settings is trainer.cfg.value


def test_the_engine_choice_is_logged_with_its_reason(tmp_path: Path, caplog) -> None:
    with caplog.at_level(logging.INFO, logger="creditrl"):
        build_run(load_config(overrides=TINY))
        build_run(load_config(overrides=TINY + ["policy.engine=hf"]))
        build_run(load_config(overrides=TINY + ["policy.lora_r=2", "policy.lora_targets=q_proj,v_proj"]))
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("creditrl: engine")]
    assert lines[0] == "creditrl: engine static (auto: the static engine runs llama on the CPU)"
    assert lines[1] == "creditrl: engine hf (as configured)"
    assert lines[2].startswith(
        "creditrl: engine hf (auto: the static engine cannot run this model: the model carries peft"
    )


def test_a_held_out_file_smaller_than_eval_size_is_a_one_line_warning(tmp_path, caplog) -> None:
    import json

    for name, n in (("train.jsonl", 8), ("held.jsonl", 5)):
        rows = [{"question": f"{i}+{i}", "answer": str(2 * i)} for i in range(n)]
        (tmp_path / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = f"{{train_file: {tmp_path / 'train.jsonl'}, heldout_file: {tmp_path / 'held.jsonl'}}}"
    over = ["task.name=math", f"task.args={args}", "train.init=policy", "train.eval_size=32", "train.progress=false"]
    with caplog.at_level(logging.INFO, logger="creditrl"):
        parts = build_run(load_config(overrides=over))
    warned = [r.getMessage() for r in caplog.records if "eval_size" in r.getMessage()]
    assert warned == [
        "creditrl: train.eval_size=32 but the held-out set has 5 problems: evaluation draws them with "
        "replacement (lower train.eval_size to 5 to score each once)"
    ]
    assert len(parts.heldout) == 32
    starts = [r.getMessage() for r in caplog.records if r.getMessage().startswith("creditrl: start policy")]
    assert starts == ["creditrl: start policy tiny on cpu"]


def test_mc_values_get_the_configured_memory_bounds_and_the_runs_engine(tmp_path: Path, monkeypatch) -> None:
    import creditrl.values.stage as stage

    seen = []
    real = stage.mc_values

    def spy(engine, *args, **kwargs):
        seen.append((engine, kwargs["max_rows"], kwargs["max_positions"]))
        return real(engine, *args, **kwargs)

    monkeypatch.setattr(stage, "mc_values", spy)
    over = TINY + ["credit.estimator=gae", "value.source=mc", "value.mc_samples=2", "value.mc_rows_per_call=3"]
    trainer = RLTrainer.from_config(load_config(overrides=over + ["value.mc_positions_per_call=50"]), tmp_path / "r")
    trainer.run()
    assert seen == [(trainer.parts.engine, 3, 50)]
