"""The math task: math-verify equivalences, timeouts in and out of the main thread, file loading
and its errors, the split, and two RL iterations on the bundled sample."""

import json
import math
import random
import string
import sys
import threading
import time
from pathlib import Path

import pytest

from creditrl.config import load_config
from creditrl.tasks import Task, make_task
from creditrl.tasks import math_verify as math_task
from creditrl.tasks.math import DEFAULT_TRAIN_FILE, MathTask, answers_match, gold_text, load_math_rows
from creditrl.train.rl import RLTrainer

HOSTILE = "\\boxed{9^{9^{9^{9}}}}"  # sympy would evaluate this tower for ever


@pytest.mark.parametrize(
    "gold, completion, expected",
    [
        ("\\frac{1}{2}", "0.5", True),
        ("\\frac{1}{2}", "1/2", True),
        ("0.5", "$\\frac{1}{2}$", True),
        ("0.5", "\\boxed{\\frac{1}{2}}", True),
        ("1/2", "so the answer is \\boxed{0.5}.", True),
        ("\\boxed{7}", "The answer is \\boxed{7}.", True),
        ("7", "7.0", True),
        ("3", "x = 3", True),
        ("2\\sqrt{2}", "$\\sqrt{8}$", True),
        ("x^2 + 2x + 1", "$(x+1)^2$", True),
        ("\\pi", "it is $\\pi$", True),
        ("-5", "\\boxed{-5}", True),
        ("7", "\\boxed{8}", False),
        ("\\frac{1}{2}", "0.49", False),
        ("7", "I first thought 7 but \\boxed{8}", False),  # the boxed answer is the final one
        ("-5", "\\boxed{5}", False),
        ("x^2 + 2x + 1", "$x^2 + 1$", False),
    ],
)
def test_math_verify_equivalences(gold, completion, expected):
    assert answers_match(gold, completion) is expected


def test_garbage_completions_are_false_without_raising():
    rng = random.Random(0)
    garbage = ["", "   ", "zz ))(( \\frac{", "\\boxed{", "}}}{{{", "$$$$", "\\frac{1}{0}", "#####", "\\boxed{\\boxed{"]
    garbage += ["".join(rng.choice(string.printable[:95]) for _ in range(rng.randint(1, 60))) for _ in range(20)]
    for text in garbage:
        assert answers_match("7", text) is False, text


def test_gold_answers_are_boxed_unless_delimited():
    assert gold_text("2\\sqrt{2}") == "\\boxed{2\\sqrt{2}}"
    assert gold_text("\\boxed{7}") == "\\boxed{7}" and gold_text("$x$") == "$x$"


def test_a_hostile_completion_times_out_to_false_in_the_main_thread():
    answers_match("7", "7")  # the helper process is up: its start is not part of the limit
    start = time.perf_counter()
    assert answers_match("7", HOSTILE, timeout_s=0.5) is False  # the alarm, or the kill at 0.5 + 2 s
    assert time.perf_counter() - start < 5
    assert answers_match("7", "\\boxed{7}", timeout_s=0.5) is True  # the timer is off again


def test_checks_work_from_a_worker_thread():
    # math-verify's own signal timeouts raise ValueError outside the main thread; the helper process does not
    results: dict[str, object] = {}

    def work() -> None:
        results["right"] = answers_match("\\frac{1}{2}", "0.5")
        results["wrong"] = answers_match("\\frac{1}{2}", "\\boxed{2}")
        start = time.perf_counter()
        results["hostile"] = answers_match("7", HOSTILE, timeout_s=0.5)
        results["hostile_s"] = time.perf_counter() - start

    thread = threading.Thread(target=work)
    thread.start()
    thread.join(timeout=60)
    assert results["right"] is True and results["wrong"] is False and results["hostile"] is False
    assert results["hostile_s"] < 5


