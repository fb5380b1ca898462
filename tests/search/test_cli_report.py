"""``creditrl search`` on the command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from creditrl.cli import main


@pytest.fixture(scope="module")
def saved_models(tmp_path_factory, peaked_tiny, tiny_prm):
    """A tiny policy and an untrained PRM written to disk, as the CLI reads them."""
    root = tmp_path_factory.mktemp("search_cli")
    model, tok = peaked_tiny(0, 1)
    model.save_pretrained(root / "policy")
    tok.save_pretrained(root / "policy")
    prm, ptok = tiny_prm
    prm.save(root / "prm")
    ptok.save_pretrained(root / "prm")
    return root


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--method", "sampling"], "search.method: unknown value 'sampling'; valid: beam, best_of_n, greedy, mcts"),
        (["--method", "beam"], "method 'beam' (width=4 expansions=4 aggregation=min temperature=1.0) needs a PRM"),
        (
            ["--method", "mcts", "--set", "search.leaf_value=rollout_orm", "--set", "search.prm=/p"],
            "needs an ORM to judge solutions",
        ),
        (["--set", "search.budget=0"], "search.budget: must be >= 1, got 0"),
        (["--set", "search.width=wide"], "search.width: expected an integer, got 'wide'"),
        (["--set", "search.widht=2"], "unknown key 'widht' in section 'search'; valid keys: method, budget, "),
        (
            ["--method", "best_of_n", "--set", "search.selector=prm_max"],
            "search.selector: unknown value 'prm_max'; valid: majority, orm, prm_last, prm_mean, prm_min, prm_product",
        ),
        (
            ["--method", "beam", "--set", "task.name=code", "--set", "search.prm=/p"],
            "search.method: 'beam' expands reasoning steps, but task 'code' has no step separator",
        ),
        (
            ["--method", "best_of_n", "--set", "task.name=code"],
            "search.selector: 'prm_min' scores steps with a model, but task 'code' has no step separator; use majority",
        ),
        (["--set", "task.name=nope"], "task.name: unknown task 'nope'; valid tasks: "),
    ],
)
def test_cli_rejects_bad_input_before_loading_anything(argv, message, capsys, monkeypatch) -> None:
    """Exit status 2 and one line on stderr, before a policy is looked for (the start policy does
    not exist, and finding it would fail the test)."""
    import creditrl.search.runner as runner

    monkeypatch.setattr(runner, "start_policy", lambda *a, **k: pytest.fail("the start policy was looked for"))
    assert main(["search", "--set", "train.init=/nonexistent", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and err.startswith("creditrl: error: ")


def test_cli_runs_a_method_and_reports_accuracy_and_tokens(saved_models: Path, capsys) -> None:
    out = saved_models / "beam.json"
    sets = [
        f"train.init={saved_models / 'policy'}",
        f"search.prm={saved_models / 'prm'}",
        "search.budget=90",
        "search.problems=2",
        "task.args={min_ops: 2, max_ops: 3}",
        "search.max_new_tokens=24",
        "search.width=2",
    ]
    argv = ["search", "--method", "beam", *[x for kv in sets for x in ("--set", kv)], "--out", str(out)]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert (
        "search beam width=2 expansions=4 aggregation=min temperature=1.0 on 2 heldout problems of task "
        "'arithmetic', budget 90 tokens/problem"
    ) in text
    assert "accuracy " in text and "tokens/problem " in text
    saved = json.loads(out.read_text())
    tokens = [r["tokens"] for r in saved["problems"]]
    assert saved["summary"]["tokens_total"] == sum(tokens) and all(1 <= t <= 90 for t in tokens)
    assert saved["config"]["width"] == 2 and saved["config"]["max_new_tokens"] == 24
    assert 0.0 <= saved["summary"]["accuracy"] <= 1.0


def test_cli_reads_a_config_file_and_the_method_shortcut_wins(saved_models: Path, tmp_path: Path, capsys) -> None:
    config = tmp_path / "search.yaml"
    config.write_text(
        f"train: {{init: {saved_models / 'policy'}}}\ntask: {{args: {{min_ops: 2, max_ops: 3}}}}\n"
        "search: {method: beam, n: 3, selector: majority, problems: 2, budget: 60, max_new_tokens: 20}\n"
    )
    out = tmp_path / "bon.json"
    assert main(["search", str(config), "--method", "best_of_n", "--out", str(out)]) == 0
    assert "search best_of_n n=3 selector=majority temperature=1.0 on 2 heldout" in capsys.readouterr().out
    saved = json.loads(out.read_text())
    assert saved["config"]["method"] == "best_of_n" and saved["summary"]["problems"] == 2
    assert all(1 <= r["tokens"] <= 60 for r in saved["problems"])


def test_cli_majority_runs_on_a_task_without_steps(saved_models: Path, capsys) -> None:
    """Code has no steps, but greedy and majority vote need none: its answers are programs."""
    out = saved_models / "code.json"
    sets = [
        f"train.init={saved_models / 'policy'}",
        "task.name=code",
        "search.method=best_of_n",
        "search.selector=majority",
        "search.n=3",
        "search.problems=2",
        "search.budget=48",
        "search.max_new_tokens=16",
    ]
    assert main(["search", *[x for kv in sets for x in ("--set", kv)], "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "on 2 heldout problems of task 'code'" in text and "whole normalised completions" not in text
    saved = json.loads(out.read_text())
    assert all(1 <= r["tokens"] <= 48 for r in saved["problems"]) and 0.0 <= saved["summary"]["accuracy"] <= 1.0
