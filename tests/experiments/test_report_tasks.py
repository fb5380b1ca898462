"""The PRM, search, value and tree reports take a config; they refuse a task without reasoning steps
with one line, before anything is trained or loaded; their default task settings."""

from __future__ import annotations

import pytest

from creditrl.cli import main
from creditrl.config import load_config
from creditrl.experiments.report_setup import base_config, default_task_sets, step_task, task_phrase
from creditrl.experiments.search_report import DEFAULT_TASK, report_configs


@pytest.mark.parametrize(
    "argv, report, module",
    [
        (["prm", "report", "--quick"], "creditrl prm report", "prm_report"),
        (["search", "report", "--quick"], "creditrl search report", "search_report"),
        (["value-report", "--quick", "--out", "unused"], "creditrl value-report", "value_report"),
        (["tree-report", "--quick", "--out", "unused"], "creditrl tree-report", "tree_report"),
    ],
)
@pytest.mark.parametrize(
    "sets, missing",
    [
        (["task.name=code"], "task 'code' has no step separator"),
        (["task.name=math"], "task 'math' has no step separator"),
    ],
)
def test_reports_refuse_a_task_without_steps_before_loading_anything(
    argv, report, module, sets, missing, capsys, monkeypatch, tmp_path
) -> None:
    import importlib

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(
        importlib.import_module(f"creditrl.experiments.{module}"),
        "start_policy",
        lambda *a, **k: pytest.fail("the start policy was looked for"),
    )
    assert main([*argv, *[x for kv in sets for x in ("--set", kv)]]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"creditrl: error: task.name: {report} needs a task with reasoning steps (a step separator and a "
        f"step checker); {missing}\n"
    )
    assert not list(tmp_path.iterdir())  # nothing was written either


def test_a_report_names_a_bad_config_key_in_one_line(capsys) -> None:
    assert main(["prm", "report", "--quick", "--set", "prm.stepz=3"]) == 2
    assert capsys.readouterr().err.startswith("creditrl: error: unknown key 'stepz' in section 'prm'")


def test_step_task_builds_the_task_and_names_what_is_missing() -> None:
    task = step_task(load_config(overrides=["task.name=toy_translate"]), "r")
    assert task.name == "toy_translate" and task.step_separator == "."
    assert step_task(load_config(overrides=["task.name=math", "task.args={step_separator: '. '}"]), "r").name == "math"


def test_default_task_settings_apply_to_the_default_config_only() -> None:
    assert default_task_sets(None, [], DEFAULT_TASK) == DEFAULT_TASK
    assert default_task_sets(None, ["search.n=4"], DEFAULT_TASK) == DEFAULT_TASK
    assert default_task_sets("my.yaml", [], DEFAULT_TASK) == []
    assert default_task_sets(None, ["task.args={min_ops: 2}"], DEFAULT_TASK) == []
    assert default_task_sets(None, [" task.name=toy_translate"], DEFAULT_TASK) == []
    policy, searched = report_configs(None, [], quick=False)
    assert policy == load_config(base_config(None, False))  # the start policy: the arith config as it is
    assert dict(searched.task.args) == {"min_ops": 5, "max_ops": 7} and task_phrase(searched) == (
        "arithmetic (min_ops=5, max_ops=7)"
    )
    policy, searched = report_configs(None, ["task.name=toy_translate"], quick=False)
    assert policy == searched and searched.task.name == "toy_translate" and task_phrase(searched) == "toy_translate"
