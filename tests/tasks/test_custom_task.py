"""Bring your own task: examples/custom_task.py by import path, make_task's errors, and two RL
iterations on it configured as on the command line."""

import importlib
import math
import shlex
from pathlib import Path

import pytest

from creditrl.cli import build_parser
from creditrl.config import ConfigError, load_config
from creditrl.tasks import Task, make_task
from creditrl.tasks.base import TaskNameError
from creditrl.train.resolve import checked
from creditrl.train.rl import RLTrainer

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
# The command line of the README's "Bring your own task" section, after PYTHONPATH=examples.
CLI = "creditrl train --set task.name=custom_task:CountTask --set reward.source=oracle_steps"


@pytest.fixture
def custom_task(monkeypatch: pytest.MonkeyPatch):
    """The example module, imported from examples/ (this runs the file's code)."""
    monkeypatch.syspath_prepend(str(EXAMPLES))
    return importlib.import_module("custom_task")


def test_the_example_is_a_task_built_by_import_path(custom_task):
    task = make_task("custom_task:CountTask", max_len=2)
    assert isinstance(task, custom_task.CountTask) and isinstance(task, Task) and task.max_len == 2
    train, heldout = task.sample(20, split="train", seed=0), task.sample(20, split="heldout", seed=0)
    assert train == task.sample(20, split="train", seed=0)
    assert {p.prompt for p in train}.isdisjoint(p.prompt for p in heldout)
    assert all(p.answer.split(",")[0] == p.prompt.split()[1].split("..")[0] for p in train + heldout)
    p = task.problem(4, 6)
    assert (p.prompt, p.answer) == ("count 4..6:", "4,5,6")
    assert task.check_outcome(p, " 4,5,6") and not task.check_outcome(p, "4,5")
    assert task.check_steps(p, ["4,", "5,", "6"]) == [True, True, True]  # score-stage spans keep the ","
    assert task.check_steps(p, "4,7,6,7".split(",")) == [True, False, True, False]


@pytest.fixture
def broken_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    name = "creditrl_test_broken_tasks"
    (tmp_path / f"{name}.py").write_text(
        "class NoSteps:\n"
        "    name = 'no_steps'\n"
        "    step_separator = None\n"
        "    def sample(self, n, *, split, seed):\n"
        "        return []\n"
        "    def check_outcome(self, problem, completion):\n"
        "        return False\n"
        "def bare():\n"
        "    return object()\n"
        "LIMIT = 3\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


@pytest.mark.parametrize(
    "path, message",
    [
        ("no_such_module_xyz:Task", "task 'no_such_module_xyz:Task': cannot import module 'no_such_module_xyz'"),
        (
            "{mod}:Nope",
            "task '{mod}:Nope': module '{mod}' has no attribute 'Nope'; expected a task class or a function",
        ),
        ("{mod}:LIMIT", r"task '{mod}:LIMIT': 'LIMIT' is not callable \(type int\)"),
        (
            "{mod}:NoSteps",
            "task '{mod}:NoSteps': the factory returned a NoSteps that does not implement the Task "
            "protocol: missing check_steps",
        ),
        ("{mod}:bare", "missing name, step_separator, sample, check_outcome, check_steps"),
        ("{mod}:", "task '{mod}:': an import path must read 'package.module:factory'"),
        ("nope", "unknown task 'nope'; valid tasks: .*math.*toy_summarise, toy_translate"),
    ],
)
def test_import_path_errors_say_what_is_wrong(broken_module, path, message):
    with pytest.raises(TaskNameError, match=message.format(mod=broken_module)):
        make_task(path.format(mod=broken_module))


def test_config_names_the_bad_task(broken_module):
    with pytest.raises(ConfigError, match=f"task.name: task '{broken_module}:NoSteps': .*missing check_steps"):
        checked(load_config(overrides=[f"task.name={broken_module}:NoSteps"]))


def test_two_rl_iterations_on_the_example_from_its_command_line(custom_task, tmp_path):
    args = build_parser().parse_args(shlex.split(CLI)[1:])
    small = [
        "train.init=policy",
        "rollout.prompts_per_iter=2",
        "rollout.group_size=2",
        "rollout.max_new_tokens=12",
        "train.iterations=2",
        "train.eval_every=2",
        "train.eval_size=4",
        "train.checkpoint_every=2",
        "train.progress=false",
    ]
    cfg = load_config(args.config, args.set + small)
    assert (cfg.task.name, cfg.task.args, cfg.reward.source) == ("custom_task:CountTask", {}, "oracle_steps")
    trainer = RLTrainer.from_config(cfg, tmp_path / "run")
    history = trainer.run().history
    assert [r["iteration"] for r in history] == [0, 1, 2]
    for row in history[1:]:
        assert row["reward/errors"] == 0 and row["reward/placed_per_response"] >= 1
        # first-error step labels in {0, 1}: a response earns at most one per step it writes
        assert 0.0 <= row["reward/mean"] <= 12 and finite(row)
    for row in (history[0], history[2]):
        assert 0.0 <= row["eval/accuracy"] <= 1.0 and 0.0 <= row["eval/step_accuracy"] <= 1.0
    assert all(int(p.prompt.split()[1].split("..")[0]) % 3 == 0 for p in trainer.parts.heldout)


def finite(row: dict) -> bool:
    """Every number of a metrics row is finite (eval/correct is the packed per-problem outcomes)."""
    return all(math.isfinite(v) for k, v in row.items() if k != "eval/correct")