def test_a_stuck_helper_is_killed_and_the_check_is_false(monkeypatch):
    monkeypatch.setattr(math_task, "_GRACE_S", 0.1)
    stuck = math_task._Helper(
        [sys.executable, "-c", 'print(\'{"result": "ready"}\', flush=True); import time; time.sleep(60)']
    )
    start = time.perf_counter()
    assert stuck.call("match", ("7", "7"), 0.2) is None
    assert time.perf_counter() - start < 5 and stuck._proc is None


# ----------------------------------------------------------------------------- the task


@pytest.fixture(scope="module")
def sample_task() -> MathTask:
    return make_task("math")


def test_bundled_sample_splits_by_question_hash(sample_task):
    assert isinstance(sample_task, Task) and sample_task.step_separator is None
    rows = load_math_rows(DEFAULT_TRAIN_FILE)
    assert len(rows) == 22
    train, heldout = sample_task.pools["train"], sample_task.pools["heldout"]
    assert len(train) + len(heldout) == 22 and len(heldout) >= 2
    assert {p.meta["question"] for p in train}.isdisjoint(p.meta["question"] for p in heldout)
    for p in heldout:
        assert sample_task.split_of(p.meta["question"]) == "heldout"


def test_every_bundled_solution_is_correct_and_fits_the_tiny_model(sample_task):
    for p in sample_task.pools["train"] + sample_task.pools["heldout"]:
        assert p.prompt == f"Q: {p.meta['question']} A: "
        assert sample_task.check_outcome(p, p.solution), (p.answer, p.solution)
        assert len(p.prompt) + len(p.solution) + 2 <= 160 and all(" " <= ch <= "~" for ch in p.prompt + p.solution)


def test_sampling_is_deterministic_with_replacement(sample_task):
    a = sample_task.sample(30, split="train", seed=3)
    assert a == sample_task.sample(30, split="train", seed=3) != sample_task.sample(30, split="train", seed=4)
    assert set(a) <= set(sample_task.pools["train"])
    with pytest.raises(ValueError, match="unknown split 'test'"):
        sample_task.sample(1, split="test", seed=0)


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_heldout_file_columns_template_and_parquet(tmp_path):
    train = write_jsonl(
        tmp_path / "train.jsonl",
        [{"problem": "One half?", "solution": "\\frac{1}{2}"}, {"problem": "Two?", "solution": 2}],
    )
    heldout = tmp_path / "heldout.parquet"
    from datasets import Dataset

    Dataset.from_list([{"problem": "Three?", "solution": "3"}]).to_parquet(str(heldout))
    task = make_task(
        "math",
        train_file=str(train),
        heldout_file=str(heldout),
        question_key="problem",
        answer_key="solution",
        prompt_template="Solve: {question} Put it in \\boxed{}.",
    )
    assert [p.answer for p in task.pools["train"]] == ["\\frac{1}{2}", "2"]  # a number cell is written out
    (held,) = task.pools["heldout"]
    assert held.prompt == "Solve: Three? Put it in \\boxed{}." and held.meta["file"] == str(heldout)
    assert task.check_outcome(held, "\\boxed{3}") and not task.check_outcome(held, "\\boxed{4}")


@pytest.mark.parametrize(
    "rows, message",
    [
        ([{"question": "a?"}], r"line 1: field 'answer' is missing \(fields: question\)"),
        (
            [{"question": "a?", "answer": "1"}, {"question": "b?", "answer": None}],
            "line 2: field 'answer' is missing or not text",
        ),
        ([{"question": "a?", "answer": "1"}, {"question": "b?", "answer": "  "}], "line 2: field 'answer' is empty"),
        ([{"question": "", "answer": "1"}], "line 1: field 'question' is empty"),
        (
            [{"question": "a?", "answer": "1"}, {"question": "b?", "answer": "\\foo{3}"}],
            "line 2: field 'answer' is not a usable gold answer: math-verify finds no mathematical value",
        ),
        (
            [{"question": "a?", "answer": "1/0"}],
            "line 1: field 'answer' is not a usable gold answer: '1/0' is not a number",
        ),
    ],
)
def test_malformed_rows_name_file_row_and_field(tmp_path, rows, message):
    path = write_jsonl(tmp_path / "bad.jsonl", rows)
    with pytest.raises(ValueError, match=f"bad.jsonl, {message}"):
        MathTask(train_file=str(path))


