"""``creditrl.Trainer``: README's example trains as written, TRL reward functions and datasets go in
as objects, configs as dotted keys, and README's TRL name table names real keys."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest
import yaml
from datasets import Dataset, DatasetDict

import creditrl
from creditrl.api.data import PROMPT_TASK
from creditrl.api.functions import FUNCTIONS, source_name
from creditrl.api.trainer import config_layer
from creditrl.config import SECTIONS, Config
from creditrl.errors import ConfigError
from creditrl.policy.model import build_tiny

README = Path(__file__).resolve().parents[1] / "README.md"
SMALL = {
    "rollout.prompts_per_iter": 2,
    "rollout.group_size": 4,
    "rollout.max_new_tokens": 6,
    "train.iterations": 3,
    "train.eval_size": 2,
    "train.eval_every": 3,
    "train.progress": False,
    "train.threads": 1,
}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    """The tiny policy and its tokenizer, saved."""
    model, tok = build_tiny(0)
    out = tmp_path_factory.mktemp("tiny") / "model"
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def metrics(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def test_readme_trainer_example_trains(tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The example as README shows it, with the tiny model for Qwen and 3 small iterations."""
    code = re.search(r"## Python API.*?```python\n(.*?)```", README.read_text(), re.S).group(1)
    assert "creditrl.Trainer(" in code and ".train()" in code
    code = code.replace('"Qwen/Qwen2.5-0.5B-Instruct"', repr(str(tiny)))
    code, n = re.subn(r"config=(\{[^}]*\})", r"config=\1 | SMALL", code)
    assert n == 1
    monkeypatch.chdir(tmp_path)  # the default run directory, runs/train-TIMESTAMP
    scope = {"__name__": "__main__", "SMALL": SMALL}
    exec(compile(code, "README.md", "exec"), scope)  # noqa: S102 - our own README
    run = scope["run_dir"]
    assert run.parent == Path("runs") and run.name.startswith("train-")
    rows = metrics(run)
    assert [r["iteration"] for r in rows] == [0, 1, 2, 3]
    assert all(r["reward/none/python:brief"] == 0 for r in rows[1:])
    assert (run / "final" / "config.json").exists()
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["reward"]["source"] == "python:brief" and saved["task"]["name"] == "math"
    assert saved["loss"]["kl_coef"] == 0.04 and saved["rollout"]["group_size"] == 4
    assert saved["policy"]["model"] == str(tiny) and saved["task"]["args"]["train_file"].endswith("data/train.jsonl")
    assert len((run / "data" / "train.jsonl").read_text().splitlines()) == 81


