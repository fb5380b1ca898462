"""The code task, the unit_tests reward source, and `creditrl train` on them end to end."""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

import pytest
import torch

import creditrl.tasks.code as code_module
from creditrl.config import TaskConfig, load_config
from creditrl.policy.tokenizer import CHARACTERS
from creditrl.rewards import make_source, score_batch
from creditrl.sandbox import Limits
from creditrl.tasks import make_task
from creditrl.tasks.code import DEFAULT_PROBLEMS, CodeTask, load_problems
from creditrl.train.rl import RLTrainer

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def task() -> CodeTask:
    return CodeTask(timeout_s=1.0)


def by_name(task: CodeTask, name: str):
    return next(p for p in task.problems if p.meta["name"] == name)


def test_problem_file_is_well_formed() -> None:
    problems = load_problems(DEFAULT_PROBLEMS)
    assert len(problems) >= 30
    for p in problems:
        text = p.prompt + p.solution
        assert set(text) <= set(CHARACTERS), p.meta["name"]  # the tiny tokenizer: printable ASCII, one line
        assert p.prompt.startswith(f"def {p.meta['entry']}(") and p.prompt.endswith("return ")
        assert len(p.prompt) < 80 and 3 <= len(p.meta["inputs"]) == len(p.meta["expected"]) <= 5
        expected = p.meta["expected"]
        # no constant answer and no "return the first argument" passes every test
        assert len({json.dumps(e) for e in expected}) > 1, p.meta["name"]
        assert any(args[0] != e for args, e in zip(p.meta["inputs"], expected)), p.meta["name"]


def test_pyproject_ships_the_problem_file() -> None:
    """The problems must be package data, or a wheel install has no code task."""
    text = (ROOT / "pyproject.toml").read_text()
    line = next(x for x in text.splitlines() if x.startswith("creditrl = ["))  # [tool.setuptools.package-data]
    assert '"tasks/data/*.jsonl"' in line


def test_splits_are_disjoint_and_sampling_is_deterministic(task: CodeTask) -> None:
    train = {p.meta["name"] for p in task.sample(200, split="train", seed=1)}
    held = {p.meta["name"] for p in task.sample(100, split="heldout", seed=1)}
    assert train == {p.meta["name"] for p in task.pools["train"]} and held == {
        p.meta["name"] for p in task.pools["heldout"]
    }
    assert not train & held and len(held) >= 5
    assert task.sample(5, split="train", seed=3) == task.sample(5, split="train", seed=3)
    assert task.sample(20, split="train", seed=3) != task.sample(20, split="train", seed=4)
    assert task.sample(0, split="heldout", seed=0) == []
    with pytest.raises(ValueError, match="unknown split"):
        task.sample(1, split="test", seed=0)
    with pytest.raises(ValueError, match="n must be"):
        task.sample(-1, split="train", seed=0)


def test_every_reference_solution_passes(task: CodeTask) -> None:
    results = task.test_results_batch(task.problems, [p.solution for p in task.problems])
    failing = [p.meta["name"] for p, r in zip(task.problems, results) if not all(r)]
    assert failing == []


def test_outcome_is_all_tests_and_verdicts_are_cached(task: CodeTask, monkeypatch: pytest.MonkeyPatch) -> None:
    add = by_name(task, "add")
    assert task.check_outcome(add, "a + b")
    assert not task.check_outcome(add, "a + b if a < 5 else 0")  # 3 of 4 tests
    assert task.test_results(add, "a + b if a < 5 else 0") == (True, True, True, False)
    calls = []
    monkeypatch.setattr(code_module, "run_tests", lambda *a, **k: calls.append(a) or pytest.fail("not cached"))
    assert task.check_outcome(add, "a + b") and calls == []
    with pytest.raises(ValueError, match="no steps"):
        task.check_steps(add, ["a + b"])


def test_weaker_isolation_is_reported_once(monkeypatch: pytest.MonkeyPatch) -> None:
    from creditrl.sandbox import SandboxResult, TestReport

    weak = SandboxResult(ok=True, returncode=0, stdout="", stderr="", timed_out=False, reason="", isolation=("net",))
    monkeypatch.setattr(code_module, "run_tests", lambda *a, **k: TestReport((True,) * 4, "", weak))
    fresh = CodeTask()
    add = by_name(fresh, "add")
    with pytest.warns(RuntimeWarning, match=r"isolation \['net'\] only"):
        assert fresh.check_outcome(add, "a + b")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert fresh.check_outcome(add, "b + a")  # a second program: no second warning