def test_bad_files_and_arguments(tmp_path):
    with pytest.raises(ValueError, match="nope.jsonl: no such file"):
        MathTask(train_file=str(tmp_path / "nope.jsonl"))
    (tmp_path / "p.csv").write_text("question,answer\n")
    with pytest.raises(
        ValueError, match=r"p.csv: unsupported file extension '.csv'; expected one of .jsonl, .json, .parquet"
    ):
        MathTask(train_file=str(tmp_path / "p.csv"))
    with pytest.raises(ValueError, match="prompt_template must contain '{question}'"):
        MathTask(prompt_template="Q:")
    with pytest.raises(ValueError, match="heldout_mod must be >= 2"):
        MathTask(heldout_mod=1)


def test_a_split_without_rows_is_one_config_error_line(tmp_path, capsys, monkeypatch):
    from creditrl.cli import main
    from creditrl.errors import ConfigError

    path = tmp_path / "one.jsonl"
    path.write_text(json.dumps({"question": "What is 1 + 1?", "answer": "2"}) + "\n")
    task = MathTask(train_file=str(path), heldout_mod=1000)
    assert [len(task.pools[s]) for s in ("train", "heldout")] == [1, 0]
    expected = (
        "task 'math': no 'heldout' problems among its 1 rows (about 1 in heldout_mod=1000 is held out, by a hash "
        "of the question); set heldout_file, or lower heldout_mod"
    )
    with pytest.raises(ConfigError) as err:
        task.sample(1, split="heldout", seed=0)
    assert str(err.value) == expected
    monkeypatch.chdir(tmp_path)
    argv = ["train", "--set", "task.name=math", "--set", f"task.args.train_file={path}"]
    assert main([*argv, "--set", "task.args.heldout_mod=1000", "--set", "train.init=policy", "--run-dir", "r"]) == 2
    err_text = capsys.readouterr().err
    assert "Traceback" not in err_text and err_text.splitlines()[-1] == f"creditrl: error: {expected}"


def test_steps_are_off_by_default_and_carry_the_outcome_when_cut(sample_task):
    problem = next(p for p in sample_task.pools["train"] if p.answer == "7")
    with pytest.raises(ValueError, match="task 'math' has no steps"):
        sample_task.check_steps(problem, ["x"])
    task = MathTask(step_separator=". ")
    # score-stage spans keep their separator; str.split pieces do not: both rebuild the completion
    assert task.check_steps(problem, ["x + 5 = 12. ", "So x = \\boxed{7}"]) == [True, True]
    assert task.check_steps(problem, ["x + 5 = 12", "So x = \\boxed{7}"]) == [True, True]
    assert task.check_steps(problem, ["x + 5 = 12. ", "So x = \\boxed{6}"]) == [False, False]


# ----------------------------------------------------------------------------- two RL iterations

TINY_RUN = [
    "train.init=policy",
    "rollout.prompts_per_iter=2",
    "rollout.group_size=2",
    "rollout.max_new_tokens=16",
    "train.iterations=2",
    "train.eval_every=2",
    "train.eval_size=4",
    "train.checkpoint_every=2",
    "train.progress=false",
]


def check_run(trainer: RLTrainer, history: list[dict], high: float) -> None:
    """Two iterations logged with finite rewards in [0, high] on every response, and evaluations."""
    assert [r["iteration"] for r in history] == [0, 1, 2]
    for row in history[1:]:
        assert row["reward/errors"] == 0 and row["reward/placed_per_response"] > 0
        assert 0.0 <= row["reward/mean"] <= high and finite(row)
    for row in (history[0], history[2]):
        assert 0.0 <= row["eval/accuracy"] <= 1.0 and 0.0 <= row["eval/step_accuracy"] <= 1.0