def test_trl_functions_get_whole_conversations_once_per_batch(tmp_path: Path) -> None:
    """A model object, prompt-only conversational rows with a system turn, two functions (one says
    None for some rows); the calls are TRL's: one per batch, conversations and messages, columns."""
    model, tok = build_tiny(0)
    calls: list[dict] = []

    def mentions(prompts, completions, topic, **kwargs):
        calls.append({"prompts": prompts, "completions": completions, "topic": topic})
        return [float(t in c[0]["content"]) for c, t in zip(completions, topic)]

    def only_odd(prompts, completions, n, **kwargs):
        return [None if k % 2 == 0 else -0.5 for k in n]

    rows = [
        {
            "prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": f"{k}+1="}],
            "topic": "1",
            "n": k,
        }
        for k in range(6)
    ]
    trainer = creditrl.Trainer(
        model=model,
        processing_class=tok,
        reward_funcs=[mentions, only_odd],
        train_dataset=Dataset.from_list(rows),
        eval_dataset=Dataset.from_list([{**r, "topic": "9"} for r in rows[:2]]),
        config={**SMALL, "reward.timeout_s": 0, "reward.weights": [1.0, 2.0]},  # in process: the calls are seen
        run_dir=tmp_path / "run",
    )
    assert trainer.reward_names == ["python:mentions", "python:only_odd"]
    run = trainer.train()
    assert run == tmp_path / "run" and trainer.config.task.name == PROMPT_TASK
    rows_out = metrics(run)[1:]
    train_calls = [c for c in calls if len(c["completions"]) == 8]  # 2 prompts x 4 samples; evaluations score 2
    assert len(train_calls) == 3 and len(calls) == 3 + 2  # one call per iteration, one per evaluation (0 and 3)
    assert [c["topic"] for c in calls if c not in train_calls] == [["9", "9"]] * 2  # evaluations read eval_dataset
    assert trainer.config.task.args["heldout_file"].endswith("data/eval.jsonl")
    for c in train_calls:
        assert all(p[0] == {"role": "system", "content": "Be brief."} and p[-1]["role"] == "user" for p in c["prompts"])
        assert all(len(m) == 1 and m[0]["role"] == "assistant" for m in c["completions"])
        assert c["topic"] == ["1"] * 8
    for r in rows_out:
        assert r["reward/none/python:mentions"] == 0
        assert r["reward/none/python:only_odd"] % 4 == 0  # a prompt's 4 samples share its n
    assert sum(r["reward/none/python:only_odd"] for r in rows_out) > 0
    assert (run / "start_policy" / "config.json").exists()
    assert metrics(run)[-1]["eval/accuracy"] == 0.0  # no answer column: nothing to check, the rewards judge


def test_none_is_left_out_of_the_weighted_sum(tmp_path: Path, tiny: Path) -> None:
    """One prompt whose second function always says None: the reward is the first function's alone."""

    def one(prompts, completions, **kwargs):
        return [1.0] * len(completions)

    def never(prompts, completions, **kwargs):
        return [None] * len(completions)

    trainer = creditrl.Trainer(
        model=str(tiny),
        reward_funcs=[one, never],
        train_dataset=[{"prompt": "1+1="}],
        config={**SMALL, "reward.weights": [0.5, 3.0], "train.iterations": 1},
        run_dir=tmp_path / "run",
    )
    (row,) = metrics(trainer.train())[1:]
    assert row["reward/mean"] == pytest.approx(0.5) and row["reward/none/python:never"] == 8
    with pytest.raises(ConfigError, match=r"already holds a run: continue it with trainer.train\(resume_from_che"):
        trainer.train()
    assert trainer.train(resume_from_checkpoint=True) == tmp_path / "run"  # python:one and :never found again
    assert [r["iteration"] for r in metrics(tmp_path / "run")] == [0, 1]


def test_config_forms_merge_and_a_bad_key_fails_before_any_work(tmp_path: Path) -> None:
    assert config_layer({"rollout.group_size": 8, "loss": {"kl_coef": 0.1}, "loss.clip_eps": 0.3}) == {
        "rollout": {"group_size": 8},
        "loss": {"kl_coef": 0.1, "clip_eps": 0.3},
    }
    base = Config().updated({"optim": {"lr": 1e-3}})
    trainer = creditrl.Trainer(model="tiny", config=base, run_dir=tmp_path / "a")
    assert trainer.config.optim.lr == 1e-3 and trainer.config.policy.model == "tiny"
    path = tmp_path / "c.yaml"
    path.write_text("rollout:\n  group_size: 3\n")
    assert creditrl.Trainer(config=path, run_dir=tmp_path / "b").config.rollout.group_size == 3
    with pytest.raises(ConfigError, match="group_sise.*did you mean 'group_size'"):
        creditrl.Trainer(model="tiny", config={"rollout.group_sise": 8}, run_dir=tmp_path / "c")
    assert not (tmp_path / "c").exists()


def importable_reward(prompts, completions, **kwargs):
    return [0.0] * len(completions)


