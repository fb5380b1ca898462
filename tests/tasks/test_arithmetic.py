"""Tests for the task registry and the arithmetic task."""

from __future__ import annotations

import random
import re
from collections.abc import Iterator

import pytest

from creditrl.tasks import arithmetic
from creditrl.tasks.arithmetic import (
    ArithmeticConfig,
    ArithmeticTask,
    canonical_steps,
    evaluate_expression,
    split_completion,
)
from creditrl.tasks.base import TASKS, Problem, Task, make_task, register_task

TASK = ArithmeticTask()
P = TASK.make_problem("7+3*2-5=")  # steps 3*2=6; 7+6=13; 13-5=8; answer 8
P_NEG = TASK.make_problem("3-7+2=")  # steps 3-7=-4; -4+2=-2; answer -2
P_ZERO = TASK.make_problem("5-5=")  # steps 5-5=0; answer 0


@pytest.fixture
def restore_registry() -> Iterator[None]:
    saved = dict(TASKS)
    yield
    TASKS.clear()
    TASKS.update(saved)


@pytest.mark.parametrize(
    ("prompt", "solution", "answer"),
    [
        ("7+3*2-5=", "3*2=6;7+6=13;13-5=8;#8", "8"),
        ("2+3*4*2-1=", "3*4=12;12*2=24;2+24=26;26-1=25;#25", "25"),
        ("3-7+2=", "3-7=-4;-4+2=-2;#-2", "-2"),
        ("1-9*9=", "9*9=81;1-81=-80;#-80", "-80"),
        ("2*0-3-4=", "2*0=0;0-3=-3;-3-4=-7;#-7", "-7"),
        ("5-5=", "5-5=0;#0", "0"),
        ("9-8-7=", "9-8=1;1-7=-6;#-6", "-6"),
    ],
)
def test_solution_format(prompt: str, solution: str, answer: str) -> None:
    problem = TASK.make_problem(prompt)
    assert problem.prompt == prompt
    assert problem.solution == solution
    assert problem.answer == answer
    assert problem.meta["n_ops"] == prompt.count("+") + prompt.count("-") + prompt.count("*")


def test_helpers_accept_prompt_or_expression() -> None:
    steps = [(3, "*", 4, 12), (12, "*", 2, 24), (2, "+", 24, 26), (26, "-", 1, 25)]
    assert canonical_steps("2+3*4*2-1=") == steps
    assert canonical_steps("2+3*4*2-1") == canonical_steps("2+3*4*2-1=")
    assert evaluate_expression("3-7+2") == -2
    assert evaluate_expression("9") == 9 and canonical_steps("9=") == []
    assert TASK.make_problem("7+3*2-5") == P


@pytest.mark.parametrize("bad", ["", "=", "1+", "+1", "-1+2", "1 + 2", "1/2", "1+2==", "١+٢", "1++2"])
def test_evaluate_expression_rejects_malformed(bad: str) -> None:
    with pytest.raises(ValueError, match="not an arithmetic expression"):
        evaluate_expression(bad)


CONFIGS = [
    ArithmeticConfig(),
    ArithmeticConfig(min_ops=4, max_ops=6),
    ArithmeticConfig(operand_min=0, operand_max=20, operators="-"),
    ArithmeticConfig(max_ops=5, operand_max=5, operators="*"),
    ArithmeticConfig(min_ops=2, max_ops=4, operand_min=7, operand_max=7, operators="+*", heldout_mod=3),
]


@pytest.mark.parametrize("config", CONFIGS, ids=repr)
def test_random_problems_are_consistent(config: ArithmeticConfig) -> None:
    task = ArithmeticTask(config)
    for split, n in (("train", 400), ("heldout", 100)):
        for problem in task.sample(n, split=split, seed=7):
            expr = problem.prompt.removesuffix("=")
            assert problem.prompt == expr + "=" and " " not in expr
            operands = [int(x) for x in re.split(r"[+\-*]", expr)]
            n_ops = len(operands) - 1
            assert config.min_ops <= n_ops <= config.max_ops and problem.meta["n_ops"] == n_ops
            assert all(config.operand_min <= x <= config.operand_max for x in operands)
            assert set(re.sub(r"[0-9]", "", expr)) <= set(config.operators)
            assert evaluate_expression(expr) == eval(expr) == int(problem.answer)
            assert problem.meta["split"] == split == task.split_of(problem.prompt)
            assert task.check_outcome(problem, problem.solution)
            assert task.check_steps(problem, problem.solution.split(";")) == [True] * (n_ops + 1)
            assert task.label_completion(problem, problem.solution) == [True] * (n_ops + 1)


