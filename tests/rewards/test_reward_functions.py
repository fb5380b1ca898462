"""Reward functions with TRL's contract (creditrl.rewards.functions): strict scores, one call per
batch, the conversational format, every data column, ``None``, ``async def``, and names by file."""

from __future__ import annotations

import importlib
import json
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from creditrl.rewards import function_source, reward_function, score_batch, score_value
from creditrl.tasks import make_task
from creditrl.tasks.base import Problem
from creditrl.tasks.bounded import BoundedCalls, UserFunctionError

segment_module = importlib.import_module("creditrl.rollout.segment")  # the package re-exports a function of that name

# A module of reward functions written for TRL, imported by file path; CALLS records each call's
# size in a file (the bounded worker is another process).
MODULE = textwrap.dedent(
    """
    import asyncio, json, os

    def _log(completions, completion_ids):
        with open(os.environ["REWARD_CALLS"], "a") as f:
            f.write(json.dumps([len(completions), completion_ids[0] is not None]) + "\\n")

    def system_length(prompts, completions, completion_ids, **kwargs):
        # TRL's conversational format: prompts are conversations, completions assistant messages
        _log(completions, completion_ids)
        out = []
        for prompt, completion in zip(prompts, completions):
            system = prompt[0]["content"] if prompt[0]["role"] == "system" else ""
            text = completion[0]["content"]
            out.append(None if "skip" in system else float(len(text)))
        return out

    def plain(prompts, completions, completion_ids, answer, **kwargs):
        _log(completions, completion_ids)
        return [float(c.strip() == a) for c, a in zip(completions, answer)]

    def returns(prompts, completions, **kwargs):
        return eval(os.environ["REWARD_RETURNS"])

    async def slow_but_async(prompts, completions, **kwargs):
        await asyncio.sleep(0)
        return [0.25 for _ in completions]
    """
)


@pytest.fixture
def rewards_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "my_trl_rewards.py"
    path.write_text(MODULE)
    monkeypatch.setenv("REWARD_CALLS", str(tmp_path / "calls.jsonl"))
    yield path
    sys.modules.pop("my_trl_rewards", None)


def calls_of(path: Path) -> list[list]:
    log = path.parent / "calls.jsonl"
    return [json.loads(line) for line in log.read_text().splitlines()]


def chat(prompt: str, system: str) -> Problem:
    return Problem(prompt, "3", " 3", meta={"level": 1}, messages=(("system", system), ("user", prompt)))


@pytest.fixture
def task():
    return make_task("arithmetic", min_ops=1, max_ops=1)


# ----------------------------------------------------------------------------- strict scores


def test_a_score_is_a_real_number_a_bool_or_none() -> None:
    accepted = [0.5, 2, True, None, np.float32(0.5), np.int64(3), np.bool_(False)]
    assert [score_value(x) for x in accepted] == [0.5, 2.0, 1.0, None, 0.5, 3.0, 0.0]
    assert all(isinstance(score_value(x), float) for x in accepted if x is not None)
    for bad, kind in [("1", "str"), (["0.75"], "list"), ({0: 1.0}, "dict"), (b"1", "bytes"), (np.zeros(2), "ndarray")]:
        with pytest.raises(ValueError, match=rf"^returned a score of type {kind} "):
            score_value(bad)
    with pytest.raises(ValueError, match="non-finite"):
        score_value(np.float64("nan"))


BAD_RETURNS = {
    '"1"': "returned a str ('1'), expected a list of 1 score",
    '["0.75"]': "returned a score of type str ('0.75'); a score is a real number, a bool or None",
    "{0: 1.0}": "returned a dict ({0: 1.0}), expected a list of 1 score",
    '"1.0"': "returned a str ('1.0'), expected a list of 1 score",
    "[[1.0]]": "returned a score of type list ([1.0]); a score is a real number, a bool or None",
}


@pytest.mark.parametrize("returned", list(BAD_RETURNS))
def test_a_score_of_another_type_is_an_error_of_its_call(task, rewards_file, monkeypatch, returned: str) -> None:
    monkeypatch.setenv("REWARD_RETURNS", returned)
    source = function_source(f"{rewards_file}:returns")
    (p,) = task.sample(1, split="train", seed=0)
    with pytest.raises(UserFunctionError) as err:
        score_batch(source, task, [p], ["1+1=2;#2"], [["1+1=2;#2"]], on_error="raise")
    assert "\n" not in str(err.value) and str(err.value).endswith(BAD_RETURNS[returned])
    assert str(err.value).startswith(f"reward source '{rewards_file}:returns' failed on response 0")
    for policy, keep in (("zero", [True]), ("skip", [False])):
        res = score_batch(source, task, [p], ["x"], [["x"]], on_error=policy)
        assert res.scores == [[0.0]] and res.errors == 1 and res.keep == keep
        assert res.first_error.endswith(BAD_RETURNS[returned])


def test_a_1d_array_or_tensor_of_scores_is_a_list_of_scores() -> None:
    import torch

    from creditrl.rewards.sources import score_list

    assert score_list(np.array([0.5, 1.0]), 2, "score") == [0.5, 1.0]
    assert score_list(torch.tensor([0.5, 1.0]), 2, "score") == [0.5, 1.0]
    with pytest.raises(ValueError, match=r"^returned a Tensor \(tensor\(0\.5000\)\), expected a list of 1 score$"):
        score_list(torch.tensor(0.5), 1, "score")


