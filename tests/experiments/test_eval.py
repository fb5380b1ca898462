"""`creditrl eval`: checkpoints on a larger held-out set, paired differences against a baseline."""

import json
import math

import pytest

from creditrl.cli import main
from creditrl.config import ConfigError
from creditrl.experiments.evaluate import evaluate_checkpoints, markdown_table, paired_difference, resolve_checkpoint
from creditrl.policy.model import build_tiny

TASK = [
    "task.args={min_ops: 1, max_ops: 2, operand_min: 1, operand_max: 5, operators: '+'}",
    "rollout.max_new_tokens=8",
]


def test_paired_difference_by_hand():
    base = [True, True, False, False, True]
    other = [True, False, True, True, True]
    diff, se, gained, lost = paired_difference(base, other)
    # d = [0, -1, 1, 1, 0]: mean 0.2, sample variance (0.04 + 1.44 + 0.64 + 0.64 + 0.04) / 4 = 0.7
    assert (diff, gained, lost) == (pytest.approx(0.2), 2, 1)
    assert se == pytest.approx(math.sqrt(0.7 / 5))
    assert paired_difference([True], [True]) == (0.0, 0.0, 0, 0)
    with pytest.raises(ValueError, match="equal, non-zero lengths"):
        paired_difference([True], [True, False])


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpt")
    paths = []
    for seed in (0, 1):
        model, tok = build_tiny(seed)
        path = root / f"m{seed}"
        model.save_pretrained(path)
        tok.save_pretrained(path)
        paths.append(path)
    run = root / "run" / "checkpoints"  # a run directory: its latest checkpoint
    (run / "iter_000002").mkdir(parents=True)
    build_tiny(1)[0].save_pretrained(run / "iter_000002")
    build_tiny(1)[1].save_pretrained(run / "iter_000002")
    (run / "latest").write_text("iter_000002")
    return paths, root / "run"


def test_resolve_checkpoint(checkpoints, tmp_path):
    (m0, _), run = checkpoints
    assert resolve_checkpoint(str(m0)) == m0
    assert resolve_checkpoint(str(run)) == run / "checkpoints" / "iter_000002"
    with pytest.raises(FileNotFoundError, match="neither a model directory"):
        resolve_checkpoint(str(tmp_path))


def test_evaluate_checkpoints_pairs_against_the_first(checkpoints):
    from creditrl.tasks import make_task
    from creditrl.train.build import EVAL_SEED
    from creditrl.train.evaluate import evaluate

    (m0, m1), run = checkpoints
    rows = evaluate_checkpoints(None, [str(m0), str(m1), str(run)], size=24, overrides=TASK, log=lambda _: None)
    assert [r.n for r in rows] == [24, 24, 24]
    assert rows[0].diff is None
    # the run directory holds the same weights as m1: identical outcomes, so the same difference
    assert (rows[2].accuracy, rows[2].diff, rows[2].gained, rows[2].lost) == (
        rows[1].accuracy,
        rows[1].diff,
        rows[1].gained,
        rows[1].lost,
    )
    assert rows[1].diff == pytest.approx(rows[1].accuracy - rows[0].accuracy)
    assert rows[1].gained - rows[1].lost == round(24 * rows[1].diff)
    # the same problems and numbers as evaluating directly on the run's held-out stream
    task = make_task("arithmetic", min_ops=1, max_ops=2, operand_min=1, operand_max=5, operators="+")
    model, tok = build_tiny(0)
    direct = evaluate(model, tok, task, task.sample(24, split="heldout", seed=EVAL_SEED), max_new_tokens=8)
    assert rows[0].accuracy == direct.accuracy and rows[0].step_accuracy == direct.step_accuracy
    assert rows[0].accuracy_se == pytest.approx(math.sqrt(direct.accuracy * (1 - direct.accuracy) / 24))
    table = markdown_table(rows)
    assert "| checkpoint | exact match |" in table and f"{100 * rows[1].diff:+.1f}" in table