def test_sampling_is_deterministic_and_seeded() -> None:
    first = TASK.sample(50, split="train", seed=1)
    assert first == ArithmeticTask().sample(50, split="train", seed=1)
    assert [p.prompt for p in first] != [p.prompt for p in TASK.sample(50, split="train", seed=2)]
    # Pinned so that a process-dependent hash (e.g. Python's hash()) would be caught.
    assert [p.prompt for p in TASK.sample(3, split="heldout", seed=0)] == ["8+5=", "8-3+3*7=", "1+5*5="]


def test_splits_are_disjoint() -> None:
    train = {p.prompt for p in TASK.sample(2000, split="train", seed=0)}
    heldout = {p.prompt for p in TASK.sample(2000, split="heldout", seed=0)}
    # Many repeats of 1-operator prompts: an overlap would show up if it were possible.
    assert len(train) > 500 and len(heldout) > 500
    assert train.isdisjoint(heldout)


@pytest.mark.parametrize("mod", [10, 4])
def test_heldout_share_is_about_one_over_mod(mod: int) -> None:
    task = ArithmeticTask(heldout_mod=mod)
    rng = random.Random(123)
    n = 5000
    prompts = [
        "".join(f"{rng.randint(1, 9)}{rng.choice('+-*')}" for _ in range(5)) + f"{rng.randint(1, 9)}=" for _ in range(n)
    ]
    share = sum(task.split_of(p) == "heldout" for p in prompts) / n
    assert abs(share - 1 / mod) < 0.03  # about 5 standard deviations


def test_sample_argument_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="unknown split 'test'; valid splits: train, heldout"):
        TASK.sample(1, split="test", seed=0)
    with pytest.raises(ValueError, match="n must be >= 0"):
        TASK.sample(-1, split="train", seed=0)
    assert TASK.sample(0, split="train", seed=0) == []
    # The only expression of this config, "1+1=", is in train.
    tiny = ArithmeticTask(max_ops=1, operand_max=1, operators="+")
    assert [p.prompt for p in tiny.sample(2, split="train", seed=0)] == ["1+1=", "1+1="]
    monkeypatch.setattr(arithmetic, "_MAX_CONSECUTIVE_MISSES", 1000)
    with pytest.raises(ValueError, match="no 'heldout' problem in 1000 consecutive draws"):
        tiny.sample(1, split="heldout", seed=0)


@pytest.mark.parametrize(
    ("problem", "completion", "expected"),
    [
        *[(P, c, True) for c in ("3*2=6;7+6=13;13-5=8;#8", "#8", "  #  8\n", "junk;3*2=7;#8")],
        *[(P, c, False) for c in ("", "8", "3*2=6;7+6=13;13-5=8", "#", "##8", "#08", "#+8")],
        *[(P, c, False) for c in ("#8.0", "#8 8", "#8;3+3=6", "#8#8", "#9;#8", "#8;#9", "#-8")],
        (P, "#\uff18", False),  # fullwidth 8: int() would accept it
        (P, "#\u0668", False),  # Arabic-Indic 8
        (P, "#8\u200b", False),  # zero-width space is not whitespace
        *[(P_NEG, c, c == "#-2") for c in ("#-2", "#2", "#-02", "#- 2")],
        *[(P_ZERO, c, c == "#0") for c in ("#0", "#-0", "#00")],
    ],
)
def test_check_outcome(problem: Problem, completion: str, expected: bool) -> None:
    assert TASK.check_outcome(problem, completion) is expected