def test_a_bad_score_fails_only_its_completion_a_bad_call_every_one(task, rewards_file, monkeypatch) -> None:
    problems = task.sample(3, split="train", seed=0)
    source = function_source(f"{rewards_file}:returns")
    monkeypatch.setenv("REWARD_RETURNS", '[1.0, "2", None]')
    res = score_batch(source, task, problems, ["a", "b", "c"], [["a"], ["b"], ["c"]], on_error="zero")
    assert res.scores == [[1.0], [0.0], [None]] and res.errors == 1 and res.nones == 1
    monkeypatch.setenv("REWARD_RETURNS", "[1.0, 2.0]")  # 2 scores for 3 completions: the whole call failed
    res = score_batch(source, task, problems, ["a", "b", "c"], [["a"], ["b"], ["c"]], on_error="skip")
    assert res.errors == 3 and res.keep == [False] * 3
    assert res.first_error.endswith("returned 2 scores, expected 3")


# ----------------------------------------------------------------------------- TRL's contract


@pytest.mark.parametrize("timeout_s", [0, 10], ids=["in-process", "bounded-worker"])
def test_one_call_per_batch_in_trl_conversational_format(task, rewards_file, timeout_s: float) -> None:
    spec = f"{rewards_file}:system_length"
    source = function_source(spec)
    problems = [chat("1+2=", "Be brief."), chat("2+2=", "skip me"), chat("3+1=", "Be brief."), chat("1+1=", "x")]
    completions = ["3", "4", "", "22"]
    spans = [["3"], ["4"], [], ["22"]]  # the empty response has no span: it is not passed
    calls = BoundedCalls(timeout_s)
    calls.register(spec, lambda *args: source.user_fn(task, *args))
    ids = [[5], [6], [], [7, 7]]
    res = score_batch(
        source, task, problems, completions, spans, run=lambda items: calls.map(spec, items), completion_ids=ids
    )
    calls.close()
    assert res.scores == [[1.0], [None], [], [2.0]] and res.nones == 1 and res.errors == 0
    assert calls_of(rewards_file) == [[3, True]]  # one call, the three responses with tokens


def test_standard_data_gets_strings_and_every_column(task, rewards_file) -> None:
    seen = {}

    @reward_function()
    def spy(prompts, completions, **kwargs):
        seen.update(prompts=prompts, completions=completions, **kwargs)
        return [None] * len(completions)

    sys.modules["spy_module_for_test"] = type(sys)("spy_module_for_test")
    sys.modules["spy_module_for_test"].spy = spy
    try:
        source = function_source("spy_module_for_test:spy")
        rows = [
            Problem("1+2=", "3", " built", meta={"solution": "user's own", "difficulty": 2}),
            Problem("2+2=", "4", " built too", meta={}),
        ]
        score_batch(source, task, rows, ["3", "5"], [["3"], ["5"]], on_error="raise")
    finally:
        del sys.modules["spy_module_for_test"]
    assert seen["prompts"] == ["1+2=", "2+2="] and seen["completions"] == ["3", "5"]
    assert seen["solution"] == ["user's own", None]  # the user's column as it is, not the built text
    assert seen["difficulty"] == [2, None] and seen["answer"] == ["3", "4"]
    assert seen["problem"] == rows and seen["completion_ids"] == [None, None]


def test_async_functions_are_awaited(task, rewards_file) -> None:
    source = function_source(f"{rewards_file}:slow_but_async")
    problems = task.sample(2, split="train", seed=0)
    res = score_batch(source, task, problems, ["a", "b"], [["a"], ["b"]])
    assert res.scores == [[0.25], [0.25]]


def test_a_dense_function_is_called_once_with_every_completions_spans(task) -> None:
    seen = []

    @reward_function(granularity="step")
    def per_step(prompts, completions, spans, **kwargs):
        seen.append(spans)
        return [[float(len(s)) for s in row] for row in spans]

    sys.modules["dense_module_for_test"] = type(sys)("dense_module_for_test")
    sys.modules["dense_module_for_test"].per_step = per_step
    try:
        source = function_source("dense_module_for_test:per_step")
        problems = task.sample(2, split="train", seed=0)
        spans = [["1+1=2;", "#2"], ["#3"]]
        res = score_batch(source, task, problems, ["1+1=2;#2", "#3"], spans, granularity="step")
    finally:
        del sys.modules["dense_module_for_test"]
    assert seen == [spans] and res.scores == [[6.0, 2.0], [2.0]]


# ----------------------------------------------------------------------------- naming a function


def test_a_function_is_found_by_file_in_a_folder_or_in_the_working_directory(
    rewards_file, tmp_path, monkeypatch
) -> None:
    assert function_source(f"{rewards_file}:plain").user_fn is not None  # path/to/file.py:name
    sys.modules.pop("my_trl_rewards", None)
    monkeypatch.chdir(tmp_path)
    assert function_source("my_trl_rewards:plain").name == "my_trl_rewards:plain"  # the working directory
    sys.modules.pop("my_trl_rewards", None)
    elsewhere = tmp_path / "configs"
    elsewhere.mkdir()
    (elsewhere / "beside_config.py").write_text("def f(prompts, completions, **kw):\n    return [1.0] * len(prompts)\n")
    monkeypatch.setattr(segment_module, "CALLABLE_FOLDERS", [])
    segment_module.add_callable_folder(elsewhere)  # what `creditrl train CONFIG` does with the config's folder
    try:
        assert function_source("beside_config:f").user_fn is not None
    finally:
        sys.modules.pop("beside_config", None)


def test_a_function_not_found_is_one_line_with_a_hint(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError) as err:
        function_source("myrewards_nowhere:score")
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(
        "cannot import module 'myrewards_nowhere' named in 'myrewards_nowhere:score'"
    )
    assert str(tmp_path) in msg and msg.endswith("name a file as path/to/myrewards_nowhere.py:score")
    with pytest.raises(
        ValueError, match=r"^cannot import 'missing/rewards.py:f': file 'missing/rewards.py' does not exist$"
    ):
        function_source("missing/rewards.py:f")