def test_two_rl_iterations_on_the_bundled_sample(tmp_path, scored_by):
    cfg = load_config(overrides=TINY_RUN + ["task.name=math", "reward.source=outcome"])
    trainer = RLTrainer.from_config(cfg, tmp_path / "run")
    assert all(p.meta["split"] == "heldout" for p in trainer.parts.heldout)
    check_run(trainer, trainer.run().history, high=1.0)
    problem = trainer.parts.heldout[0]
    scored = scored_by(trainer, [problem] * 3, [problem.solution, " \\boxed{12345}", " 1/0 ))("])
    assert scored.rewards.sum(-1).tolist() == [1.0, 0.0, 0.0] and scored.reward_mask.sum(-1).tolist() == [1, 1, 1]


@pytest.mark.parametrize(
    "completion, answer",
    [
        (" \\boxed{1/2}", "\\frac{1}{2}"),
        (" 0.5", "0.5"),
        ("so it is $\\frac{3}{4}$", "\\frac{3}{4}"),
        (" x = 3", "3"),
        (" no number here", None),
    ],
)
def test_extract_answer_writes_what_math_verify_reads(completion: str, answer: str | None) -> None:
    assert make_task("math").extract_answer(completion) == answer


def test_same_answer_is_math_verify_equivalence() -> None:
    task = make_task("math")
    half = [task.extract_answer(c) for c in (" \\boxed{1/2}", " 0.5", " 2/4", " $\\frac{1}{2}$")]
    assert all(task.same_answer(a, b) for a in half for b in half)
    assert not task.same_answer(half[0], task.extract_answer(" 0.49"))
    assert not task.same_answer("\\frac{1}{2}", "\\frac{1}{3}") and task.same_answer("7", "7")


def test_answer_hooks_agree_with_check_outcome_on_the_bundled_problems() -> None:
    """``check_outcome(p, c)`` is ``same_answer(p.answer, extract_answer(c))``: right answers in
    other spellings, wrong ones, and a completion without an answer."""
    task = make_task("math")
    problems = task.pools["train"] + task.pools["heldout"]
    assert len(problems) == 22
    for p in problems:
        for c in (p.solution, f" the answer is {p.answer}", f" \\boxed{{{p.answer}}} .", " \\boxed{12345}", " none"):
            a = task.extract_answer(c)
            assert task.check_outcome(p, c) == (a is not None and task.same_answer(p.answer, a)), (p.answer, c)


def finite(row: dict) -> bool:
    """Every number of a metrics row is finite (eval/correct is the packed per-problem outcomes)."""
    return all(math.isfinite(v) for k, v in row.items() if k != "eval/correct")


def test_a_conversational_prompt_of_one_user_turn_stays_a_conversation(tmp_path):
    """TRL's conversational format with a single user turn: reward functions get the turns, not
    text (a function indexing ``prompts[i][-1]["content"]`` works), and the prompt text is that turn."""
    path = tmp_path / "d.jsonl"
    rows = [
        {"prompt": [{"role": "user", "content": "What is 2+2?"}], "answer": "4"},
        {"prompt": "What is 3+3?", "answer": "6"},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    first, second = load_math_rows(str(path))
    assert first.messages == (("user", "What is 2+2?"),) and first.question == "What is 2+2?"
    assert second.messages == ()


def test_a_solution_column_is_the_warm_start_reference_as_it_is(tmp_path):
    """A user's ``solution`` column is what SFT trains on (no ``solution_key`` needed), and it
    still reaches reward functions among the row's columns; without one, the boxed answer."""
    path = tmp_path / "d.jsonl"
    rows = [
        {"question": "What is 2+2?", "answer": "4", "solution": " 2+2 = 4, so \\boxed{4}"},
        {"question": "What is 3+3?", "answer": "6"},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    first, second = load_math_rows(str(path))
    assert first.solution == " 2+2 = 4, so \\boxed{4}" and ("solution", first.solution) in first.columns
    assert second.solution is None
    task = make_task("math", train_file=str(path), heldout_file=str(path))
    solutions = {p.answer: p.solution for p in task.sample(16, split="train", seed=0)}
    assert solutions == {"4": " 2+2 = 4, so \\boxed{4}", "6": " \\boxed{6}"}