@pytest.mark.parametrize(
    ("completion", "segments"),
    [
        ("3*2=6;7+6=13;#13", ["3*2=6", "7+6=13", "#13"]),
        ("#8;3+3=6", ["#8;3+3=6"]),
        ("3*2=6;#8;#8", ["3*2=6", "#8;#8"]),
        ("3*2=6;", ["3*2=6"]),
        ("3*2=6#8", ["3*2=6", "#8"]),
        (";;;", ["", "", ""]),
        (";", [""]),
        ("abc", ["abc"]),
        ("", []),
    ],
)
def test_split_completion(completion: str, segments: list[str]) -> None:
    assert split_completion(completion) == segments


T, F = True, False


@pytest.mark.parametrize(
    ("problem", "segments", "labels"),
    [
        (P, ["3*2=6", "7+6=13", "13-5=8", "#8"], [T, T, T, T]),
        (P, ["3*2=6;", "7+6=13;", "13-5=8;", "#8"], [T, T, T, T]),
        (P, [" 3*2=6 ; ", "\t7+6=13;\n", "\xa013-5=8", " #8 "], [T, T, T, T]),
        (P, ["3*2=6;;", "7+6=13", "#8"], [F, F, T]),  # only one ";" is stripped
        (P, ["3 * 2 = 6", "7+6=13", "#8"], [F, F, T]),
        (P, ["3*2=6", "#8", "7+6=13", "13-5=8"], [T, T, F, F]),  # steps after the answer
        (P, ["3*2=6", "7+6=13", "13-5=8", "#8", "#8"], [T, T, T, T, F]),  # second answer
        (P, ["#9", "#8"], [F, F]),
        (P, ["", "3*2=6", "#8"], [F, F, T]),  # an empty segment is an error
        (P, ["3*2=6", "7+6=13", "13-5=8", "8"], [T, T, T, F]),  # answer without "#"
        (P, [], []),
    ],
)
def test_check_steps(problem: Problem, segments: list[str], labels: list[bool]) -> None:
    assert TASK.check_steps(problem, segments) == labels


P_SHORT = TASK.make_problem("7+3*2=")  # steps 3*2=6; 7+6=13; answer 13


@pytest.mark.parametrize(
    ("problem", "completion", "labels"),
    [
        (P, "3*2=6;7+6=13;13-5=8;#8", [T, T, T, T]),
        (P, "3*2=6;7+6=13;13-5=8", [T, T, T]),  # missing "#"
        (P, "3*2=6;7+6=13;13-5=8;", [T, T, T]),
        (P, "3*2=6;3*2=6;7+6=13;13-5=8;#8", [T, F, F, F, T]),  # repeated step
        (P, "3*2=6;7+6=13;13-5=8;8+0=8;#8", [T, T, T, F, T]),  # extra step after reduction
        (P, "3*2=6;7+6=13;13-5=8;13-5=8;#8", [T, T, T, F, T]),
        (P, "7+6=13;13-5=8;#8", [F, F, T]),  # skipped step
        (P_SHORT, "7+3=10;10*2=20;#20", [F, F, F]),  # right arithmetic, wrong order
        (P_SHORT, "7+3=10;3*2=6;7+6=13;#13", [F, F, F, T]),
        (P, "3*2=7;7+7=14;14-5=9;#9", [F, F, F, F]),  # wrong arithmetic
        (P, "3*2=6;7+6=14;14-5=9;#9", [T, F, F, F]),
        (P, "3*2=5;7+6=13;13-5=8;#8", [F, F, F, T]),  # correct-looking steps after an error
        (P, "3*2=6;#8;7+6=13;13-5=8", [T, F]),  # tail "#8;7+6=13;13-5=8" is one segment
        (P, "3*2=6;7+6=13;13-5=8;#8;#8", [T, T, T, F]),
        (P, "03*2=6;7+6=13;13-5=08;#08", [F, F, F, F]),  # leading zeros
        (P, "3*2=06;7+6=13;#8", [F, F, T]),
        (P, "3*2=+6;7+6=13;#8", [F, F, T]),
        (P, "\uff13*\uff12=\uff16;7+6=13;13-5=8;#8", [F, F, F, T]),  # fullwidth digits
        (P, "3\u00d72=6;7+6=13;#8", [F, F, T]),  # multiplication sign
        (P, "3*2=6\u200b;7+6=13;#8", [F, F, T]),
        (P, "\U0001f600;3*2=6;#8", [F, F, T]),
        (P, "hello world", [F]),
        (P, "abc;def;#x", [F, F, F]),
        (P, ";;;", [F, F, F]),
        (P, "", []),
        (P_NEG, "3-7=-4;-4+2=-2;#-2", [T, T, T]),
        (P_NEG, "3-7=-4;-4+2=-2;#-02", [T, T, F]),
        (P_NEG, "3-7=-4;- 4+2=-2;#-2", [T, F, T]),
        (P_NEG, "3-7=4;4+2=6;#6", [F, F, F]),
        (P_NEG, "-4+2=-2;#-2", [F, T]),
        (P_ZERO, "5-5=-0;#0", [F, T]),
    ],
)
def test_label_completion(problem: Problem, completion: str, labels: list[bool]) -> None:
    assert TASK.label_completion(problem, completion) == labels