def test_the_train_split_evaluates_the_prompts_rl_draws(checkpoints, capsys):
    from creditrl.tasks import make_task
    from creditrl.train.build import EVAL_SEED
    from creditrl.train.evaluate import evaluate

    (m0, _), _ = checkpoints
    (row,) = evaluate_checkpoints(None, [str(m0)], size=24, overrides=TASK, split="train", log=lambda _: None)
    task = make_task("arithmetic", min_ops=1, max_ops=2, operand_min=1, operand_max=5, operators="+")
    problems = task.sample(24, split="train", seed=EVAL_SEED)
    assert all(task.split_of(p.prompt) == "train" for p in problems)
    direct = evaluate(*build_tiny(0), task, problems, max_new_tokens=8)
    assert (row.split, row.n, row.accuracy, row.step_accuracy) == ("train", 24, direct.accuracy, direct.step_accuracy)
    assert markdown_table([row]).startswith("Greedy train-split exact match on 24 problems")
    with pytest.raises(ConfigError, match="--split: must be heldout or train, got 'test'"):
        evaluate_checkpoints(None, [str(m0)], size=4, overrides=TASK, split="test", log=lambda _: None)


def test_eval_cli_writes_json_and_rejects_bad_input(checkpoints, tmp_path, capsys):
    (m0, m1), _ = checkpoints
    out = tmp_path / "eval.json"
    argv = ["eval", str(m1), "--baseline", str(m0), "--size", "8", "--out", str(out)]
    for item in TASK:
        argv += ["--set", item]
    assert main(argv) == 0
    rows = json.loads(out.read_text())
    assert [r["checkpoint"] for r in rows] == [str(m0), str(m1)] and rows[1]["n"] == 8
    assert "Greedy held-out exact match on 8 problems" in capsys.readouterr().out
    assert main(["eval", str(tmp_path), "--size", "8"]) == 2
    assert "neither a model directory" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="--size: must be > 0, got 0"):
        evaluate_checkpoints(None, [str(m0)], size=0)


def test_errors_count_each_problem_once_by_its_first_error(checkpoints, capsys):
    from creditrl.tasks import make_task
    from creditrl.train.build import EVAL_SEED
    from creditrl.train.evaluate import evaluate

    (m0, m1), _ = checkpoints
    rows = evaluate_checkpoints(None, [str(m0), str(m1)], size=24, overrides=TASK, errors=True, log=lambda _: None)
    task = make_task("arithmetic", min_ops=1, max_ops=2, operand_min=1, operand_max=5, operators="+")
    problems = task.sample(24, split="heldout", seed=EVAL_SEED)
    for seed, row in zip((0, 1), rows):
        assert list(row.errors) == list(task.error_kinds) and sum(row.errors.values()) == 24
        assert row.errors["correct"] == round(24 * row.accuracy)
        model, tok = build_tiny(seed)
        direct = evaluate(model, tok, task, problems, max_new_tokens=8).completions
        kinds = [task.first_error(p, c) for p, c in zip(problems, direct)]
        assert row.errors == {k: kinds.count(k) for k in task.error_kinds}
    argv = ["eval", str(m0), "--size", "8", "--errors"]
    for item in TASK:
        argv += ["--set", item]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "Where greedy solutions first go wrong (share of the 8 problems)" in out and "| wrong operands |" in out
    with pytest.raises(ConfigError, match="--errors: task 'toy_translate' has no first_error classifier"):
        evaluate_checkpoints(
            None, [str(m0)], size=4, overrides=["task.name=toy_translate", "task.args={}"], errors=True
        )


def test_errors_reject_a_kind_the_task_does_not_list(checkpoints, monkeypatch):
    from creditrl.tasks.arithmetic import ArithmeticTask

    (m0, _), _ = checkpoints
    monkeypatch.setattr(ArithmeticTask, "first_error", lambda self, problem, completion: "gremlins")
    with pytest.raises(ConfigError, match=r"first_error returned \['gremlins'\], not among its error_kinds"):
        evaluate_checkpoints(None, [str(m0)], size=4, overrides=TASK, errors=True, log=lambda _: None)