def test_make_task_and_argument_checks() -> None:
    built = make_task("code", timeout_s=0.5)
    assert (
        built.name == "code" and built.step_separator is None and built.limits == Limits(timeout_s=0.5, memory_mb=256)
    )
    with pytest.raises(TypeError):
        make_task("code", min_ops=1)
    with pytest.raises(ValueError, match="workers"):
        CodeTask(workers=0)


def test_unit_tests_source_scores_the_share_of_tests(task: CodeTask) -> None:
    source = make_source("unit_tests")
    assert source.granularities == {"sequence"} and source.batch_fn is not None
    add = by_name(task, "add")
    completions = ["a + b", "a + b if a < 5 else 0", "a - b", "a +* b"]
    result = score_batch(source, task, [add] * 4, completions, [[c] for c in completions], on_error="raise")
    assert result.scores == [[1.0], [0.75], [0.25], [0.0]] and result.errors == 0
    arithmetic = make_task("arithmetic")
    problem = arithmetic.sample(1, split="train", seed=0)[0]
    wrong = score_batch(source, arithmetic, [problem], ["#1"], [["#1"]], on_error="zero")
    assert wrong.errors == 1 and "needs a task with unit tests" in wrong.first_error


def test_hostile_completions_score_zero_and_scoring_goes_on(task: CodeTask) -> None:
    add = by_name(task, "add")
    completions = [
        "__import__('os').kill(__import__('os').getppid(), 9)",
        "[0 for _ in iter(int, 1)]",  # never ends
        "__import__('os')._exit(0)",
        "print('PASS') or __import__('sys').exit(0)",
        "a + b",
    ]
    result = score_batch(make_source("unit_tests"), task, [add] * 5, completions, [[c] for c in completions])
    assert result.scores == [[0.0], [0.0], [0.0], [0.0], [1.0]] and result.errors == 0


def code_config(tmp_overrides: list[str]):
    """`creditrl train` settings for the code task: naming another task drops the arithmetic
    defaults of task.args and sft.task_args (config.loader.merge_layer)."""
    cfg = load_config(overrides=["task.name=code", "task.args={timeout_s: 1.0}"] + tmp_overrides)
    assert cfg.task == TaskConfig(name="code", args={"timeout_s": 1.0}) and cfg.sft.task_args == {}
    return cfg


def test_rl_trainer_runs_on_the_code_task(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    judged: list[float] = []
    original = CodeTask.test_results_batch

    def spy(self, problems, completions):
        out = original(self, problems, completions)
        judged.extend(sum(r) / len(r) for r in out)
        return out

    monkeypatch.setattr(CodeTask, "test_results_batch", spy)
    torch.manual_seed(0)
    cfg = code_config(
        [
            "reward.source=unit_tests",
            "train.init=policy",
            "train.iterations=2",
            "train.eval_every=2",
            "train.eval_size=4",
            "train.checkpoint_every=2",
            "train.progress=false",
            "rollout.prompts_per_iter=2",
            "rollout.group_size=3",
            "rollout.max_new_tokens=12",
            "train.threads=1",
        ]
    )
    history = RLTrainer.from_config(cfg, tmp_path / "run").run().history
    rows = [r for r in history if "reward/mean" in r]
    assert [r["iteration"] for r in rows] == [1, 2]
    for r in rows:
        assert math.isfinite(r["reward/mean"]) and 0.0 <= r["reward/mean"] <= 1.0
        assert r["reward/errors"] == 0 and 0.0 <= r["train/accuracy"] <= 1.0
    assert 0.0 <= history[-1]["eval/accuracy"] <= 1.0
    assert len(judged) >= 2 * 2 * 3 and all(0.0 <= f <= 1.0 for f in judged)  # every sample went through the harness


def test_the_answer_is_the_program_up_to_formatting(task: CodeTask) -> None:
    """Completions with the same answer pass the same tests; a body that does not parse has none."""
    add = by_name(task, "add")
    spellings = ["a + b", "a+b", " (a + b)  # the sum", "((a)+(b))"]
    answers = {task.extract_answer(c) for c in spellings}
    assert answers == {"def f():\n    return a + b"} and all(task.check_outcome(add, c) for c in spellings)
    assert task.extract_answer("b + a") != task.extract_answer("a + b")  # equal values, different programs
    assert task.extract_answer("a - b") != task.extract_answer("a + b") and not task.check_outcome(add, "a - b")
    assert task.extract_answer("a; x = 1") != task.extract_answer("a\nx = 1")  # function body vs module level
    for broken in ("a +", "(" * 300 + "a" + ")" * 300, "a\x00"):
        assert task.extract_answer(broken) is None and not task.check_outcome(add, broken)
    assert task.same_answer("def f():\n    return a", "def f():\n    return a")
    assert not task.same_answer("def f():\n    return a", "def f():\n    return b")