P_BIG = TASK.make_problem("4*4+5*5+3=")  # 4*4=16; 5*5=25; 16+25=41; 41+3=44; answer 44


@pytest.mark.parametrize(
    ("problem", "completion", "kind"),
    [
        (P, "3*2=6;7+6=13;13-5=8;#8", "correct"),
        (P, "#8", "correct"),  # the outcome decides "correct", whatever the steps
        (P, "3*2=5;7+5=12;12-5=7;#7", "slip_single_digit"),
        (P, "3*2=6;7+6=12;12-5=7;#7", "slip_single_digit"),  # the operands decide: 7+6 ...
        (P, "3*2=6;7+6=13;13-5=9;#9", "slip_multi_digit"),  # ... 13-5 is not
        (P_BIG, "4*4=16;5*5=25;16+25=44;44+3=47;#47", "slip_multi_digit"),
        (P, "3*2=6;7+2=9;9-5=4;#4", "wrong_operands"),  # copied the wrong operand
        (P, "7+3=10;10*2=20;20-5=15;#15", "wrong_operands"),  # left to right, precedence ignored
        (P, "3*2=6;7+6=13;13-5=8;8-5=3;#3", "wrong_operands"),  # a step after the end
        (P, "3*2=6;7+6=13;13-=8;#8x", "malformed"),
        (P, "3*2=6;hello", "malformed"),
        (P, "", "wrong_answer"),
        (P, "3*2=6;7+6=13;13-5=8;#9", "wrong_answer"),
        (P, "3*2=6;7+6=13;13-5=8", "wrong_answer"),  # no answer
        (P, "3*2=6;#6", "wrong_answer"),  # an early answer
        (P_NEG, "3-7=-4;-4+2=-3;#-3", "slip_single_digit"),
    ],
)
def test_first_error_classifies_the_first_wrong_step(problem: Problem, completion: str, kind: str) -> None:
    assert TASK.first_error(problem, completion) == kind
    assert kind in TASK.error_kinds


def test_first_error_agrees_with_the_step_checker_under_corruption() -> None:
    """A slip or wrong-operand verdict points at the step the checker labels first wrong."""
    rng = random.Random(1)
    for problem in TASK.sample(300, split="train", seed=5):
        chars = list(problem.solution)
        chars[rng.randrange(len(chars))] = rng.choice("0123456789+-*=;#")
        completion = "".join(chars)
        kind = TASK.first_error(problem, completion)
        labels = TASK.label_completion(problem, completion)
        if kind == "correct":
            assert TASK.check_outcome(problem, completion)
        elif kind == "wrong_answer":
            steps = split_completion(completion)
            assert all(lab for seg, lab in zip(steps, labels) if not seg.startswith("#"))
        else:
            assert not all(labels)


def test_very_long_completions() -> None:
    labels = TASK.label_completion(P, "3*2=6;" * 10_000 + "#8")
    assert labels == [T] + [F] * 9_999 + [T]
    # Longer than int()'s default 4300-digit limit: must be rejected, not raise.
    assert not TASK.check_outcome(P, "#" + "8" * 100_000)
    assert TASK.check_outcome(P, "x" * 100_000 + "#8")  # text before "#" does not matter
    assert TASK.label_completion(P, "1" * 5000 + "*2=6;#8") == [F, T]


