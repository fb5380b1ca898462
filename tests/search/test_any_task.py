"""Search and the studies (studies/) on a task that is not arithmetic: running sums answered with ``A=``
(tests/search/conftest.py), with a PRM written by ``creditrl prm label`` + ``creditrl prm train``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from creditrl.cli import main
from creditrl.prm.data import load_stepwise


@pytest.fixture(scope="module")
def sum_prm(sum_config: Path) -> Path:
    """A PRM for the running-sum task: the SFT policy's samples labelled by the oracle (the task's
    step checker), then 4 training steps."""
    root = sum_config.parent
    assert main(["prm", "label", str(sum_config), "--out", str(root / "steps.jsonl")]) == 0
    assert main(["prm", "train", str(root / "steps.jsonl"), str(sum_config), "--out", str(root / "prm")]) == 0
    return root / "prm"


def test_prm_label_and_train_on_the_task(sum_prm: Path, sum_tasks) -> None:
    task, _ = sum_tasks
    examples = load_stepwise(sum_prm.with_name("steps.jsonl"))
    assert 0 < len(examples) <= 12  # 6 problems x 2 samples, those with steps
    for ex in examples:
        problem = task.problem_of(ex.prompt)
        assert "".join(ex.completions) == ex.meta["completion"]
        truth = [float(x) for x in task.check_steps(problem, ex.completions)]
        first_error = truth.index(0.0) + 1 if 0.0 in truth else len(truth)  # the oracle stops at the first error
        assert ex.labels == ex.meta["oracle"] == truth[:first_error] + [None] * (len(truth) - first_error)
        assert ex.meta["outcome"] == float(task.check_outcome(problem, ex.meta["completion"]))
    assert sum(len(ex.completions) for ex in examples) > len(examples)  # the policy writes several steps
    assert json.loads((sum_prm / "train_metrics.json").read_text())["prm/steps"] == 4


@pytest.mark.parametrize(
    "method, sets",
    [
        ("beam", []),
        ("mcts", []),
        ("mcts", ["search.leaf_value=rollout_oracle", "search.rollouts=2"]),
    ],
)
def test_beam_and_mcts_run_on_the_task_with_its_prm(
    method, sets, sum_config, sum_prm, sum_tasks, run_cli_search, check_search_result
) -> None:
    task, _ = sum_tasks
    argv = [
        str(sum_config),
        "--method",
        method,
        "--set",
        f"search.prm={sum_prm}",
        *[x for kv in sets for x in ("--set", kv)],
    ]
    text, saved = run_cli_search(argv, sum_config.with_name(f"{method}-{len(sets)}.json"))
    assert f"search {method} " in text and "on 4 heldout problems of task 'running_sum'" in text
    check_search_result(task, saved, 4, 160)
    assert saved["summary"]["engine_calls"] >= 3  # step by step: one call per round (and rollouts)
    assert max(r["tokens"] for r in saved["problems"]) > 24  # more than one response's worth was generated
    assert any(";" in r["completion"] and "A=" in r["completion"] for r in saved["problems"])


def test_one_beam_one_expansion_at_temperature_zero_is_greedy_on_the_task(sum_config, sum_prm, run_cli_search) -> None:
    _, greedy = run_cli_search([str(sum_config), "--method", "greedy"], sum_config.with_name("greedy.json"))
    sets = [f"search.prm={sum_prm}", "search.width=1", "search.expansions=1", "search.temperature=0"]
    _, beam = run_cli_search(
        [str(sum_config), "--method", "beam", *[x for kv in sets for x in ("--set", kv)]],
        sum_config.with_name("beam-greedy.json"),
    )
    assert [r["completion"] for r in beam["problems"]] == [r["completion"] for r in greedy["problems"]]
    assert [r["tokens"] for r in beam["problems"]] == [r["tokens"] for r in greedy["problems"]]
    assert beam["summary"]["engine_calls"] > greedy["summary"]["engine_calls"] == 1


def test_search_study_on_the_task_without_answer_hooks(sum_config: Path, sum_tasks, capsys) -> None:
    """The quick search study on the plain running-sum task: every method runs on it, and the
    summary notes that majority voted on whole completions."""
    from studies import search

    out = sum_config.with_name("search-study")
    assert search.cli([str(sum_config), "--quick", "--out", str(out), "--set", "task.name=running_sum_plain"]) == 0
    capsys.readouterr()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["task"] == {"name": "running_sum_plain", "args": {}}
    assert "task 'running_sum_plain' has no extract_answer" in summary["majority_note"]
    assert len(summary["rows"]) == 1 + 3 * 3 + 2 + 2 + 1 + 1
    for r in summary["rows"]:
        assert 0.0 <= r["accuracy"] <= 1.0 and r["tokens_per_problem"] > 0
        if r["method"] == "mcts":
            assert r["tokens_max"] <= r["budget"]


def test_prm_study_on_the_task_without_answer_hooks(sum_config: Path, sum_tasks, capsys) -> None:
    from studies import prm

    run = sum_config.with_name("prm-study")
    assert prm.cli([str(sum_config), "--quick", "--out", str(run), "--set", "task.name=running_sum_plain"]) == 0
    capsys.readouterr()
    summary = json.loads((run / "summary.json").read_text())
    assert summary["task"] == {"name": "running_sum_plain", "args": {}}
    assert "task 'running_sum_plain' has no extract_answer" in summary["majority_note"]
    assert set(summary["best_of_n"]) == {"prm_min", "prm_product", "prm_last", "prm_mean", "orm", "majority"}
    for acc in summary["best_of_n"].values():
        assert list(acc) == ["1", "2"] and all(0.0 <= a <= 1.0 for a in acc.values())
    assert summary["label_quality"]["oracle"]["agreement"] == 1.0  # the oracle against itself


def test_value_study_on_the_task(sum_config: Path, sum_tasks, capsys) -> None:
    from studies import values

    out = sum_config.with_name("value-study")
    assert values.cli([str(sum_config), "--quick", "--out", str(out)]) == 0
    capsys.readouterr()
    rows = json.loads((out / "summary.json").read_text())["rows"]
    assert rows[0]["arm"] == "tree (b=2, D=2)" and all(0.0 <= r["mae"][0] <= 1.0 for r in rows)