def test_source_names_of_functions() -> None:
    assert source_name(importable_reward) == f"{__name__}:importable_reward"  # resumable from the command line
    assert source_name("rm:/some/model") == "rm:/some/model"

    def make(k):
        def score(prompts, completions, **kwargs):
            return [float(k)] * len(completions)

        return score

    first, second = make(1), make(2)
    assert source_name(first) == "python:score" and source_name(first) == "python:score"
    assert source_name(second) == "python:score_2" and FUNCTIONS["python:score_2"] is second
    assert source_name(lambda prompts, completions, **kw: []) == "python:lambda"
    with pytest.raises(TypeError, match="reward_funcs: expected callables"):
        source_name(3)


def test_inputs_that_cannot_be_used_are_one_line_errors(tmp_path: Path) -> None:
    model, _ = build_tiny(0)
    with pytest.raises(ConfigError, match="processing_class: goes with a model object"):
        creditrl.Trainer(model="tiny", processing_class=object())
    with pytest.raises(ConfigError, match="needs its tokenizer: pass processing_class="):
        creditrl.Trainer(model=model, train_dataset=[{"prompt": "1+1="}], run_dir=tmp_path / "a").train()
    data = Dataset.from_list([{"prompt": "1+1="}])
    with pytest.raises(ConfigError, match=r"pass one split, e.g. train_dataset\['train'\]"):
        creditrl.Trainer(model="tiny", train_dataset=DatasetDict({"train": data}), run_dir=tmp_path / "b").train()
    with pytest.raises(ConfigError, match="train_dataset, row 2, column 'prompt': a object is not JSON"):
        rows = [{"prompt": "1+1="}, {"prompt": object()}]
        creditrl.Trainer(model="tiny", train_dataset=rows, run_dir=tmp_path / "c").train()
    with pytest.raises(ConfigError, match="field 'prompt' is missing"):
        creditrl.Trainer(
            model="tiny", reward_funcs=[importable_reward], train_dataset=[{"text": "hi"}], run_dir=tmp_path / "d"
        ).train()


def test_trl_name_table_names_real_keys() -> None:
    """Every creditrl key of README's TRL table is in the schema, every TRL name in GRPOConfig."""

    section = re.search(r"\| TRL \(`GRPOConfig`\) \| creditrl \|\n\|---\|---\|\n(.*?)\n\n", README.read_text(), re.S)
    rows = [line.split(" | ") for line in section.group(1).splitlines()]
    try:
        from trl import GRPOConfig
    except ImportError:  # trl is the bench extra: the creditrl side is still checked
        GRPOConfig = None  # noqa: N806
    trl_fields = {f.name for f in dataclasses.fields(GRPOConfig)} | {"reward_funcs"} if GRPOConfig else None
    keys = []
    for trl_cell, ours in rows:
        for name in re.findall(r"`([a-z_]+)`", trl_cell.lstrip("| ")):
            if name not in ("grpo", "dapo", "dr_grpo", "group", "none", "batch"):  # loss_type / scale_rewards values
                assert trl_fields is None or name in trl_fields, name
        keys += [k.split("=")[0] for k in re.findall(r"`([a-z_]+\.[a-z_]+(?:=[^`]*)?)`", ours)]
    assert len(keys) >= 25
    for key in keys:
        sec, field = key.split(".")
        assert sec in SECTIONS and field in Config.model_fields[sec].annotation.model_fields, key
    for trl_name, key in [
        ("num_generations", "rollout.group_size"),
        ("beta", "loss.kl_coef"),
        ("learning_rate", "optim.lr"),
    ]:
        assert any(trl_name in t and key in o for t, o in rows), trl_name


def test_import_creditrl_stays_light() -> None:
    """``creditrl.Trainer`` is imported on first use: ``import creditrl`` alone loads no torch."""
    import subprocess
    import sys

    code = "import sys, creditrl; assert 'torch' not in sys.modules; creditrl.Trainer; assert 'torch' in sys.modules"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120).returncode == 0
    with pytest.raises(AttributeError, match="no attribute 'Trainr'"):
        creditrl.Trainr  # noqa: B018