def test_last_label_agrees_with_outcome_under_corruption() -> None:
    rng = random.Random(0)
    alphabet = "0123456789+-*=;# "
    for problem in TASK.sample(300, split="train", seed=3):
        chars = list(problem.solution)
        for _ in range(rng.randint(1, 3)):
            chars[rng.randrange(len(chars))] = rng.choice(alphabet)
        completion = "".join(chars)
        labels = TASK.label_completion(problem, completion)
        if "#" in completion:
            assert labels[-1] is TASK.check_outcome(problem, completion)
        # "Stop at the first error": correct steps form a prefix of the step labels.
        steps = labels[:-1] if "#" in completion else labels
        assert steps == sorted(steps, reverse=True)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"min_ops": 0}, "min_ops must be >= 1, got 0"),
        ({"min_ops": 3, "max_ops": 2}, r"max_ops must be >= min_ops \(3\), got 2"),
        ({"operand_min": -1}, "operand_min must be >= 0, got -1"),
        ({"operand_min": 5, "operand_max": 4}, r"operand_max must be >= operand_min \(5\), got 4"),
        ({"operators": ""}, "operators must be a non-empty string of distinct characters"),
        ({"operators": "++"}, "operators must be"),
        ({"operators": "+/"}, "operators must be"),
        ({"heldout_mod": 1}, "heldout_mod must be >= 2, got 1"),
    ],
)
def test_config_validation_names_the_field(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=f"^{message}"):
        ArithmeticConfig(**kwargs)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=f"^{message}"):
        make_task("arithmetic", **kwargs)


def test_make_task_builds_configured_arithmetic() -> None:
    task = make_task("arithmetic", min_ops=4, max_ops=6)
    assert isinstance(task, ArithmeticTask) and isinstance(task, Task)
    assert task.config == ArithmeticConfig(min_ops=4, max_ops=6)
    assert (task.name, task.step_separator) == ("arithmetic", ";")
    assert ArithmeticTask(ArithmeticConfig(operand_max=5), max_ops=2).config == ArithmeticConfig(
        max_ops=2, operand_max=5
    )


def test_make_task_unknown_name_lists_valid_names(restore_registry: None) -> None:
    register_task("zz_dummy")(ArithmeticTask)
    register_task("aa_dummy")(ArithmeticTask)
    valid = "aa_dummy, arithmetic, chain, code, math, paths, toy_summarise, toy_translate, zz_dummy"
    with pytest.raises(ValueError, match=f"unknown task 'nope'; valid tasks: {valid}$"):
        make_task("nope")


def test_register_task_rejects_duplicates(restore_registry: None) -> None:
    class Other(ArithmeticTask):
        pass

    assert register_task("other")(Other) is Other
    assert isinstance(make_task("other", max_ops=2), Other)
    with pytest.raises(ValueError, match="task 'arithmetic' is already registered"):
        register_task("arithmetic")(Other)
    assert TASKS["arithmetic"] is ArithmeticTask


def test_problem_is_hashable_without_meta() -> None:
    same = Problem(prompt=P.prompt, answer=P.answer, solution=P.solution, meta={"other": 1})
    assert hash(same) == hash(P) and same != P
    assert len({P, TASK.make_problem("7+3*2-5=")}) == 1


def test_answer_hooks_read_what_check_outcome_reads() -> None:
    task = ArithmeticTask()
    problem = task.make_problem("7+3*2-5=")
    for completion, answer in [
        ("3*2=6;7+6=13;13-5=8;#8", "8"),
        ("#8 ", "8"),
        ("#8;3+3=6", "8;3+3=6"),
        ("1+1=2;", None),
        ("#-4#8", "-4#8"),
        ("", None),
    ]:
        assert task.extract_answer(completion) == answer
        stated = answer is not None and task.same_answer(problem.answer, answer)
        assert task.check_outcome(problem, completion) == stated
