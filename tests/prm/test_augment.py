"""Negative augmentation: corrupted steps are wrong, canonical, and labelled by the first-error rule."""

import random
import re

import pytest

from creditrl.prm.augment import augment_negatives, corrupt_step
from creditrl.prm.data import StepwiseExample
from creditrl.tasks import make_task

CANONICAL_INT = r"-?(?:0|[1-9][0-9]*)"
STEP_RE = re.compile(rf"({CANONICAL_INT})([+\-*])({CANONICAL_INT})=({CANONICAL_INT})(;?)")


def step_texts(solution: str) -> list[str]:
    """``"3*2=6;7+6=13;#13"`` -> ``["3*2=6;", "7+6=13;", "#13"]`` (separators kept)."""
    return re.findall(r"[^;]*;|[^;]+$", solution)


@pytest.fixture(scope="module")
def task_problems():
    task = make_task("arithmetic", max_ops=4, operand_max=30)
    return task, task.sample(150, split="train", seed=0)


def test_corrupted_steps_are_wrong_canonical_and_keep_their_shape(task_problems):
    task, problems = task_problems
    rng = random.Random(0)
    n_checked = 0
    for p in problems:
        steps = step_texts(p.solution)
        assert task.check_steps(p, steps) == [True] * len(steps)
        for k, step in enumerate(steps):
            bad = corrupt_step(step, rng)
            assert bad is not None and bad != step
            assert task.check_steps(p, steps[:k] + [bad]) == [True] * k + [False]
            if step.startswith("#"):
                assert re.fullmatch(rf"#{CANONICAL_INT}", bad) and bad != "#-0"
                continue
            m, good = STEP_RE.fullmatch(bad), STEP_RE.fullmatch(step)
            assert m is not None and m[4] != "-0"
            assert m.group(1, 2, 3, 5) == good.group(1, 2, 3, 5)  # operands, operator, ";" kept
            assert (int(m[4]) < 0) == (int(good[4]) < 0)  # a sign never gives a corruption away
            n_checked += 1
    assert n_checked > 300


def test_corruption_mostly_keeps_the_written_length(task_problems):
    _, problems = task_problems
    rng = random.Random(1)
    pairs = [(s, corrupt_step(s, rng)) for p in problems for s in step_texts(p.solution)]
    assert sum(len(a) == len(b) for a, b in pairs) / len(pairs) > 0.95


def test_corrupt_step_fixes_wrong_results_too_and_is_seeded():
    rng = random.Random(0)
    for _ in range(50):
        bad = corrupt_step("3+4=8;", rng)  # already wrong: the result must not become right (7)
        assert bad != "3+4=7;" and bad != "3+4=8;" and bad.endswith(";")
    assert corrupt_step("12-30=-18", random.Random(5)) == corrupt_step("12-30=-18", random.Random(5))
    assert corrupt_step("12-30=-18", random.Random(5)).count(";") == 0


@pytest.mark.parametrize("text", ["", "hello", "3+4", "3+4=7;;", "3/4=0;", "#", "# 5", "3+4=x;"])
def test_corrupt_step_refuses_what_it_does_not_know(text):
    assert corrupt_step(text, random.Random(0)) is None


def test_augment_negatives_follows_the_first_error_rule(task_problems):
    task, problems = task_problems
    examples = [
        StepwiseExample(p.prompt, step_texts(p.solution), [1.0] * len(step_texts(p.solution)), {"id": i})
        for i, p in enumerate(problems)
    ]
    out = augment_negatives(examples, rate=0.4, rng=random.Random(0))
    assert out[: len(examples)] == examples
    negatives = out[len(examples) :]
    assert len(negatives) == round(0.4 * len(examples))
    for neg in negatives:
        src = examples[neg.meta["source_index"]]
        k = neg.meta["corrupted_step"]
        assert neg.meta["augmented"] == "corrupt_step" and neg.meta["id"] == src.meta["id"]
        assert neg.prompt == src.prompt
        assert neg.completions[:k] == src.completions[:k] and len(neg.completions) == k + 1
        assert neg.labels == src.labels[:k] + [0.0]
        problem = task.make_problem(neg.prompt)
        assert task.check_steps(problem, neg.completions) == [True] * k + [False]
    assert len({n.meta["source_index"] for n in negatives}) == len(negatives)  # one copy per source
    assert len({n.meta["corrupted_step"] for n in negatives}) > 1  # not always the same step


def test_augment_negatives_eligibility_and_rate():
    examples = [
        StepwiseExample("1+2*3=", ["2*3=6;", "1+6=7;", "#7"], [0.0, 1.0, 1.0]),  # negative first: no
        StepwiseExample("1+2*3=", ["2*3=6;", "1+6=7;", "#7"], [None, None, None]),  # unlabelled: no
        StepwiseExample("1+2*3=", ["2*3=6;", "1+6=7;", "#7"], [None, 0.9, 0.0]),  # only step 1
        StepwiseExample("1+2*3=", ["oops;", "1+6=7;"], [1.0, 0.0]),  # step 0 cannot be corrupted
    ]
    assert augment_negatives(examples, rate=0.0, rng=random.Random(0)) == examples
    out = augment_negatives(examples, rate=1.0, rng=random.Random(0))
    assert len(out) == len(examples) + 1
    neg = out[-1]
    assert neg.meta["source_index"] == 2 and neg.meta["corrupted_step"] == 1
    assert neg.labels == [None, 0.0] and neg.completions[0] == "2*3=6;" and neg.completions[1] != "1+6=7;"
    with pytest.raises(ValueError, match="rate"):
        augment_negatives(examples, rate=1.5, rng=random.Random(0))
