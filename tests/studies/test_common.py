"""The PRM, search and value studies take a config; they refuse a task without reasoning steps
with one line, before anything is trained or loaded; their default task settings; the shared
report arguments."""

from __future__ import annotations

import importlib

import pytest
from studies.common import base_config, default_task_sets, parser, step_task
from studies.search import DEFAULT_TASK, report_configs

from creditrl.config import load_config
from creditrl.experiments.report import task_phrase


@pytest.mark.parametrize(
    "study, argv, name",
    [
        ("prm", ["--quick"], "the PRM study"),
        ("search", ["--quick"], "the search study"),
        ("values", ["--quick", "--out", "unused"], "the value study"),
        ("scheduled_sampling", ["--quick", "--out", "unused"], "the scheduled-sampling study"),
    ],
)
@pytest.mark.parametrize(
    "sets, missing",
    [
        (["task.name=code"], "task 'code' has no step separator"),
        (["task.name=math"], "task 'math' has no step separator"),
    ],
)
def test_studies_refuse_a_task_without_steps_before_loading_anything(
    study, argv, name, sets, missing, capsys, monkeypatch, tmp_path
) -> None:
    module = importlib.import_module(f"studies.{study}")
    monkeypatch.chdir(tmp_path)
    if hasattr(module, "start_policy"):
        monkeypatch.setattr(module, "start_policy", lambda *a, **k: pytest.fail("the start policy was looked for"))
    assert module.cli([*argv, *[x for kv in sets for x in ("--set", kv)]]) == 2
    assert capsys.readouterr().err == (
        f"python -m studies.{study}: error: task.name: {name} needs a task with reasoning steps (a step separator "
        f"and a step checker); {missing}\n"
    )
    assert not list(tmp_path.iterdir())  # nothing was written either


def test_a_study_names_a_bad_config_key_in_one_line(capsys) -> None:
    from studies import prm

    assert prm.cli(["--quick", "--set", "prm.stepz=3"]) == 2
    assert capsys.readouterr().err.startswith("python -m studies.prm: error: unknown key 'stepz' in section 'prm'")


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


def test_the_shared_report_arguments() -> None:
    full = parser("x", None, out="o", seeds="s", results="r").parse_args(["--quick", "--seeds", "3", "--out", "d"])
    assert (full.quick, full.seeds, full.out, full.results, full.config, full.set) == (True, 3, "d", None, None, [])
    bare = parser("x", None, out=None).parse_args([])
    assert not bare.quick and not hasattr(bare, "out") and not hasattr(bare, "seeds") and not hasattr(bare, "results")
    with pytest.raises(SystemExit):
        parser("x", None, out=None).parse_args(["--seeds", "2"])


def test_a_page_names_a_study_by_the_module_it_ran(monkeypatch) -> None:
    import sys
    from types import SimpleNamespace

    from creditrl.experiments.report import command_line

    monkeypatch.setattr(sys, "argv", ["/repo/studies/prm.py", "--quick", "--set", "a=b c"])
    monkeypatch.setitem(sys.modules, "__main__", SimpleNamespace(__spec__=SimpleNamespace(name="studies.prm")))
    assert command_line() == "python -m studies.prm --quick --set 'a=b c'"
    monkeypatch.setitem(sys.modules, "__main__", SimpleNamespace(__spec__=None))  # run as a file
    assert command_line(["benchmarks/credit_speed.py", "--quick"]) == "python benchmarks/credit_speed.py --quick"
    assert command_line(["/venv/bin/creditrl", "findings"]) == "creditrl findings"
